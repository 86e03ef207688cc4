"""The GKE workloads' cloud identity: launch/gke_setup.sh (the TPU node pools'
service account, which xpk's pods act as, its grants, the image repository)
and launch/xpk.sh --check (what the workload will do, done as that account):
their dry runs' exact commands, and both at work against a stand-in `gcloud`
that answers as the real one does, refusals included. That the pods act as
their node pool's account (they run on the host's network) is pinned to xpk's
own manifest in tests/launch/test_xpk.py."""

import os
import subprocess

import pytest

from tests.launch.test_scripts import ROOT, _clean_env, _gcloud_stub, dry_run

PROJECT = ["--project=my-project", "--zone=us-west4-a"]
SETUP = [*PROJECT, "--cluster=bert", "--bucket=gs://my-bucket/runs"]
NODES = "123-compute@developer.gserviceaccount.com"  # the Compute Engine default account
IMAGE = "us-west4-docker.pkg.dev/my-project/bertjax/bertjax:v1"
SUBMIT = [*PROJECT, "--cluster=bert", "--tpu-type=v5litepod-16", f"--image={IMAGE}",
          "--config=configs/base_pretrain.py", "--workdir=gs://my-bucket/runs/base",
          "--workload=bert-base"]
OWN = "bert-nodes@my-project.iam.gserviceaccount.com"  # an account of the nodes' own
AS = f"--impersonate-service-account={OWN}"
OBJECT = "gs://my-bucket/runs/base/.bertjax-check-bert-base"
REPOSITORY = ["--location=us-west4", "--project=my-project"]
LIST = ["gcloud", "container", "node-pools", "list", "--cluster=bert", "--location=us-west4",
        "--project=my-project", "--filter=config.machineType~^(ct|tpu)",
        '--format=value[separator="|"](name,config.serviceAccount,config.oauthScopes)']
# The scopes xpk cluster create gives TPU node pools (storage-full, gke-default,
# cloud-platform), as gcloud lists them.
SCOPES = ";".join(f"https://www.googleapis.com/auth/{scope}" for scope in [
    "cloud-platform", "devstorage.full_control", "logging.write", "monitoring",
    "service.management.readonly", "servicecontrol", "trace.append"])
# The node pools as gcloud lists them for xpk's cluster of two v5e slices: no
# account of their own ("default").
POOLS = f"echo 'bert-np-0|default|{SCOPES}'; echo 'bert-np-1|default|{SCOPES}'"
# The same, made with --custom-nodepool-arguments=--service-account=OWN.
OWN_POOLS = POOLS.replace("|default|", f"|{OWN}|")


def test_setup_dry_run_prints_every_command():
  assert dry_run("gke_setup.sh", *SETUP, "--impersonator=user:me@example.com") == [
      ["gcloud", "services", "enable", "artifactregistry.googleapis.com",
       "container.googleapis.com", "iam.googleapis.com", "iamcredentials.googleapis.com",
       "storage.googleapis.com", "tpu.googleapis.com", "--project=my-project"],
      ["gcloud", "artifacts", "repositories", "create", "bertjax", "--repository-format=docker",
       "--location=us-west4", "--description=bertjax images", "--project=my-project"],
      LIST,
      ["gcloud", "storage", "buckets", "add-iam-policy-binding", "gs://my-bucket",
       "--member=serviceAccount:NODE_SERVICE_ACCOUNT", "--role=roles/storage.objectAdmin"],
      ["gcloud", "artifacts", "repositories", "add-iam-policy-binding", "bertjax", *REPOSITORY,
       "--member=serviceAccount:NODE_SERVICE_ACCOUNT", "--role=roles/artifactregistry.reader"],
      ["gcloud", "iam", "service-accounts", "add-iam-policy-binding", "NODE_SERVICE_ACCOUNT",
       "--project=my-project", "--role=roles/iam.serviceAccountTokenCreator",
       "--member=user:me@example.com"],
      ["gcloud", "auth", "configure-docker", "us-west4-docker.pkg.dev", "--quiet"]]


