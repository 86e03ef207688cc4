"""The launch scripts: the exact gcloud commands of their dry runs, clear
errors for missing settings, and shellcheck."""

import glob
import os
import shlex
import shutil
import subprocess
import sys
import time

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
  assert remote == ["rm", "-f", "~/bertjax.stop", "&&", "cd", "~/bertjax", "&&", "python3",
                    "-m", "bertjax.main",
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


def _gcloud_stub(tmp_path, body):
  """A stand-in `gcloud` on PATH (this machine reaches no cloud) that logs its
  calls to calls.txt and then runs `body` (bash)."""
  stub = tmp_path / "bin" / "gcloud"
  stub.parent.mkdir(exist_ok=True)
  stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "calls.txt"}\n{body}\n')
  stub.chmod(0o755)
  env = {k: v for k, v in os.environ.items() if not k.startswith("BERTJAX_")}
  env.update(PATH=f"{stub.parent}:{env['PATH']}", TMPDIR=str(tmp_path), HOME=str(tmp_path))
  return env


def _run_with_stub(tmp_path, body, *flags):
  """run.sh --restarts=3 against a stand-in gcloud: (result, gcloud verbs called)."""
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "run.sh"), *SETTINGS, "--config=configs/demo.py",
       "--workdir=gs://bucket/run", "--restarts=3", *flags],
      capture_output=True, text=True, cwd=tmp_path, env=_gcloud_stub(tmp_path, body),
      timeout=120)
  calls = (tmp_path / "calls.txt").read_text().splitlines()
  return result, [" ".join(line.split()[1:4]) for line in calls]


# The first run fails (exit 143, as a stopped or preempted run does), the next succeeds.
_FIRST_RUN_FAILS = """case "$*" in
  *"--output-directory"*) [[ $(grep -c -- "--output-directory" "$TMPDIR/calls.txt") -ge 2 ]] \
    || exit 143 ;;"""


def test_run_recreates_a_preempted_tpu_and_reruns(tmp_path):
  """The TPU reports PREEMPTED after the failure: run.sh deletes, recreates,
  sets up and reruns it."""
  result, verbs = _run_with_stub(tmp_path, _FIRST_RUN_FAILS + """
  *"tpu-vm describe"*) echo PREEMPTED ;;
esac""", "--create-flags=--queued --spot --accelerator-type=v4-8 --runtime-version=rt")
  assert result.returncode == 0, result.stderr
  assert "the TPU is PREEMPTED" in result.stderr
  assert verbs == ["tpus tpu-vm ssh", "tpus tpu-vm describe", "tpus queued-resources delete",
                   "tpus queued-resources create", "tpus tpu-vm scp", "tpus tpu-vm ssh",
                   "tpus tpu-vm ssh"]


def test_run_does_not_rerun_a_stopped_run(tmp_path):
  """The run exits after stop.sh; the TPU is READY and holds the stop marker,
  so run.sh reports it and ends instead of starting it again."""
  result, verbs = _run_with_stub(tmp_path, _FIRST_RUN_FAILS + """
  *"tpu-vm describe"*) echo READY ;;
  *"test -e ~/bertjax.stop"*) exit 0 ;;
esac""")
  assert result.returncode == 143, result.stderr
  assert "stopped with stop.sh; not rerunning" in result.stderr
  assert verbs == ["tpus tpu-vm ssh", "tpus tpu-vm describe", "tpus tpu-vm ssh"]


def test_run_reruns_on_a_ready_tpu_without_the_stop_marker(tmp_path):
  """A run that stopped by itself (a maintenance event's SIGTERM) on a TPU that
  is still READY is started again: it resumes from its checkpoint."""
  result, verbs = _run_with_stub(tmp_path, _FIRST_RUN_FAILS + """
  *"tpu-vm describe"*) echo READY ;;
  *"test -e ~/bertjax.stop"*) exit 1 ;;
esac""")
  assert result.returncode == 0, result.stderr
  assert verbs == ["tpus tpu-vm ssh", "tpus tpu-vm describe", "tpus tpu-vm ssh",
                   "tpus tpu-vm ssh"]


def test_stop_signals_the_run_on_every_worker_and_waits():
  ssh = dry_run("stop.sh", *SETTINGS, "--timeout=30")[0]
  assert ssh[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert", "--worker=all"]
  remote = next(a for a in ssh if a.startswith("--command=")).split("=", 1)[1]
  assert remote.startswith("touch ~/bertjax.stop;")
  assert "pkill -TERM -f 'python3 -m [b]ertjax[.]main'" in remote and "seq 30" in remote
  assert "pkill -KILL" in " ".join(dry_run("stop.sh", *SETTINGS, "--kill")[0])


def test_stop_runs_its_worker_command_to_a_clean_exit(tmp_path):
  """The worker command itself, run here by the stand-in gcloud: it signals a
  process that looks like the run, which saves and exits 143, and returns
  when it is gone. pkill and pgrep are held to that process's group, so no
  other process of this machine is touched."""
  saved = tmp_path / "saved"
  worker = subprocess.Popen(
      ["bash", "-c", f'exec -a "python3 -m bertjax.main --config=x" {sys.executable} -c '
       f'"import signal, sys, time\n'
       f'signal.signal(signal.SIGTERM, lambda *_: (open(\'{saved}\', \'w\').write(\'step 7\'), '
       f'sys.exit(143)))\ntime.sleep(60)"'], start_new_session=True)
  for tool in ("pkill", "pgrep"):
    wrapper = tmp_path / "bin" / tool
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/usr/bin/env bash\nexec {shutil.which(tool)} -g {worker.pid} "$@"\n')
    wrapper.chmod(0o755)
  env = _gcloud_stub(tmp_path, 'for a in "$@"; do [[ $a == --command=* ]] && '
                                  'exec bash -c "${a#--command=}"; done')
  deadline = time.time() + 30
  while b"bertjax.main" not in open(f"/proc/{worker.pid}/cmdline", "rb").read():
    assert time.time() < deadline
    time.sleep(0.1)
  time.sleep(0.5)  # the handler is installed
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "stop.sh"), *SETTINGS,
                           "--timeout=30"], capture_output=True, text=True, env=env, timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith(": stopped")
  assert worker.wait(timeout=10) == 143 and saved.read_text() == "step 7"
  assert (tmp_path / "bertjax.stop").exists()  # run.sh will not restart it
  # Nothing left to stop: said, and not an error.
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "stop.sh"), *SETTINGS],
                          capture_output=True, text=True, env=env, timeout=60)
  assert result.returncode == 0 and result.stdout.strip().endswith(": no bertjax run")
