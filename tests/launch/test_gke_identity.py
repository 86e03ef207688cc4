"""The GKE workloads' cloud identity: launch/gke_setup.sh (the account, its
grants, Workload Identity, the image repository) and launch/xpk.sh --check
(what the workload will do, done as that account): their dry runs' exact
commands, and both at work against a stand-in `gcloud` (and `kubectl`) that
answers as the real ones do, refusals included."""

import os
import subprocess

import pytest

from tests.launch.test_scripts import ROOT, _clean_env, _gcloud_stub, dry_run

PROJECT = ["--project=my-project", "--zone=us-west4-a"]
SETUP = [*PROJECT, "--cluster=bert", "--bucket=gs://my-bucket/runs"]
ACCOUNT = "bertjax-workload@my-project.iam.gserviceaccount.com"
POD_MEMBER = "serviceAccount:my-project.svc.id.goog[default/default]"
IMAGE = "us-west4-docker.pkg.dev/my-project/bertjax/bertjax:v1"
SUBMIT = [*PROJECT, "--cluster=bert", "--tpu-type=v5litepod-16", f"--image={IMAGE}",
          "--config=configs/base_pretrain.py", "--workdir=gs://my-bucket/runs/base",
          "--workload=bert-base"]
AS = f"--impersonate-service-account={ACCOUNT}"
OBJECT = "gs://my-bucket/runs/base/.bertjax-check-bert-base"
REPOSITORY = ["--location=us-west4", "--project=my-project"]


def test_setup_dry_run_prints_every_command():
  assert dry_run("gke_setup.sh", *SETUP, "--project-number=123",
                 "--impersonator=user:me@example.com") == [
      ["gcloud", "services", "enable", "artifactregistry.googleapis.com",
       "container.googleapis.com", "iam.googleapis.com", "iamcredentials.googleapis.com",
       "storage.googleapis.com", "tpu.googleapis.com", "--project=my-project"],
      ["gcloud", "artifacts", "repositories", "create", "bertjax", "--repository-format=docker",
       "--location=us-west4", "--description=bertjax images", "--project=my-project"],
      ["gcloud", "iam", "service-accounts", "create", "bertjax-workload",
       "--display-name=bertjax workloads", "--project=my-project"],
      ["gcloud", "storage", "buckets", "add-iam-policy-binding", "gs://my-bucket",
       f"--member=serviceAccount:{ACCOUNT}", "--role=roles/storage.objectAdmin"],
      ["gcloud", "artifacts", "repositories", "add-iam-policy-binding", "bertjax", *REPOSITORY,
       f"--member=serviceAccount:{ACCOUNT}", "--role=roles/artifactregistry.reader"],
      ["gcloud", "artifacts", "repositories", "add-iam-policy-binding", "bertjax", *REPOSITORY,
       "--member=serviceAccount:123-compute@developer.gserviceaccount.com",
       "--role=roles/artifactregistry.reader"],
      ["gcloud", "iam", "service-accounts", "add-iam-policy-binding", ACCOUNT,
       "--project=my-project", "--role=roles/iam.workloadIdentityUser", f"--member={POD_MEMBER}"],
      ["gcloud", "container", "clusters", "get-credentials", "bert", "--location=us-west4",
       "--project=my-project"],
      ["kubectl", "annotate", "serviceaccount", "default", "--namespace=default",
       f"iam.gke.io/gcp-service-account={ACCOUNT}", "--overwrite"],
      ["gcloud", "iam", "service-accounts", "add-iam-policy-binding", ACCOUNT,
       "--project=my-project", "--role=roles/iam.serviceAccountTokenCreator",
       "--member=user:me@example.com"],
      ["gcloud", "auth", "configure-docker", "us-west4-docker.pkg.dev", "--quiet"]]


def test_setup_dry_run_for_xpk_storage_and_an_account_that_exists():
  """Workloads that mount xpk storage run as xpk-sa, made if missing; an
  account given by its e-mail is used as it is, never created."""
  commands = dry_run("gke_setup.sh", *SETUP, "--ksa=default/xpk-sa", "--impersonator=none",
                     "--service-account=trainer@other.iam.gserviceaccount.com",
                     "--region=us", "--repository=images")
  assert not [c for c in commands if c[:4] == ["gcloud", "iam", "service-accounts", "create"]]
  assert ["kubectl", "create", "serviceaccount", "xpk-sa", "--namespace=default"] in commands
  assert [c[-2] for c in commands if "--role=roles/iam.workloadIdentityUser" in c] == [
      "--role=roles/iam.workloadIdentityUser"]
  assert ["gcloud", "iam", "service-accounts", "add-iam-policy-binding",
          "trainer@other.iam.gserviceaccount.com", "--project=my-project",
          "--role=roles/iam.workloadIdentityUser",
          "--member=serviceAccount:my-project.svc.id.goog[default/xpk-sa]"] in commands
  assert not [c for c in commands if "--role=roles/iam.serviceAccountTokenCreator" in c]
  assert commands[-1] == ["gcloud", "auth", "configure-docker", "us-docker.pkg.dev", "--quiet"]
  assert "--member=serviceAccount:PROJECT_NUMBER-compute@developer.gserviceaccount.com" in [
      a for c in commands for a in c]