def test_setup_dry_run_for_a_named_node_account_and_nobody_to_check():
  """An account given by its e-mail is used as it is (no pools read); with
  --impersonator=none nobody is let act as it."""
  account = "bert-nodes@my-project.iam.gserviceaccount.com"
  commands = dry_run("gke_setup.sh", *SETUP, "--impersonator=none", "--region=us",
                     "--repository=images", f"--node-service-account={account}")
  assert LIST not in commands
  assert not [c for c in commands if "--role=roles/iam.serviceAccountTokenCreator" in c]
  assert ["gcloud", "storage", "buckets", "add-iam-policy-binding", "gs://my-bucket",
          f"--member=serviceAccount:{account}", "--role=roles/storage.objectAdmin"] in commands
  assert ["gcloud", "artifacts", "repositories", "add-iam-policy-binding", "images",
          "--location=us", "--project=my-project", f"--member=serviceAccount:{account}",
          "--role=roles/artifactregistry.reader"] in commands
  assert commands[-1] == ["gcloud", "auth", "configure-docker", "us-docker.pkg.dev", "--quiet"]
  assert not [c for c in commands if c[0] == "kubectl" or "workloadIdentityUser" in " ".join(c)]


def _setup(tmp_path, body, *args):
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "gke_setup.sh"), *SETUP, *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env=_gcloud_stub(tmp_path, body))
  calls = (tmp_path / "calls.txt").read_text().splitlines()
  return result, ["gcloud " + line.split(" --")[0] for line in calls]


# gcloud as a project where the repository exists and the cluster's TPU pools
# are those of xpk cluster create.
_PROJECT = """case "$*" in
  "container node-pools list"*) %s ;;
  "projects describe"*) echo 123 ;;
  "config get-value account") echo me@example.com ;;
esac"""


_ENABLE = ("gcloud services enable artifactregistry.googleapis.com container.googleapis.com "
           "iam.googleapis.com iamcredentials.googleapis.com storage.googleapis.com "
           "tpu.googleapis.com")
_LEFT_OUT = (f"gke_setup.sh: not letting you act as {NODES}, the Compute Engine default service "
             "account (it usually holds roles/editor on the project), so xpk.sh --check checks "
             "it without acting as it; better, give the TPU nodes an account of their own (xpk "
             "cluster create --custom-nodepool-arguments=--service-account=EMAIL, docs/tpu.md), "
             "or grant it anyway with --impersonator=user:YOU")


def test_setup_grants_the_node_pools_account_what_the_pods_do(tmp_path):
  """The pools run as an account of their own: it gets the bucket, the
  repository, and the user may act as it."""
  result, calls = _setup(tmp_path, _PROJECT % OWN_POOLS)
  assert result.returncode == 0, result.stderr
  assert calls == [
      _ENABLE,
      "gcloud artifacts repositories describe bertjax",
      "gcloud container node-pools list",
      "gcloud config get-value account",
      "gcloud storage buckets add-iam-policy-binding gs://my-bucket",
      "gcloud artifacts repositories add-iam-policy-binding bertjax",
      f"gcloud iam service-accounts add-iam-policy-binding {OWN}",
      "gcloud auth configure-docker us-west4-docker.pkg.dev"]
  log = (tmp_path / "calls.txt").read_text()
  assert log.count(f"--member=serviceAccount:{OWN}") == 2
  assert ("--role=roles/iam.serviceAccountTokenCreator --member=user:me@example.com") in log
  assert result.stderr == ""
  assert result.stdout.strip() == (
      f"gke_setup.sh: the TPU pods of bert act as their node pools' service account, {OWN}, "
      "which writes in gs://my-bucket and reads us-west4-docker.pkg.dev/my-project/bertjax; "
      "check a run with launch/xpk.sh ... --check")


def test_setup_lets_nobody_act_as_the_compute_engine_default_account(tmp_path):
  """The pools run as the Compute Engine default account (read once for both
  pools), which usually holds roles/editor: it gets the bucket and the
  repository, but nobody is let act as it (an Editor's token), and one line
  says so and how to do better."""
  result, calls = _setup(tmp_path, _PROJECT % POOLS)
  assert result.returncode == 0, result.stderr
  assert calls == [
      _ENABLE,
      "gcloud artifacts repositories describe bertjax",
      "gcloud container node-pools list",
      "gcloud projects describe my-project",
      "gcloud storage buckets add-iam-policy-binding gs://my-bucket",
      "gcloud artifacts repositories add-iam-policy-binding bertjax",
      "gcloud auth configure-docker us-west4-docker.pkg.dev"]
  assert (tmp_path / "calls.txt").read_text().count(f"--member=serviceAccount:{NODES}") == 2
  assert result.stderr.splitlines() == [_LEFT_OUT]


