"""launch/xpk.sh against the real `xpk` package's dry run: the JobSet it would
apply (no cluster needed), checked against bertjax's own view of the slices.

xpk pins its dependencies strictly, so it gets a virtual environment of its
own (tests/launch/xpk_env.py).
"""

import glob
import json
import os
import shlex
import re
import signal
import subprocess
import time

import pytest
import yaml

from tests.launch.xpk_env import XPK_VERSION, xpk_executable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = "us-docker.pkg.dev/my-project/images/bertjax:1"
# xpk reports each command's use to Google (its `send-telemetry` setting, on by
# default, dry runs included); TELEMETRY_ENABLED=false turns it off for one command.
QUIET = {"TELEMETRY_ENABLED": "false"}


@pytest.fixture(scope="module")
def xpk():
  """The path of an `xpk` executable of its own virtual environment."""
  executable = xpk_executable()
  if executable is None:
    pytest.skip(f"xpk {XPK_VERSION} could not be installed from PyPI here")
  return executable


def _submit(xpk, tmp_path, *args):
  manifest = tmp_path / "jobset.yaml"
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--dry-run", "--project=my-project",
       "--zone=us-central2-b", "--cluster=bert", f"--image={IMAGE}",
       "--config=configs/large_pretrain.py:lamb", "--workdir=gs://my-bucket/runs/large",
       f"--manifest={manifest}", *args],
      capture_output=True, text=True, timeout=300, cwd=tmp_path,
      env={**os.environ, "BERTJAX_XPK": xpk, **QUIET})
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return yaml.safe_load(manifest.read_text()), result.stdout


def _pod(jobset):
  (job,) = jobset["spec"]["replicatedJobs"]
  return job["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("tpu_type,slices", [("v4-32", 1), ("v5litepod-16", 2),
                                             ("v5p-64", 1), ("v6e-16", 2)])
def test_the_workload_runs_bertjax_on_every_host_of_every_slice(xpk, tmp_path, tpu_type,
                                                               slices):
  from bertjax import topology
  from bertjax.configs import large_pretrain
  from bertjax.tools.compiling import compiler as step_compiler

  jobset, printed = _submit(xpk, tmp_path, f"--tpu-type={tpu_type}", f"--num-slices={slices}",
                            "--workload=bert-large", "--max-restarts=7", "--spot", "--",
                            "--config.data.dir=gs://my-bucket/data/wiki")
  assert jobset["kind"] == "JobSet" and jobset["metadata"]["name"] == "bert-large"
  assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 7
  (job,) = jobset["spec"]["replicatedJobs"]
  pod = job["template"]["spec"]["template"]["spec"]
  (container,) = pod["containers"]
  assert container["image"] == IMAGE
  # The workload is named in the workdir's lock (bertjax.workdir_lock). xpk
  # writes every variable as a fixed value: no downward API, so JobSet's
  # restart attempt cannot reach the run, and a restart takes the lock as a
  # new run does (docs/troubleshooting.md).
  assert {"name": "BERTJAX_WORKLOAD", "value": "bert-large"} in container["env"]
  assert all(set(item) == {"name", "value"} for item in container["env"])
  assert ("python3 -m bertjax.main --config=configs/large_pretrain.py:lamb "
          "--workdir=gs://my-bucket/runs/large --grace_seconds=10 "
          "--config.data.dir=gs://my-bucket/data/wiki" in container["command"][-1])
  # GKE gives a spot pod 15 seconds after SIGTERM whatever it asks for; xpk's
  # wrapper takes up to 5 of them to pass SIGTERM on to the run.
  assert pod["terminationGracePeriodSeconds"] == 15
  # The pods run on their node's network and name no Kubernetes service
  # account: their credentials come from the Compute Engine metadata server,
  # not Workload Identity, so they act as their node pool's Google service
  # account (what launch/gke_setup.sh grants and xpk.sh --check acts as).
  assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
  assert pod["serviceAccountName"] is None
  # The slices and hosts are those bertjax compiles the run for.
  tpu_slice = topology.parse(tpu_type)
  hosts, chips_per_host = job["template"]["spec"]["parallelism"], int(
      container["resources"]["limits"]["google.com/tpu"])
  assert job["replicas"] == slices and hosts == tpu_slice.hosts
  assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "x".join(
      map(str, tpu_slice.shape))
  config = large_pretrain.get_config("lamb")
  target = step_compiler.make_target(config, tpu_type, slices)
  assert target.hosts == slices * hosts and target.chips == slices * hosts * chips_per_host
  assert dict(target.mesh.shape)["data"] * dict(target.mesh.shape)["fsdp"] == target.chips
  assert "kubectl apply" in printed  # what xpk would do, not done