# A stand-in kubectl, logging its calls beside gcloud's.
_KUBECTL = """#!/usr/bin/env bash
echo "kubectl $*" >> "$TMPDIR/calls.txt"
[[ "$1" != get ]] || { echo 'Error from server (NotFound): serviceaccounts "xpk-sa" not found' >&2; exit 1; }
"""


def _setup(tmp_path, body, *args):
  env = _gcloud_stub(tmp_path, body)
  kubectl = tmp_path / "bin" / "kubectl"
  kubectl.write_text(_KUBECTL)
  kubectl.chmod(0o755)
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "gke_setup.sh"), *SETUP, *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
  calls = (tmp_path / "calls.txt").read_text().splitlines()
  return result, [("" if line.startswith("kubectl") else "gcloud ") + line.split(" --")[0]
                  for line in calls]


# gcloud as a project where the repository exists and the account does not yet.
_PROJECT = """case "$*" in
  "iam service-accounts describe"*) echo "ERROR: (gcloud.iam.service-accounts.describe) NOT_FOUND: Unknown service account" >&2; exit 1 ;;
  "projects describe"*) echo 123 ;;
  "container clusters describe"*) echo %s ;;
  "config get-value account") echo me@example.com ;;
  "storage buckets add-iam-policy-binding"*)
    (( $(grep -c "storage buckets add-iam-policy-binding" "$TMPDIR/calls.txt") > 1 )) || {
      echo "ERROR: (gcloud.storage.buckets.add-iam-policy-binding) HTTPError 400: Service account $ACCOUNT does not exist." >&2; exit 1; } ;;
esac"""


def test_setup_makes_what_is_missing_and_grants_again_an_account_not_known_yet(tmp_path):
  """The repository exists (kept), the account does not (made); the bucket's
  grant is refused once, as for an account created a moment ago, and given
  on the next try."""
  result, calls = _setup(tmp_path, _PROJECT % "my-project.svc.id.goog")
  assert result.returncode == 0, result.stderr
  assert calls == [
      "gcloud services enable artifactregistry.googleapis.com container.googleapis.com "
      "iam.googleapis.com iamcredentials.googleapis.com storage.googleapis.com "
      "tpu.googleapis.com",
      "gcloud artifacts repositories describe bertjax",
      f"gcloud iam service-accounts describe {ACCOUNT}",
      "gcloud iam service-accounts create bertjax-workload",
      "gcloud storage buckets add-iam-policy-binding gs://my-bucket",
      "gcloud storage buckets add-iam-policy-binding gs://my-bucket",
      "gcloud artifacts repositories add-iam-policy-binding bertjax",
      "gcloud projects describe my-project",
      "gcloud artifacts repositories add-iam-policy-binding bertjax",
      "gcloud container clusters describe bert",
      f"gcloud iam service-accounts add-iam-policy-binding {ACCOUNT}",
      "gcloud container clusters get-credentials bert",
      "kubectl annotate serviceaccount default",
      "gcloud config get-value account",
      f"gcloud iam service-accounts add-iam-policy-binding {ACCOUNT}",
      "gcloud auth configure-docker us-west4-docker.pkg.dev"]
  log = (tmp_path / "calls.txt").read_text()
  assert "--member=serviceAccount:123-compute@developer.gserviceaccount.com" in log
  assert "--member=user:me@example.com" in log
  assert result.stdout.strip() == (
      f"gke_setup.sh: the pods of bert (default/default) act as {ACCOUNT}, which writes in "
      "gs://my-bucket and reads us-west4-docker.pkg.dev/my-project/bertjax; check a run with "
      "launch/xpk.sh ... --check")


def test_setup_refuses_a_cluster_without_workload_identity(tmp_path):
  result, calls = _setup(tmp_path, _PROJECT % '""')
  assert result.returncode == 1
  assert result.stderr.splitlines()[-1] == (
      "gke_setup.sh: cluster bert has no Workload Identity: xpk cluster create "
      "--enable-workload-identity (with the cluster's other flags) turns it on")
  assert "kubectl annotate serviceaccount default" not in calls