def test_setup_lets_an_impersonator_given_act_as_the_default_account(tmp_path):
  result, calls = _setup(tmp_path, _PROJECT % POOLS, "--impersonator=user:me@example.com")
  assert result.returncode == 0, result.stderr
  assert f"gcloud iam service-accounts add-iam-policy-binding {NODES}" in calls
  assert ("--role=roles/iam.serviceAccountTokenCreator --member=user:me@example.com") in (
      tmp_path / "calls.txt").read_text()
  assert result.stderr == ""


def test_setup_grants_each_account_of_the_tpu_pools(tmp_path):
  """Pools made with an account of their own (xpk cluster create
  --custom-nodepool-arguments=--service-account=...) keep it; each account is
  granted once, and the user may act as the pools' own account only."""
  own = "bert-nodes@my-project.iam.gserviceaccount.com"
  pools = f"echo 'bert-np-0|{own}|{SCOPES}'; echo 'bert-np-1|{own}|{SCOPES}'; " + (
      f"echo 'bert-np-2|default|{SCOPES}'")
  result, calls = _setup(tmp_path, _PROJECT % pools)
  assert result.returncode == 0, result.stderr
  log = (tmp_path / "calls.txt").read_text()
  for account in (own, NODES):
    assert log.count(f"buckets add-iam-policy-binding gs://my-bucket --member=serviceAccount:"
                     f"{account} --role=roles/storage.objectAdmin") == 1
  assert [c for c in calls if c.startswith("gcloud iam")] == [
      f"gcloud iam service-accounts add-iam-policy-binding {own}"]
  assert result.stderr.splitlines() == [_LEFT_OUT]
  assert f"act as their node pools' service account, {own} {NODES}," in result.stdout
  (tmp_path / "calls.txt").unlink()
  result, calls = _setup(tmp_path, _PROJECT % pools, "--impersonator=none")
  assert result.returncode == 0, result.stderr
  assert "serviceAccountTokenCreator" not in (tmp_path / "calls.txt").read_text()
  assert result.stderr == ""


@pytest.mark.parametrize("pools,line", [
    ("true", "gke_setup.sh: cluster bert has no TPU node pools in us-west4 (xpk cluster create "
             "makes them); give the pods' service account with --node-service-account"),
    ('echo "ERROR: (gcloud.container.node-pools.list) ResponseError: code=404, message=Not '
     'found: projects/my-project/locations/us-west4/clusters/bert." >&2; exit 1',
     "gke_setup.sh: listing the node pools of cluster bert in us-west4 failed: ERROR: "
     "(gcloud.container.node-pools.list) ResponseError: code=404, message=Not found: "
     "projects/my-project/locations/us-west4/clusters/bert."),
])
def test_setup_without_tpu_node_pools_grants_nothing(tmp_path, pools, line):
  result, calls = _setup(tmp_path, _PROJECT % pools)
  assert result.returncode == 1
  assert result.stderr.splitlines() == [line]
  assert not [call for call in calls if "add-iam-policy-binding" in call]


def test_check_dry_run_prints_what_it_would_do_as_the_node_pools_account():
  """--check reads the TPU node pools (their account and scopes), then, as that
  account, writes and deletes an object in the workdir and reads the image."""
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--dry-run",
                           "--check", *SUBMIT], capture_output=True, text=True, timeout=60,
                          env=_clean_env())
  assert result.returncode == 0, result.stderr
  placeholder = "--impersonate-service-account=NODE_SERVICE_ACCOUNT"
  assert result.stdout.splitlines() == [
      "gcloud container node-pools list --cluster=bert --location=us-west4 "
      r"--project=my-project --filter=config.machineType~\^\(ct\|tpu\) "
      r"--format=value\[separator=\"\|\"\]\(name\,config.serviceAccount\,config.oauthScopes\)",
      f"echo bertjax-check | gcloud storage cp - {OBJECT} {placeholder}",
      f"gcloud storage rm {OBJECT} {placeholder}",
      f"gcloud artifacts docker images describe {IMAGE} {placeholder}"]


