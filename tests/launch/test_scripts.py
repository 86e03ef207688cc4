"""The launch scripts: the exact gcloud commands of their dry runs, clear
errors for missing settings, and shellcheck."""

import glob
import os
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "launch", "*.sh")))
SETTINGS = ["--project=my-project", "--zone=us-central2-b", "--name=bert"]
SCOPE = ["--zone=us-central2-b", "--project=my-project"]


def dry_run(script, *args, env=None):
  """The commands a script would run, each split into its arguments."""
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", script), "--dry-run", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("BERTJAX_")} | (env or {}))
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


def test_create_directly_or_queued():
  assert dry_run("create.sh", *SETTINGS, "--accelerator-type=v4-32",
                 "--runtime-version=tpu-ubuntu2204-base", "--spot") == [
      ["gcloud", "compute", "tpus", "tpu-vm", "create", "bert", "--accelerator-type=v4-32",
       "--version=tpu-ubuntu2204-base", "--spot", *SCOPE]]
  env = {"BERTJAX_PROJECT": "my-project", "BERTJAX_ZONE": "us-central2-b",
         "BERTJAX_TPU_NAME": "bert", "BERTJAX_ACCELERATOR_TYPE": "v5p-64",
         "BERTJAX_RUNTIME_VERSION": "v2-alpha-tpuv5"}
  assert dry_run("create.sh", "--queued", env=env) == [
      ["gcloud", "compute", "tpus", "queued-resources", "create", "bert", "--node-id=bert",
       "--accelerator-type=v5p-64", "--runtime-version=v2-alpha-tpuv5", *SCOPE]]


def test_setup_copies_the_committed_tree_and_installs_on_every_worker():
  commands = dry_run("setup.sh", *SETTINGS)
  assert commands[0][:3] == ["git", "-C", ROOT] and commands[0][-1] == "HEAD"
  archive = next(a for a in commands[0] if a.startswith("--output=")).split("=", 1)[1]
  assert commands[1] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive,
                         "bert:bertjax.tar.gz", "--worker=all", *SCOPE]
  ssh = commands[2]
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert"]
  assert "--worker=all" in ssh
  remote = next(a for a in ssh if a.startswith("--command=")).split("=", 1)[1]
  assert shlex.split(remote)[-4:] == ["install", "-q", "-e", "$HOME/bertjax[tpu]"]


def test_run_starts_main_on_every_worker_with_logs_per_worker():
  commands = dry_run("run.sh", *SETTINGS, "--config=configs/base_pretrain.py:no_nsp",
                     "--workdir=gs://bucket/run one", "--",
                     "--config.train.batch_size=512")
  assert commands[0][:2] == ["mkdir", "-p"] and commands[0][2].startswith("logs/bert/")
  ssh = commands[1]
  assert ssh[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert", "--worker=all"]
  remote = shlex.split(next(a for a in ssh if a.startswith("--command=")).split("=", 1)[1])
  assert remote == ["cd", "~/bertjax", "&&", "python3", "-m", "bertjax.main",
                    "--config=configs/base_pretrain.py:no_nsp", "--workdir=gs://bucket/run one",
                    "--config.train.batch_size=512"]
  assert f"--output-directory={commands[0][2]}" in ssh and ssh[-2:] == SCOPE


def test_delete():
  assert dry_run("delete.sh", *SETTINGS, "--queued") == [
      ["gcloud", "compute", "tpus", "queued-resources", "delete", "bert", "--force", "--quiet",
       *SCOPE]]


@pytest.mark.parametrize("script,args,message", [
    ("create.sh", ["--zone=z", "--name=n"], "missing --project (or BERTJAX_PROJECT)"),
    ("create.sh", SETTINGS, "missing --accelerator-type (or BERTJAX_ACCELERATOR_TYPE)"),
    ("create.sh", SETTINGS + ["--accelerator-type=v4-8", "--runtime-version=r", "--spot",
                              "--preemptible"], "choose one of --spot and --preemptible"),
    ("run.sh", SETTINGS + ["--config=c.py"], "missing --workdir"),
    ("run.sh", SETTINGS + ["--config=c.py", "--workdir=/tmp/run"], "must be a gs:// path"),
    ("delete.sh", SETTINGS + ["--bogus"], "unknown flag --bogus"),
])
def test_missing_or_wrong_settings_are_clear_errors(script, args, message):
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", script), "--dry-run", *args],
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("BERTJAX_")})
  assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("script", [os.path.basename(s) for s in SCRIPTS if
                                    not s.endswith("lib.sh")])
def test_help(script):
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", script), "--help"],
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0 and result.stdout.startswith("Usage: launch/" + script)
  assert "--dry-run" in result.stdout


def test_shellcheck_passes():
  shellcheck = shutil.which("shellcheck") or os.path.join(os.path.dirname(sys.executable),
                                                          "shellcheck")
  result = subprocess.run([shellcheck, "-x", *SCRIPTS], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
  assert result.returncode == 0, result.stdout


def test_run_recreates_a_preempted_tpu_and_reruns(tmp_path):
  """With a stand-in `gcloud` (this machine reaches no cloud): the first run
  fails, the TPU reports PREEMPTED, and run.sh deletes, recreates, sets up
  and reruns it."""
  calls = tmp_path / "calls.txt"
  stub = tmp_path / "bin" / "gcloud"
  stub.parent.mkdir()
  stub.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {calls}
case "$*" in
  *"tpu-vm ssh"*"--output-directory"*)
    runs=$(grep -c -- "--output-directory" {calls})
    [[ $runs -ge 2 ]] ;;
  *"tpu-vm describe"*) echo PREEMPTED ;;
esac
""")
  stub.chmod(0o755)
  env = {k: v for k, v in os.environ.items() if not k.startswith("BERTJAX_")}
  env.update(PATH=f"{stub.parent}:{env['PATH']}", TMPDIR=str(tmp_path))
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "run.sh"), *SETTINGS, "--config=configs/demo.py",
       "--workdir=gs://bucket/run", "--restarts=2",
       "--create-flags=--queued --spot --accelerator-type=v4-8 --runtime-version=rt"],
      capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "the TPU is PREEMPTED" in result.stderr
  verbs = [" ".join(line.split()[1:4]) for line in calls.read_text().splitlines()]
  assert verbs == ["tpus tpu-vm ssh", "tpus tpu-vm describe", "tpus queued-resources delete",
                   "tpus queued-resources create", "tpus tpu-vm scp", "tpus tpu-vm ssh",
                   "tpus tpu-vm ssh"]