def test_a_preemption_restarts_the_workload_and_an_error_to_mend_ends_it(xpk, tmp_path):
  """xpk restarts on exit codes 42 and 127-255: bertjax exits 143 after saving
  on a preemption's SIGTERM (a restart resumes it), 2 on an error to mend and 1
  on a bug (a restart would end the same way)."""
  jobset, _ = _submit(xpk, tmp_path, "--tpu-type=v5litepod-16")
  (job,) = jobset["spec"]["replicatedJobs"]
  (rule,) = job["template"]["spec"]["podFailurePolicy"]["rules"]
  assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "NotIn"
  restarted = set(rule["onExitCodes"]["values"])
  assert {42, 143, 137} <= restarted and not {0, 1, 2} & restarted
  assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 10  # the default
  # A failure no FailJob rule matches (42, 143) fails the slice's Job with
  # BackoffLimitExceeded (backoffLimit 0); the JobSet's one rule takes only
  # PodFailurePolicy failures, so JobSet's default applies: RestartJobSet,
  # counted against maxRestarts. Nothing restarts without counting
  # (RestartJobSetAndIgnoreMaxRestarts): every preemption uses a restart, as
  # docs/tpu.md counts them.
  assert job["template"]["spec"]["backoffLimit"] == 0
  assert jobset["spec"]["failurePolicy"]["rules"] == [
      {"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
  assert "IgnoreMaxRestarts" not in yaml.safe_dump(jobset)
  # Without --spot the pods ask for 300 seconds, and the run is told 5 fewer.
  assert _pod(jobset)["terminationGracePeriodSeconds"] == 300
  assert "--grace_seconds=295" in _pod(jobset)["containers"][0]["command"][-1]


@pytest.mark.parametrize("grace,told", [("60", 55), ("3", 0)])
def test_the_run_is_told_the_grace_it_really_has(xpk, tmp_path, grace, told):
  jobset, _ = _submit(xpk, tmp_path, "--tpu-type=v6e-16", "--spot", f"--grace-seconds={grace}")
  pod = _pod(jobset)
  assert pod["terminationGracePeriodSeconds"] == int(grace)
  assert re.search(rf"--grace_seconds={told}\b", pod["containers"][0]["command"][-1])


def test_xpks_wrapper_passes_sigterm_on_late_and_the_runs_status_back(xpk, tmp_path):
  """The container runs xpk's bash wrapper around the command: it forwards
  the pod's SIGTERM from a loop that sleeps 5 seconds, so the run hears of it
  up to 5 seconds late (what xpk.sh takes off the grace it tells the run), and
  the container exits with the run's status (143 after a SIGTERM, which the
  JobSet restarts on)."""
  jobset, _ = _submit(xpk, tmp_path, "--tpu-type=v5litepod-16", "--spot")
  command = _pod(jobset)["containers"][0]["command"]
  assert command[:2] == ["bash", "-c"] and "sleep 5" in command[2]
  stand_in = tmp_path / "bin" / "python3"
  stand_in.parent.mkdir()
  stand_in.write_text('#!/usr/bin/env bash\necho "$*" > "$OUT/args"\n'
                      'trap \'date +%s.%N > "$OUT/term"; exit 143\' TERM\n'
                      'while true; do sleep 0.05; done\n')
  stand_in.chmod(0o755)
  env = {**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}", "OUT": str(tmp_path)}
  container = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 30
    while not (tmp_path / "args").exists():
      assert time.time() < deadline
      time.sleep(0.05)
    time.sleep(1)
    sent = time.time()
    container.send_signal(signal.SIGTERM)  # the kubelet signals the container's first process
    output, _ = container.communicate(timeout=30)
  finally:
    if container.poll() is None:
      container.kill()
  delay = float((tmp_path / "term").read_text()) - sent
  assert 2.5 < delay < 5.5, delay
  assert container.returncode == 143 and "EXIT_CODE=143" in output
  assert "--grace_seconds=10" in (tmp_path / "args").read_text()


def test_xpk_reports_dry_runs_unless_told_not_to(xpk, tmp_path):
  """xpk sends a usage report after every command, dry runs included (its
  payload says XPK_DRY_RUN); the `send-telemetry` setting or
  TELEMETRY_ENABLED=false stops it. Here the report cannot leave (a closed
  proxy), so what xpk meant to send stays in its temporary folder."""
  def dry_run(env, home):
    temporary = tmp_path / home / "tmp"
    temporary.mkdir(parents=True)
    result = subprocess.run(
        [xpk, "workload", "create", "--cluster=bert", "--workload=bert", "--tpu-type=v4-8",
         "--docker-image=image", "--command=true", "--project=p", "--zone=us-central2-b",
         "--dry-run"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "HOME": str(tmp_path / home), "TMPDIR": str(temporary),
             "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", **env})
    assert result.returncode == 0, result.stdout[-2000:]
    time.sleep(1)  # the uploader, in the background, tries and fails
    return [json.load(open(path)) for path in glob.glob(str(temporary / "*"))]

  (report,) = dry_run({}, "reporting")
  assert report["url"] == "https://play.googleapis.com/log"
  assert '\\"key\\": \\"XPK_DRY_RUN\\", \\"value\\": \\"true\\"' in report["data"]
  assert dry_run(QUIET, "quiet") == []
  home = tmp_path / "configured"
  setting = subprocess.run([xpk, "config", "set", "send-telemetry", "false"],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "HOME": str(home)})
  assert setting.returncode == 0, setting.stdout
  assert "send-telemetry: 'false'" in (home / ".config" / "xpk" / "config.yaml").read_text()
  assert dry_run({}, "configured") == []


def _cluster_dry_run(xpk, tmp_path, words):
  tmp_path.mkdir()
  result = subprocess.run([xpk, *words[1:], "--dry-run", "--quiet"], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HOME": str(tmp_path), **QUIET})
  assert result.returncode == 0, result.stdout[-3000:]
  return result.stdout


def test_the_pods_act_as_their_node_pool_as_the_docs_say(xpk, tmp_path):
  """xpk's TPU pods run on the host's network (no flag turns it off), so GKE's
  Workload Identity does not reach them: docs/tpu.md, launch/README.md and
  gke_setup.sh say they act as their node pool's service account."""
  jobset, _ = _submit(xpk, tmp_path, "--tpu-type=v5litepod-16", "--storage=bert-data")
  pod = _pod(jobset)
  assert pod["hostNetwork"] is True and pod["serviceAccountName"] is None
  docs = " ".join(open(os.path.join(ROOT, "docs", "tpu.md"), encoding="utf-8").read().split())
  assert "`hostNetwork: true`" in docs and "their node pool's service account" in docs
  readme = " ".join(open(os.path.join(ROOT, "launch", "README.md"),
                         encoding="utf-8").read().split())
  assert "the service account of their TPU node pools" in readme
  setup = subprocess.run(["bash", os.path.join(ROOT, "launch", "gke_setup.sh"), "--help"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
  assert "(hostNetwork: true)" in setup and "their node pool" in " ".join(setup.split())


def test_the_cluster_command_in_the_docs_gives_the_tpu_pools_the_accounts_the_scripts_expect(
    xpk, tmp_path):
  """docs/tpu.md's `xpk cluster create` (dry run): TPU node pools (machine
  types ct*, which gke_setup.sh and xpk.sh --check list) running as the Compute
  Engine default service account (no --service-account) with access scopes
  that let their pods write to Cloud Storage, Workload Identity on the cluster,
  and the cluster regional, where the scripts look for it. With
  --custom-nodepool-arguments=--service-account=EMAIL, as the docs suggest,
  every TPU pool runs as that account."""
  docs = open(os.path.join(ROOT, "docs", "tpu.md"), encoding="utf-8").read()
  (line,) = [line.strip() for line in docs.splitlines()
             if line.strip().startswith("xpk cluster create")]
  words = shlex.split(line.replace("\\", ""), comments=True)
  printed = _cluster_dry_run(xpk, tmp_path / "default", words)
  project = next(w.split("=")[1] for w in words if w.startswith("--project="))
  cluster = re.findall(r"clusters create .*", printed)[0]
  assert re.search(rf"clusters create \S+ --project={project} --region=us-west4 .*"
                   rf"--workload-pool={project}\.svc\.id\.goog", cluster)
  assert not re.search(r"--machine-type=(ct|tpu)", cluster)  # not listed as a TPU pool
  pools = re.findall(r"node-pools create .*", printed)
  assert len(pools) == 2
  for pool in pools:
    assert re.search(r"--machine-type=ct\S+ ", pool)
    assert "--spot" in pool and "--workload-metadata=GKE_METADATA" in pool
    assert "--service-account" not in pool
    assert re.search(r"--scopes=storage-full,gke-default,\S*auth/cloud-platform", pool)
  assert any(w.startswith("--zone=us-west4-") for w in words)
  account = f"bert-nodes@{project}.iam.gserviceaccount.com"
  assert f"--custom-nodepool-arguments=--service-account={account}" in docs
  printed = _cluster_dry_run(xpk, tmp_path / "own", [
      *words, f"--custom-nodepool-arguments=--service-account={account}"])
  pools = re.findall(r"node-pools create .*", printed)
  assert len(pools) == 2 and all(pool.endswith(f" --service-account={account}")
                                 for pool in pools)


def _dry_run(*args, xpk_path=None):
  env = {k: v for k, v in os.environ.items() if not k.startswith("BERTJAX_")}
  if xpk_path:
    env["BERTJAX_XPK"] = xpk_path
  return subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--dry-run", "--project=p",
       "--zone=z", "--cluster=c", "--config=configs/demo.py", "--workdir=gs://b/r", *args],
      capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args,message", [
    (["--tpu-type=v4-8"], "missing --image (or BERTJAX_IMAGE)"),
    ([f"--image={IMAGE}"], "missing --tpu-type (or BERTJAX_ACCELERATOR_TYPE)"),
    ([f"--image={IMAGE}", "--tpu-type=v4-8", "--workload=Bert_Large"],
     "--workload takes lower-case letters, digits and '-', a letter first (xpk's "
     "[a-z]([-a-z0-9]*[a-z0-9])?), got Bert_Large"),
    ([f"--image={IMAGE}", "--tpu-type=v4-8", "--workload=bert-large-"],
     "--workload bert-large- ends in '-'; xpk wants a letter or digit last"),
    ([f"--image={IMAGE}", "--tpu-type=v4-8", "--workload=" + "b" * 41],
     "--workload " + "b" * 41 + " has 41 characters; xpk takes at most 40"),
    ([f"--image={IMAGE}", "--tpu-type=v4-8", "--spot", "--on-demand"],
     "choose one of --spot, --reservation and --on-demand"),
    ([f"--image={IMAGE}", "--tpu-type=v4-8", "--grace-seconds=soon"],
     "--grace-seconds takes a number, got soon"),
])
def test_settings_to_mend_are_one_line(args, message):
  result = _dry_run(*args)
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [f"xpk.sh: {message}"]


NAMES = ["a", "bert-large", "bert-", "-bert", "Bert", "1bert", "bert_large", "bert--1",
         "b" * 40, "b" * 41, "bert-large-20261204-101010", "x" * 39 + "-"]


def test_workload_names_are_checked_as_xpk_checks_them(xpk):
  """Each name xpk.sh takes, xpk's own validator (parser/validators.py
  name_type) takes, and each it refuses, xpk refuses."""
  python = os.path.join(os.path.dirname(xpk), "python")
  check = ("import argparse, json, sys\n"
           "from xpk.parser.validators import name_type\n"
           "def ok(name):\n"
           "  try:\n"
           "    return bool(name_type(name))\n"
           "  except argparse.ArgumentTypeError:\n"
           "    return False\n"
           "print(json.dumps([ok(name) for name in json.loads(sys.argv[1])]))")
  verdicts = subprocess.run([python, "-c", check, json.dumps(NAMES)], capture_output=True,
                            text=True, timeout=120, check=True)
  for name, taken in zip(NAMES, json.loads(verdicts.stdout)):
    result = _dry_run(f"--image={IMAGE}", "--tpu-type=v4-8", f"--workload={name}",
                      xpk_path="true")
    assert (result.returncode == 0) == taken, (name, result.stderr)
    assert taken or len(result.stderr.splitlines()) == 1


def test_the_docs_and_the_script_pin_the_xpk_the_tests_use():
  script = open(os.path.join(ROOT, "launch", "xpk.sh"), encoding="utf-8").read()
  assert f"XPK_VERSION={XPK_VERSION}\n" in script
  docs = open(os.path.join(ROOT, "docs", "tpu.md"), encoding="utf-8").read()
  assert f"pip install xpk=={XPK_VERSION}" in docs
  assert "xpk config set send-telemetry false" in docs


def _exit_status_table():
  """{exit status: what GKE does} from docs/troubleshooting.md's table."""
  text = open(os.path.join(ROOT, "docs", "troubleshooting.md"), encoding="utf-8").read()
  rows = {}
  for line in text.splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if len(cells) == 5 and cells[0][:1].isdigit():
      for status in cells[0].replace("...", "").split(","):
        if status.strip():
          rows[int(status)] = cells[4]
  return rows


def test_the_exit_status_table_is_what_the_real_jobset_does(xpk, tmp_path):
  """docs/troubleshooting.md says, for each exit status, whether GKE restarts
  the workload: the restart rules of the JobSet xpk would apply say the same."""
  from bertjax import errors
  from bertjax.tasks import pretrain

  jobset, _ = _submit(xpk, tmp_path, "--tpu-type=v5litepod-16")
  (job,) = jobset["spec"]["replicatedJobs"]
  rules = job["template"]["spec"]["podFailurePolicy"]["rules"]
  (ends,) = [rule for rule in rules if rule.get("onExitCodes")]
  assert ends["action"] == "FailJob" and ends["onExitCodes"]["operator"] == "NotIn"
  restarted = set(ends["onExitCodes"]["values"])
  table = _exit_status_table()
  assert {0, 1, 2, 42, 130, 143, 134, 137} <= set(table)
  assert table[errors.RESTART_EXIT_CODE] == "restarts"
  assert table[errors.USAGE_EXIT_CODE] == "ends"
  assert table[pretrain.PREEMPTED_EXIT_CODE] == "restarts"
  for status, gke in table.items():
    if status:
      assert gke == ("restarts" if status in restarted else "ends"), status


def test_storage_and_variables_are_passed_on_to_xpk(xpk, tmp_path):
  """A mounted bucket or disk (xpk storage attach) and a variable for the pods
  (the cache on that volume): passed to xpk as its own flags."""
  jobset, printed = _submit(xpk, tmp_path, "--tpu-type=v5litepod-16", "--storage=bert-data",
                            "--env=BERTJAX_CACHE_DIR=/mnt/disk/cache", "--",
                            "--config.data.dir=/mnt/disk/wiki")
  assert "--storage=bert-data" in printed.splitlines()[0]
  (job,) = jobset["spec"]["replicatedJobs"]
  (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
  env = {item["name"]: item.get("value") for item in container["env"]}
  assert env["BERTJAX_CACHE_DIR"] == "/mnt/disk/cache" and env["BERTJAX_WORKLOAD"]
  assert "--config.data.dir=/mnt/disk/wiki" in container["command"][-1]