# gcloud as the node pools' account sees things: xpk's pools, and the account
# may write, delete and read. Each test takes one of these away.
_POLICY = (f"echo 'roles/storage.legacyBucketOwner projectOwner:my-project'; "
           f"echo 'roles/storage.objectAdmin serviceAccount:{NODES}'")
_GRANTED = {
    "pools": OWN_POOLS,
    "number": "echo 123",
    "policy": _POLICY,
    "cp": 'cat > "$TMPDIR/uploaded"',
    "rm": "true",
    "image": "echo image_summary",
}
_PATTERNS = {"pools": "container node-pools list", "number": "projects describe",
             "policy": "storage buckets get-iam-policy",
             "cp": "storage cp", "rm": "storage rm", "image": "artifacts docker images describe"}


def _check(tmp_path, *args, **refused):
  body = "case \"$*\" in\n" + "".join(
      f'  "{_PATTERNS[k]}"*) {refused.get(k, v)} ;;\n' for k, v in _GRANTED.items()) + "esac"
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--check", *SUBMIT,
                           *args], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env=_gcloud_stub(tmp_path, body))
  calls = (tmp_path / "calls.txt").read_text().splitlines()
  return result, [next(k for k, v in _PATTERNS.items() if line.startswith(v)) for line in calls]


def test_check_passes_when_the_node_pools_account_has_what_the_workload_needs(tmp_path):
  result, calls = _check(tmp_path)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == (
      f"xpk.sh: --check: the pods act as {OWN} (the service account of their TPU node pools: "
      "xpk runs them on the host's network), which writes and deletes in "
      f"gs://my-bucket/runs/base and reads {IMAGE}")
  assert (tmp_path / "uploaded").read_text() == "bertjax-check\n"
  assert calls == ["pools", "cp", "rm", "image"]
  log = (tmp_path / "calls.txt").read_text().splitlines()
  assert log[0].startswith("container node-pools list --cluster=bert --location=us-west4 ")
  assert all(line.endswith(AS) for line in log[1:])


_NOT_ACTING = (f"xpk.sh: --check: not acting as {NODES}, the Compute Engine default service "
               "account (launch/gke_setup.sh lets nobody by default): reading its role in "
               "gs://my-bucket's IAM policy and the image as you instead (docs/tpu.md: give "
               "the TPU nodes an account of their own)")


def test_check_reads_the_bucket_policy_for_the_compute_engine_default_account(tmp_path):
  """Nobody may act as the Compute Engine default account (gke_setup.sh grants
  no token creator on it): --check says so in one line, reads the pools'
  scopes, the account's role in the bucket's IAM policy and the image as the
  user, and acts as nobody."""
  result, calls = _check(tmp_path, pools=POOLS)
  assert result.returncode == 0, result.stderr
  assert result.stderr.splitlines() == [_NOT_ACTING]
  assert result.stdout.strip() == (
      f"xpk.sh: --check: the pods act as {NODES} (the service account of their TPU node pools: "
      "xpk runs them on the host's network), which holds a role that writes in gs://my-bucket "
      f"by its IAM policy; {IMAGE} exists")
  assert calls == ["pools", "number", "policy", "image"]
  log = (tmp_path / "calls.txt").read_text()
  assert "impersonate" not in log
  assert ("storage buckets get-iam-policy gs://my-bucket --project=my-project "
          "--flatten=bindings[].members") in log


@pytest.mark.parametrize("refused,line", [
    ({"policy": "echo 'roles/storage.objectViewer serviceAccount:%s'" % NODES},
     f"xpk.sh: --check: {NODES} has no roles/storage.objectAdmin in the IAM policy of "
     "gs://my-bucket (launch/gke_setup.sh grants it)"),
    ({"policy": 'echo "ERROR: (gcloud.storage.buckets.get-iam-policy) HTTPError 403: me does '
                'not have storage.buckets.getIamPolicy access" >&2; exit 1'},
     "xpk.sh: --check: reading the IAM policy of gs://my-bucket failed: ERROR: (gcloud.storage."
     "buckets.get-iam-policy) HTTPError 403: me does not have storage.buckets.getIamPolicy "
     "access"),
    ({"image": 'echo "ERROR: (gcloud.artifacts.docker.images.describe) NOT_FOUND: Requested '
               'entity was not found." >&2; exit 1'},
     f"xpk.sh: --check: you cannot read {IMAGE}: ERROR: (gcloud.artifacts.docker.images."
     "describe) NOT_FOUND: Requested entity was not found.; push it"),
])
def test_check_without_acting_says_what_is_missing_in_one_line(tmp_path, refused, line):
  result, _ = _check(tmp_path, pools=POOLS, **refused)
  assert result.returncode == 1
  assert result.stderr.splitlines() == [_NOT_ACTING, line]