def test_check_dry_run_prints_what_it_would_do_as_the_account():
  """--check acts as the workload's account: its IAM policy (may the pods act
  as it?), an object written and deleted in the workdir, the image read."""
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--dry-run",
                           "--check", *SUBMIT], capture_output=True, text=True, timeout=60,
                          env=_clean_env())
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      f"gcloud iam service-accounts get-iam-policy {ACCOUNT} --project=my-project "
      r"--flatten=bindings\[\].members --filter=bindings.role=roles/iam.workloadIdentityUser "
      r"--format=value\(bindings.members\)",
      f"echo bertjax-check | gcloud storage cp - {OBJECT} {AS}",
      f"gcloud storage rm {OBJECT} {AS}",
      f"gcloud artifacts docker images describe {IMAGE} {AS}"]


# gcloud as the workload's account sees things: the pods may act as it, and it
# may write, delete and read. Each test takes one of these away.
_GRANTED = {
    "policy": f'echo {POD_MEMBER}; echo "serviceAccount:other.svc.id.goog[ns/ksa]"',
    "cp": 'cat > "$TMPDIR/uploaded"',
    "rm": "true",
    "image": "echo image_summary",
}
_PATTERNS = {"policy": "iam service-accounts get-iam-policy", "cp": "storage cp",
             "rm": "storage rm", "image": "artifacts docker images describe"}


def _check(tmp_path, **refused):
  body = "case \"$*\" in\n" + "".join(
      f'  "{_PATTERNS[k]}"*) {refused.get(k, v)} ;;\n' for k, v in _GRANTED.items()) + "esac"
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--check", *SUBMIT],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env=_gcloud_stub(tmp_path, body))
  calls = (tmp_path / "calls.txt").read_text().splitlines()
  return result, [next(k for k, v in _PATTERNS.items() if line.startswith(v)) for line in calls]


def test_check_passes_when_the_account_has_what_the_workload_needs(tmp_path):
  result, calls = _check(tmp_path)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == (
      f"xpk.sh: --check: {ACCOUNT} is what the pods act as, writes and deletes in "
      f"gs://my-bucket/runs/base and reads {IMAGE}")
  assert (tmp_path / "uploaded").read_text() == "bertjax-check\n"
  assert calls == ["policy", "cp", "rm", "image"]
  log = (tmp_path / "calls.txt").read_text().splitlines()
  assert all(line.endswith(AS) for line in log[1:])


_DENIED = (f"ERROR: (gcloud.storage.cp) [{ACCOUNT}] does not have permission to access b "
           "instance [my-bucket] (or it may not exist): Permission 'storage.objects.create' "
           "denied on resource (or it may not exist). This command is authenticated as "
           f"{ACCOUNT} which is the active account specified by the [auth/impersonate_"
           "service_account] property.")


@pytest.mark.parametrize("refused,line", [
    ({"cp": f'echo "{_DENIED}" >&2; exit 1'},
     f"xpk.sh: --check: {ACCOUNT} cannot write to gs://my-bucket/runs/base: {_DENIED}; it "
     "needs roles/storage.objectAdmin"),
    ({"image": 'echo "ERROR: (gcloud.artifacts.docker.images.describe) NOT_FOUND: Requested '
               'entity was not found." >&2; exit 1'},
     f"xpk.sh: --check: {ACCOUNT} cannot read {IMAGE}: ERROR: (gcloud.artifacts.docker."
     "images.describe) NOT_FOUND: Requested entity was not found.; push it, and grant "
     "roles/artifactregistry.reader on its repository"),
    ({"policy": 'echo "serviceAccount:other.svc.id.goog[ns/ksa]"'},
     "xpk.sh: --check: the pods' Kubernetes service account default/default may not act as "
     f"{ACCOUNT}: roles/iam.workloadIdentityUser for {POD_MEMBER} (launch/gke_setup.sh binds "
     "it)"),
])
def test_a_refused_permission_is_one_line_naming_what_is_missing(tmp_path, refused, line):
  result, calls = _check(tmp_path, **refused)
  assert result.returncode == 1
  assert result.stderr.splitlines() == [line]
  assert ("rm" in calls) == ("cp" not in refused)  # nothing written, nothing to delete


def test_an_account_you_may_not_act_as_says_which_role_is_missing(tmp_path):
  error = ('echo "ERROR: (gcloud.storage.cp) Failed to impersonate [%s]. Make sure the account '
           'that\'s trying to impersonate it has access to the service account itself and the '
           '\\"roles/iam.serviceAccountTokenCreator\\" role." >&2; exit 1' % ACCOUNT)
  result, _ = _check(tmp_path, cp=error, image=error.replace("storage.cp", "artifacts"))
  assert result.returncode == 1
  lines = result.stderr.splitlines()
  assert len(lines) == 2
  assert all(line.endswith(f"; you may not act as {ACCOUNT}: roles/iam.serviceAccountToken"
                           "Creator on it (launch/gke_setup.sh --impersonator=YOU grants it)")
             for line in lines)