def test_check_acts_as_the_account_it_is_given(tmp_path):
  account = "bert-nodes@my-project.iam.gserviceaccount.com"
  result, calls = _check(tmp_path, f"--node-service-account={account}")
  assert result.returncode == 0, result.stderr
  assert calls == ["cp", "rm", "image"]
  log = (tmp_path / "calls.txt").read_text().splitlines()
  assert all(line.endswith(f"--impersonate-service-account={account}") for line in log)


_DENIED = (f"ERROR: (gcloud.storage.cp) [{OWN}] does not have permission to access b "
           "instance [my-bucket] (or it may not exist): Permission 'storage.objects.create' "
           "denied on resource (or it may not exist). This command is authenticated as "
           f"{OWN} which is the active account specified by the [auth/impersonate_"
           "service_account] property.")
_READ_ONLY = ";".join(f"https://www.googleapis.com/auth/{scope}" for scope in [
    "devstorage.read_only", "logging.write", "monitoring"])


@pytest.mark.parametrize("refused,line", [
    ({"cp": f'echo "{_DENIED}" >&2; exit 1'},
     f"xpk.sh: --check: {OWN} cannot write to gs://my-bucket/runs/base: {_DENIED}; it "
     "needs roles/storage.objectAdmin (launch/gke_setup.sh grants it)"),
    ({"image": 'echo "ERROR: (gcloud.artifacts.docker.images.describe) NOT_FOUND: Requested '
               'entity was not found." >&2; exit 1'},
     f"xpk.sh: --check: {OWN} cannot read {IMAGE}: ERROR: (gcloud.artifacts.docker."
     "images.describe) NOT_FOUND: Requested entity was not found.; push it, and grant "
     "roles/artifactregistry.reader on its repository"),
    ({"pools": f"echo 'bert-np-0|{OWN}|{SCOPES}'; echo 'bert-np-1|{OWN}|{_READ_ONLY}'"},
     f"xpk.sh: --check: node pool bert-np-1's access scopes ({_READ_ONLY}) do not let its pods "
     f"write to Cloud Storage, whatever roles {OWN} has; xpk cluster create gives TPU pools "
     "storage-full and cloud-platform: make the pool again with those"),
])
def test_a_refused_permission_is_one_line_naming_what_is_missing(tmp_path, refused, line):
  result, calls = _check(tmp_path, **refused)
  assert result.returncode == 1
  assert result.stderr.splitlines() == [line]
  assert ("rm" in calls) == ("cp" not in refused)  # nothing written, nothing to delete


def test_a_cluster_without_tpu_node_pools_is_one_line(tmp_path):
  result, calls = _check(tmp_path, pools="true")
  assert result.returncode == 1
  assert result.stderr.splitlines() == [
      "xpk.sh: cluster bert has no TPU node pools in us-west4 (xpk cluster create makes them); "
      "give the pods' service account with --node-service-account"]
  assert calls == ["pools"]


def test_an_account_you_may_not_act_as_says_which_role_is_missing(tmp_path):
  error = ('echo "ERROR: (gcloud.storage.cp) Failed to impersonate [%s]. Make sure the account '
           'that\'s trying to impersonate it has access to the service account itself and the '
           '\\"roles/iam.serviceAccountTokenCreator\\" role." >&2; exit 1' % OWN)
  result, _ = _check(tmp_path, cp=error, image=error.replace("storage.cp", "artifacts"))
  assert result.returncode == 1
  lines = result.stderr.splitlines()
  assert len(lines) == 2
  assert all(line.endswith(f"; you may not act as {OWN}: roles/iam.serviceAccountToken"
                           "Creator on it (launch/gke_setup.sh --impersonator=YOU grants it)")
             for line in lines)
