"""The launch scripts: the exact gcloud commands of their dry runs, clear
errors for missing settings, shellcheck, and the scripts at work against a
stand-in `gcloud` whose "workers" are this machine (a temporary HOME)."""

import glob
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "launch", "*.sh")))
SETTINGS = ["--project=my-project", "--zone=us-central2-b", "--name=bert"]
SCOPE = ["--zone=us-central2-b", "--project=my-project"]
WORKER = ["bash", "~/bertjax/launch/worker.sh"]
HOST = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
STARTUP = f"--metadata-from-file=startup-script={ROOT}/launch/startup.sh"


def _clean_env(env=None):
  return {k: v for k, v in os.environ.items() if not k.startswith("BERTJAX_")} | (env or {})


def dry_run(script, *args, env=None):
  """The commands a script would run, each split into its arguments."""
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", script), "--dry-run", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env=_clean_env(env))
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


def remote(command):
  """The worker's command of a `gcloud compute tpus tpu-vm ssh`, split."""
  return shlex.split(next(a for a in command if a.startswith("--command=")).split("=", 1)[1])


def test_create_directly_or_queued():
  assert dry_run("create.sh", *SETTINGS, "--accelerator-type=v4-32",
                 "--runtime-version=tpu-ubuntu2204-base", "--spot") == [
      ["gcloud", "compute", "tpus", "tpu-vm", "create", "bert", "--accelerator-type=v4-32",
       "--version=tpu-ubuntu2204-base", "--spot", STARTUP, *SCOPE]]
  env = {"BERTJAX_PROJECT": "my-project", "BERTJAX_ZONE": "us-central2-b",
         "BERTJAX_TPU_NAME": "bert", "BERTJAX_ACCELERATOR_TYPE": "v5p-64",
         "BERTJAX_RUNTIME_VERSION": "v2-alpha-tpuv5"}
  assert dry_run("create.sh", "--queued", env=env) == [
      ["gcloud", "compute", "tpus", "queued-resources", "create", "bert", "--node-id=bert",
       "--accelerator-type=v5p-64", "--runtime-version=v2-alpha-tpuv5", STARTUP, *SCOPE],
      ["gcloud", "compute", "tpus", "queued-resources", "describe", "bert",
       "--format=value(state.state)", *SCOPE]]


@pytest.mark.parametrize("accelerator,runtime", [
    ("v4-32", "tpu-ubuntu2204-base"), ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")])
def test_create_picks_the_runtime_google_documents_for_the_generation(accelerator, runtime):
  create = dry_run("create.sh", *SETTINGS, f"--accelerator-type={accelerator}")[0]
  assert f"--version={runtime}" in create
  queued = dry_run("create.sh", *SETTINGS, f"--accelerator-type={accelerator}", "--queued")[0]
  assert f"--runtime-version={runtime}" in queued


def test_create_reserved_internal_ips_and_more_gcloud_flags_with_spaced_values():
  """--flag value works as --flag=value does; flags after -- go to gcloud."""
  assert dry_run("create.sh", "--project", "my-project", "--zone", "us-central2-b",
                 "--name", "bert", "--accelerator-type", "v6e-16", "--reserved",
                 "--internal-ips", "--", "--network=net", "--subnetwork", "sub") == [
      ["gcloud", "compute", "tpus", "tpu-vm", "create", "bert", "--accelerator-type=v6e-16",
       "--version=v2-alpha-tpuv6e", "--reserved", "--internal-ips", STARTUP, "--network=net",
       "--subnetwork", "sub", *SCOPE]]
  assert dry_run("create.sh", *SETTINGS, "--accelerator-type=v5litepod-16", "--queued",
                 "--reserved", "--internal-ips")[0] == [
      "gcloud", "compute", "tpus", "queued-resources", "create", "bert", "--node-id=bert",
      "--accelerator-type=v5litepod-16", "--runtime-version=v2-alpha-tpuv5-lite", "--reserved",
      "--internal-ips", STARTUP, *SCOPE]
  assert STARTUP not in dry_run("create.sh", *SETTINGS, "--accelerator-type=v4-8",
                                "--no-startup-script")[0]


def test_setup_copies_the_committed_tree_and_installs_into_its_own_python():
  live, *commands = dry_run("setup.sh", *SETTINGS)
  assert remote(live)[:5] == ["if", "bash", "~/bertjax/launch/worker.sh", "state", "latest"]
  assert commands[0][:3] == ["git", "-C", ROOT] and commands[0][-1] == "HEAD"
  archive = next(a for a in commands[0] if a.startswith("--output=")).split("=", 1)[1]
  assert commands[1] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive,
                         "bert:bertjax.tar.gz", "--worker=all", *SCOPE]
  ssh = commands[2]
  assert ssh[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert", "--worker=all"]
  words = " ".join(remote(ssh))
  assert ("uv venv -q --python-preference=only-managed --python=3.11 ~/bertjax-venv"
          in words)
  assert ("uv pip install -q --python=$HOME/bertjax-venv/bin/python -e $HOME/bertjax[tpu]"
          in words)
  assert "--python=3.12" in " ".join(dry_run("setup.sh", *SETTINGS, "--python", "3.12")[3])


def test_run_starts_the_run_detached_on_every_worker_then_follows_it():
  commands = dry_run("run.sh", *SETTINGS, "--config=configs/base_pretrain.py:no_nsp",
                     "--workdir", "gs://bucket/run one", "--run-id=bert-base", "--",
                     "--config.train.batch_size=512")
  start, follow = commands
  assert start[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert", "--worker=all"]
  assert remote(start) == [*WORKER, "start", "bert-base",
                           "--config=configs/base_pretrain.py:no_nsp",
                           "--workdir=gs://bucket/run one", "--config.train.batch_size=512"]
  assert start[-2:] == SCOPE
  assert follow[:7] == start[:7] and remote(follow) == [*WORKER, "follow", "bert-base", "+1"]
  # The run's name defaults to the time; --detach only starts it.
  commands = dry_run("run.sh", *SETTINGS, "--config=c.py", "--workdir=gs://b/r", "--detach")
  assert len(commands) == 1 and re.fullmatch(r"\d{8}T\d{6}Z", remote(commands[0])[3])
  # ... and with what needs watching, run.sh itself goes on in the background.
  mkdir, supervisor = dry_run("run.sh", *SETTINGS, "--config=c.py", "--workdir=gs://b/r",
                              "--detach", "--restarts=3", "--run-id=r", "--", "--config.seed=1")
  assert mkdir[:2] == ["mkdir", "-p"] and mkdir[2].endswith("/.bertjax/launch")
  assert supervisor[:3] == ["setsid", "nohup", "bash"] and supervisor[3].endswith("/run.sh")
  assert "--detach" not in supervisor and supervisor[-2:] == ["--", "--config.seed=1"]
  assert supervisor[4] == "--run-id=r" and "--restarts=3" in supervisor


def _ssh_and_scp_commands(ssh_flags):
  """The gcloud commands of every script that reaches the workers, dry run with
  BERTJAX_SSH_FLAGS=ssh_flags."""
  env = {"BERTJAX_SSH_FLAGS": ssh_flags}
  for script, args in [("setup.sh", []), ("stop.sh", []), ("logs.sh", ["--follow"]),
                       ("run.sh", ["--config=c.py", "--workdir=gs://b/r"])]:
    yield from (c for c in dry_run(script, *SETTINGS, *args, env=env) if c[0] == "gcloud")


def test_ssh_flags_reach_every_ssh_and_scp():
  commands = list(_ssh_and_scp_commands("--internal-ip"))
  assert len(commands) >= 5
  for command in commands:
    assert command[-3:] == ["--internal-ip", *SCOPE], command


def test_iap_goes_through_the_gcloud_track_that_has_it_for_tpu_vms():
  """GA `tpu-vm ssh` and `scp` refuse --tunnel-through-iap; alpha takes it."""
  commands = list(_ssh_and_scp_commands("--tunnel-through-iap"))
  assert len(commands) >= 5
  for command in commands:
    assert command[:5] == ["gcloud", "alpha", "compute", "tpus", "tpu-vm"], command
    assert command[5] in ("ssh", "scp") and command[-3:] == ["--tunnel-through-iap",
                                                              *SCOPE], command


def test_logs_follows_or_fetches_every_workers_log():
  follow = dry_run("logs.sh", *SETTINGS, "--follow")[0]
  assert follow[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert", "--worker=all"]
  assert remote(follow) == [*WORKER, "follow", "latest", "+1"]
  follow = dry_run("logs.sh", *SETTINGS, "--follow", "--lines", "50", "--run-id=r-1")[0]
  assert remote(follow) == [*WORKER, "follow", "r-1", "50"]
  mkdir, fetch = dry_run("logs.sh", *SETTINGS, "--fetch", "logs/bert")
  assert mkdir == ["mkdir", "-p", "logs/bert"]
  assert remote(fetch) == [*WORKER, "log", "latest"]
  assert "--output-directory=logs/bert" in fetch


def test_delete():
  assert dry_run("delete.sh", *SETTINGS, "--queued") == [
      ["gcloud", "compute", "tpus", "queued-resources", "delete", "bert", "--force", "--quiet",
       *SCOPE]]


@pytest.mark.parametrize("script,args,message", [
    ("create.sh", ["--zone=z", "--name=n"], "missing --project (or BERTJAX_PROJECT)"),
    ("create.sh", SETTINGS, "missing --accelerator-type (or BERTJAX_ACCELERATOR_TYPE)"),
    ("create.sh", SETTINGS + ["--accelerator-type=v4-8", "--spot", "--reserved"],
     "choose one of --spot, --preemptible and --reserved"),
    ("create.sh", SETTINGS + ["--accelerator-type=v3-8"],
     "no default runtime version for v3-8 (known: v4, v5litepod, v5p, v6e); "
     "give --runtime-version"),
    ("create.sh", SETTINGS + ["--accelerator-type=v4-8", "--wait-timeout=soon"],
     "--wait-timeout takes a number"),
    ("create.sh", SETTINGS + ["--accelerator-type"], "--accelerator-type needs a value"),
    ("run.sh", SETTINGS + ["--config=c.py"], "missing --workdir"),
    ("run.sh", SETTINGS + ["--config=c.py", "--workdir=/tmp/run"], "must be a gs:// path"),
    ("logs.sh", SETTINGS, "give --follow or --fetch DIR"),
    ("delete.sh", SETTINGS + ["--bogus"], "unknown flag --bogus"),
])
def test_missing_or_wrong_settings_are_clear_errors(script, args, message):
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", script), "--dry-run", *args],
                          capture_output=True, text=True, timeout=60, env=_clean_env())
  assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("script", [os.path.basename(s) for s in SCRIPTS if
                                    not s.endswith("lib.sh")])
def test_help(script):
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", script), "--help"],
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0 and result.stdout.startswith("Usage: launch/" + script)
  # Every flag the script matches is explained.
  source = open(os.path.join(ROOT, "launch", script)).read()
  for flag in re.findall(r"^\s+(--[\w-]+)(?:=\*)?\)", source, re.M):
    assert flag in result.stdout, (script, flag)
  if script not in ("worker.sh", "startup.sh"):  # the worker side: over SSH, or at boot
    assert "--dry-run" in result.stdout


def test_shellcheck_passes():
  shellcheck = shutil.which("shellcheck") or os.path.join(os.path.dirname(sys.executable),
                                                          "shellcheck")
  benchmarks = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.sh")))
  assert benchmarks  # benchmarks/gpu.sh
  result = subprocess.run([shellcheck, "-x", *SCRIPTS, *benchmarks], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
  assert result.returncode == 0, result.stdout


# The stand-in gcloud plays `tpu-vm ssh` with `remote`: the worker's command
# runs on this machine, in a session of its own as sshd gives it (the test
# hangs that session up to drop the connection); --output-directory gets a
# 0.log as gcloud writes one per worker.
_REMOTE = r"""
remote() {
  local command="" out="" a
  for a in "$@"; do
    case "$a" in
      --command=*) command="${a#--command=}" ;;
      --output-directory=*) out="${a#*=}/0.log" ;;
    esac
  done
  if [[ -n "$out" ]]; then
    setsid bash -c "$command" > "$out" 2>&1 &
  else
    setsid bash -c "$command" &
  fi
  echo $! >> "$TMPDIR/sessions.txt"
  wait $!
}
"""


def _gcloud_stub(tmp_path, body):
  """A stand-in `gcloud` on PATH (this machine reaches no cloud) that logs its
  calls to calls.txt and then runs `body` (bash, with `remote` to play ssh).
  HOME is tmp_path, so the workers' files land there."""
  stub = tmp_path / "bin" / "gcloud"
  stub.parent.mkdir(exist_ok=True)
  stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "calls.txt"}\n'
                  f'{_REMOTE}\n{body}\n')
  stub.chmod(0o755)
  return _clean_env({"PATH": f"{stub.parent}:{os.environ['PATH']}", "TMPDIR": str(tmp_path),
                     "HOME": str(tmp_path), "BERTJAX_POLL_SECONDS": "0.1"})


def _worker_home(tmp_path, run, ship_logs=False):
  """Makes tmp_path a worker as setup.sh leaves one: ~/bertjax is this
  checkout, and ~/bertjax-venv/bin/python a stand-in for the run (bash `run`).
  The log copier beside each run (bertjax.tools.ship_log) is this Python with
  `ship_logs`, else it does nothing."""
  (tmp_path / "bertjax").symlink_to(ROOT)
  python = tmp_path / "bertjax-venv" / "bin" / "python"
  python.parent.mkdir(parents=True)
  ship = f'exec {sys.executable} "$@"' if ship_logs else "exit 0"
  python.write_text(f'#!/usr/bin/env bash\n[[ "$*" != "-m bertjax.tools.ship_log"* ]] || '
                    f'{{ {ship}; }}\n{run}\n')
  python.chmod(0o755)


def _calls(tmp_path):
  """The gcloud calls, named by group and verb, and for ssh by what it ran."""
  names = []
  for line in (tmp_path / "calls.txt").read_text().splitlines():
    words = line.split()
    name = " ".join(words[2:4])
    if words[3] == "ssh":
      match = re.search(r"worker\.sh (\w+)", line)
      name += " " + (match.group(1) if match else "setup" if "tar -xzf" in line else
                     "stop-marker" if "test -e ~/bertjax.stop" in line else "?")
    names.append(name)
  return names


def _script(name, *args, env, cwd, timeout=60):
  return subprocess.run(["bash", os.path.join(ROOT, "launch", name), *SETTINGS, *args],
                        capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


# What gcloud says, on stderr with exit status 1, for a TPU or queued resource
# that does not exist.
_NOT_FOUND = {
    group: (f'echo "ERROR: (gcloud.compute.tpus.{group}.describe) NOT_FOUND: Resource '
            f"'projects/my-project/locations/us-central2-b/{kind}/bert' was not found\" >&2; "
            "exit 1")
    for group, kind in [("tpu-vm", "nodes"), ("queued-resources", "queuedResources")]}


def _queued_states(*states):
  """A stand-in answer to `queued-resources describe`: NOT_FOUND unless the
  last `queued-resources create` or `delete` was a create, then the states in
  turn from the first create, the last one from then on."""
  lines = [f'  (( n == {i + 1} )) && echo {s} && exit 0' for i, s in enumerate(states[:-1])]
  return ('*"queued-resources describe"*)\n'
          '  last=$(grep -E "queued-resources (create|delete)" "$TMPDIR/calls.txt" '
          '| tail -n 1)\n'
          f'  [[ "$last" == *create* ]] || {{ {_NOT_FOUND["queued-resources"]}; }}\n'
          '  n=$(sed -n "/queued-resources create/,\\$p" "$TMPDIR/calls.txt" '
          '| grep -c "queued-resources describe")\n'
          + "\n".join(lines) + f"\n  echo {states[-1]} ;;")


def test_create_waits_for_a_queued_resource_to_become_active(tmp_path):
  env = _gcloud_stub(tmp_path, "case \"$*\" in\n" + _queued_states(
      "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES",
      "PROVISIONING", "ACTIVE") + "\nesac")
  result = _script("create.sh", "--accelerator-type=v4-8", "--queued", "--spot", env=env,
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert _calls(tmp_path) == (["queued-resources describe", "queued-resources create"]
                              + ["queued-resources describe"] * 5)
  assert result.stderr.splitlines() == [
      "create.sh: queued resource bert is WAITING_FOR_RESOURCES",
      "create.sh: queued resource bert is PROVISIONING",
      "create.sh: queued resource bert is ACTIVE"]


def test_create_fails_clearly_when_the_queued_resource_fails(tmp_path):
  env = _gcloud_stub(tmp_path, "case \"$*\" in\n" + _queued_states(
      "WAITING_FOR_RESOURCES", "FAILED") + "\nesac")
  result = _script("create.sh", "--accelerator-type=v4-8", "--queued", env=env, cwd=tmp_path)
  assert result.returncode == 1
  assert "create.sh: queued resource bert is FAILED, it will not become ACTIVE" in result.stderr


def test_create_gives_up_waiting_after_the_timeout(tmp_path):
  env = _gcloud_stub(tmp_path, "case \"$*\" in\n" + _queued_states("WAITING_FOR_RESOURCES")
                     + "\nesac")
  result = _script("create.sh", "--accelerator-type=v4-8", "--queued", "--wait-timeout", "1",
                   env=env, cwd=tmp_path)
  assert result.returncode == 1
  assert ("queued resource bert is still WAITING_FOR_RESOURCES after 1s (--wait-timeout)"
          in result.stderr)


def test_setup_installs_uv_and_a_python_of_its_own_on_the_worker(tmp_path):
  """setup.sh's worker command, run here: the archive is unpacked to
  ~/bertjax; a worker without uv gets it from pip (a stand-in python3 that
  installs a stand-in uv), and uv makes ~/bertjax-venv and installs bertjax."""
  env = _gcloud_stub(tmp_path, """case "$*" in
  *"tpu-vm scp"*) cp "$5" "$HOME/bertjax.tar.gz" ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""")
  (tmp_path / "bin" / "python3").write_text(f"""#!/usr/bin/env bash
echo "python3 $*" >> "$HOME/installs.txt"
mkdir -p "$HOME/.local/bin"
cat > "$HOME/.local/bin/uv" <<'UV'
#!/usr/bin/env bash
echo "uv $*" >> "$HOME/installs.txt"
if [[ "$1" == venv ]]; then
  mkdir -p "${{@: -1}}/bin"
  printf '#!/usr/bin/env bash\\necho Python 3.11.9\\n' > "${{@: -1}}/bin/python"
  chmod +x "${{@: -1}}/bin/python"
fi
UV
chmod +x "$HOME/.local/bin/uv"
""")
  (tmp_path / "bin" / "python3").chmod(0o755)
  # The worker has no uv: PATH holds only the stand-ins and the tools' folders.
  folders = {os.path.dirname(shutil.which(tool)) for tool in (
      "bash", "git", "gzip", "tar", "mkdir", "rm", "cat", "hostname", "setsid", "sed", "cp",
      "dirname", "basename", "env", "date")}
  if any(os.path.exists(os.path.join(folder, "uv")) for folder in folders):
    pytest.skip("uv is installed beside the system tools here")
  env["PATH"] = ":".join([str(tmp_path / "bin"), *sorted(folders)])
  result = _script("setup.sh", env=env, cwd=tmp_path, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith(f"{HOST}: Python 3.11.9 in ~/bertjax-venv")
  assert (tmp_path / "bertjax" / "setup.py").exists()
  venv = tmp_path / "bertjax-venv"
  assert (tmp_path / "installs.txt").read_text().splitlines() == [
      "python3 -m pip install -q --user uv",
      f"uv venv -q --python-preference=only-managed --python=3.11 {venv}",
      f"uv pip install -q --python={venv}/bin/python -e {tmp_path}/bertjax[tpu]"]


def _run_with_stub(tmp_path, body, run, *flags, restarts=3):
  """run.sh --restarts against a stand-in gcloud whose worker is this machine
  with `run` as the run: (result, gcloud calls)."""
  _worker_home(tmp_path, run)
  result = _script("run.sh", "--config=configs/demo.py", "--workdir=gs://bucket/run",
                   "--run-id=demo", f"--restarts={restarts}", *flags, cwd=tmp_path,
                   env=_gcloud_stub(tmp_path, body), timeout=120)
  return result, _calls(tmp_path)


# The first run exits 143 (as a stopped or preempted run does), the next with 0.
# A preemption: the host goes down, its processes get SIGTERM (the run's whole
# session here), and the run "saves" and exits 143.
_PREEMPTED = "kill -TERM 0; sleep 5"
_FIRST_RUN_FAILS = """n=$(cat ~/runs 2>/dev/null || echo 0); echo $((n + 1)) > ~/runs
echo "run $n in $PWD: $*"
(( n >= 1 )) || { %s; }""" % _PREEMPTED


def test_run_recreates_a_preempted_tpu_and_reruns(tmp_path):
  """The TPU reports PREEMPTED after the failure: run.sh deletes, recreates
  (waiting for the queued resource), sets up and reruns it."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo PREEMPTED ;;
""" + _queued_states("WAITING_FOR_RESOURCES", "ACTIVE") + """
  *"tar -xzf"*) ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", _FIRST_RUN_FAILS, "--create-flags=--queued --spot --accelerator-type=v4-8")
  assert result.returncode == 0, result.stderr
  assert "run.sh: the run failed (143); the TPU is PREEMPTED" in result.stderr
  assert calls == ["tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state",
                   "tpu-vm describe", "queued-resources describe", "queued-resources delete",
                   "queued-resources describe", "queued-resources create",
                   "queued-resources describe", "queued-resources describe",
                   "tpu-vm ssh state", "tpu-vm scp", "tpu-vm ssh setup", "tpu-vm ssh start",
                   "tpu-vm ssh follow"]
  logs = tmp_path / "bertjax-logs"
  assert (logs / "demo.status").read_text() == "143\n"
  assert (logs / "demo-1.status").read_text() == "0\n"
  assert "run 1 in " + str(tmp_path / "bertjax") in (logs / "demo-1.log").read_text()
  assert f"{HOST}: run 1 in" in result.stdout  # followed, with the worker's name


def test_run_reports_a_failed_recreation_and_tries_again(tmp_path):
  """Recreating fails (the queued resource FAILED): run.sh says so and, while
  restarts are left, tries again, then gives up with a message."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo PREEMPTED ;;
""" + _queued_states("FAILED") + """
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", _PREEMPTED, "--create-flags=--queued --accelerator-type=v4-8", restarts=2)
  assert result.returncode == 1
  assert "queued resource bert is FAILED" in result.stderr
  assert result.stderr.count("run.sh: recreating or setting up the TPU failed (1)") == 2
  assert "run.sh: giving up after 2 restarts (1)" in result.stderr
  assert calls.count("queued-resources create") == 2 and "tpu-vm scp" not in calls


def test_a_recreation_that_gave_up_waiting_keeps_its_place_in_the_queue(tmp_path):
  """The first recreation stops waiting (--wait-timeout=0) while its request is
  still in the queue: the next one waits for that request, never deleting it."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo PREEMPTED ;;
""" + _queued_states("WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES",
                     "WAITING_FOR_RESOURCES", "ACTIVE") + """
  *"tar -xzf"*) ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", _FIRST_RUN_FAILS, "--create-flags=--queued --wait-timeout=0 --accelerator-type=v4-8")
  assert result.returncode == 0, result.stderr
  assert "run.sh: recreating or setting up the TPU failed (1)" in result.stderr
  assert "run.sh: queued resource bert is still WAITING_FOR_RESOURCES: waiting for it" in (
      result.stderr)
  assert "requested already (WAITING_FOR_RESOURCES): waiting for it" in result.stderr
  assert calls.count("queued-resources create") == 1
  first_create = calls.index("queued-resources create")
  assert "queued-resources delete" not in calls[first_create:]  # its place was kept


@pytest.mark.parametrize("queued,readable", [(False, True), (True, True), (False, False)])
def test_a_recreated_tpu_whose_setup_failed_is_set_up_again_not_deleted(tmp_path, queued,
                                                                        readable):
  """The TPU is preempted and recreated, but setting it up fails (its first
  SSH session is refused). The next attempt finds the new TPU READY (its
  queued request ACTIVE), or cannot read its state at all: it sets it up
  again and reruns on it, deleting and creating nothing more."""
  group = "queued-resources" if queued else "tpu-vm"
  after = "echo READY" if readable else _AUTH_ERROR
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*)
    if grep -q "%s create" "$TMPDIR/calls.txt"; then %s; else echo PREEMPTED; fi ;;
""" % (group, after) + _queued_states("ACTIVE") + """
  *"tar -xzf"*)
    (( $(grep -c "tar -xzf" "$TMPDIR/calls.txt") > 1 )) || {
      echo "ERROR: (gcloud.compute.tpus.tpu-vm.ssh) [/usr/bin/ssh] exited with return code" \
        "[255]." >&2
      exit 255; } ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", _FIRST_RUN_FAILS,
      "--create-flags=" + ("--queued " if queued else "") + "--accelerator-type=v4-8")
  assert result.returncode == 0, result.stderr
  first_create = calls.index(f"{group} create")
  assert not [call for call in calls[first_create:] if call in _NO_DELETE], calls
  recreation = (["queued-resources describe", "queued-resources delete",
                 "queued-resources describe", "queued-resources create",
                 "queued-resources describe"] if queued else ["tpu-vm delete", "tpu-vm create"])
  setup = ["tpu-vm ssh state", "tpu-vm scp", "tpu-vm ssh setup"]
  describes = ["tpu-vm describe"] * (1 if readable else 4)
  assert calls == (["tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state",
                    "tpu-vm describe", *recreation, *setup, *describes, *setup,
                    "tpu-vm ssh start", "tpu-vm ssh follow"])
  assert "run.sh: recreating or setting up the TPU failed (1)" in result.stderr
  assert ("run.sh: the run failed (1); the TPU is READY" if readable else
          "run.sh: the run failed (1); the TPU's state could not be read") in result.stderr
  assert ("run.sh: bert, recreated, is not set up yet: setting it up again (deleting nothing)"
          in result.stderr)
  logs = tmp_path / "bertjax-logs"
  assert (logs / "demo.status").read_text() == "143\n"
  assert (logs / "demo-2.status").read_text() == "0\n"  # the second restart ran it


def test_a_run_that_stopped_on_an_error_to_mend_is_not_rerun(tmp_path):
  """Exit 2 is a setting, file or disk to mend: a rerun would end the same way."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", 'echo "error: train.batch_size=7 does not divide ..." >&2; exit 2')
  assert result.returncode == 2, result.stderr
  assert "not rerunning it" in result.stderr
  assert calls == ["tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state"]


def test_run_does_not_rerun_a_stopped_run(tmp_path):
  """The run exits after stop.sh (which left its marker); the TPU is READY, so
  run.sh reports it and ends instead of starting it again."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo READY ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", "touch ~/bertjax.stop; exit 143")
  assert result.returncode == 143, result.stderr
  assert "stopped with stop.sh; not rerunning" in result.stderr
  assert calls == ["tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state",
                   "tpu-vm describe", "tpu-vm ssh stop-marker"]


# A describe that fails for a reason other than a missing TPU: an expired login.
_AUTH_ERROR = ('echo "ERROR: (gcloud.compute.tpus.tpu-vm.describe) There was a problem '
               'refreshing your current auth tokens: invalid_grant" >&2; exit 1')
_NO_DELETE = ("tpu-vm delete", "queued-resources delete")


def test_a_describe_that_fails_for_a_while_deletes_nothing(tmp_path):
  """The TPU's describe fails twice (a login to refresh), then says READY:
  run.sh tries it again, deletes nothing and reruns on the same TPU."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) (( $(grep -c "tpu-vm describe" "$TMPDIR/calls.txt") > 2 )) && echo READY \
    && exit 0; %s ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""" % _AUTH_ERROR, _FIRST_RUN_FAILS, "--create-flags=--queued --accelerator-type=v4-8")
  assert result.returncode == 0, result.stderr
  assert calls == ["tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state"] + [
      "tpu-vm describe"] * 3 + ["tpu-vm ssh stop-marker", "tpu-vm ssh state",
                                "tpu-vm ssh start", "tpu-vm ssh follow"]
  assert result.stderr.count("run.sh: reading the state of tpu-vm bert failed (ERROR: "
                             "(gcloud.compute.tpus.tpu-vm.describe) There was a problem "
                             "refreshing your current auth tokens: invalid_grant); trying "
                             "again") == 2
  assert "run.sh: the run failed (143); the TPU is READY" in result.stderr


def test_a_describe_that_keeps_failing_deletes_nothing_and_reruns(tmp_path):
  """The TPU's state cannot be read at all: run.sh says so in one line,
  deletes and recreates nothing, and runs it again (the TPU is up here)."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) %s ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""" % _AUTH_ERROR, _FIRST_RUN_FAILS, "--create-flags=--queued --accelerator-type=v4-8")
  assert result.returncode == 0, result.stderr
  assert calls.count("tpu-vm describe") == 4
  assert not [call for call in calls if call in _NO_DELETE or call.endswith("create")]
  assert ("run.sh: the run failed (143); the TPU's state could not be read (ERROR: "
          "(gcloud.compute.tpus.tpu-vm.describe) There was a problem refreshing your current "
          "auth tokens: invalid_grant); deleting nothing, running it again") in result.stderr
  assert calls[-2:] == ["tpu-vm ssh start", "tpu-vm ssh follow"]


def test_a_tpu_that_is_not_found_is_recreated(tmp_path):
  """gcloud answers NOT_FOUND: the TPU is gone, run.sh recreates it."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) %s ;;
  *"tar -xzf"*) ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""" % _NOT_FOUND["tpu-vm"], _FIRST_RUN_FAILS, "--create-flags=--accelerator-type=v4-8")
  assert result.returncode == 0, result.stderr
  assert "run.sh: the run failed (143); the TPU is NOT_FOUND" in result.stderr
  assert calls == ["tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state",
                   "tpu-vm describe", "tpu-vm delete", "tpu-vm create", "tpu-vm ssh state",
                   "tpu-vm scp", "tpu-vm ssh setup", "tpu-vm ssh start", "tpu-vm ssh follow"]


def test_a_queued_request_whose_state_cannot_be_read_is_not_deleted(tmp_path):
  """The TPU was preempted, but its queued request's state cannot be read:
  the recreation deletes nothing and fails; run.sh tries again while restarts
  are left, then stops with a line saying why."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo PREEMPTED ;;
  *"queued-resources describe"*) %s ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""" % _AUTH_ERROR.replace("tpu-vm", "queued-resources"), _PREEMPTED,
                                 "--create-flags=--queued --accelerator-type=v4-8", restarts=2)
  assert result.returncode == 1, result.stderr
  assert not [call for call in calls if call in _NO_DELETE or call.endswith("create")]
  assert calls.count("queued-resources describe") == 2 * 4
  assert result.stderr.count("run.sh: the state of queued resource bert could not be read "
                             "(ERROR: (gcloud.compute.tpus.queued-resources.describe) There "
                             "was a problem refreshing your current auth tokens: "
                             "invalid_grant); deleting nothing") == 2
  assert "run.sh: giving up after 2 restarts (1)" in result.stderr


@pytest.mark.parametrize("code,rerun", [(42, True), (130, False)])
def test_exit_42_is_rerun_and_an_interrupted_run_is_not(tmp_path, code, rerun):
  """bertjax.main exits 42 on a failure a restart can cure (storage out of
  reach, a lost host): rerun; 130 after a Ctrl-C: somebody stopped it."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo READY ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", _FIRST_RUN_FAILS.replace(_PREEMPTED, f"exit {code}"))
  if rerun:
    assert result.returncode == 0, result.stderr
    assert "run.sh: the run stopped on a failure a restart can cure (exit 42" in result.stderr
    assert calls[-2:] == ["tpu-vm ssh start", "tpu-vm ssh follow"]
    assert calls.count("tpu-vm ssh start") == 2
  else:
    assert result.returncode == 130, result.stderr
    assert "interrupted (Ctrl-C, exit 130); not rerunning it" in result.stderr
    assert calls.count("tpu-vm ssh start") == 1 and "tpu-vm describe" not in calls


def test_run_reruns_on_a_ready_tpu_without_the_stop_marker(tmp_path):
  """A run that stopped by itself (a maintenance event's SIGTERM) on a TPU that
  is still READY is started again: it resumes from its checkpoint."""
  result, calls = _run_with_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo READY ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""", _FIRST_RUN_FAILS)
  assert result.returncode == 0, result.stderr
  assert calls == ["tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state",
                   "tpu-vm describe", "tpu-vm ssh stop-marker", "tpu-vm ssh state",
                   "tpu-vm ssh start", "tpu-vm ssh follow"]


def test_run_follows_a_run_that_a_restarted_host_resumed_itself(tmp_path):
  """The host restarted (a maintenance event) and its startup script resumed
  the run before run.sh looked: run.sh follows it, and starts nothing."""
  home = tmp_path / "homes" / "worker"
  home.mkdir(parents=True)
  _worker_home(home, _FIRST_RUN_FAILS + "\nsleep 2")  # the resumed run goes on a while
  env = _gcloud_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) bash %s > /dev/null; echo READY ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""" % os.path.join(ROOT, "launch", "startup.sh"))
  env |= {"HOME": str(home), "BERTJAX_HOMES": str(tmp_path / "homes")}
  result = _script("run.sh", "--config=configs/demo.py", "--workdir=gs://bucket/run",
                   "--run-id=demo", "--restarts=3", cwd=tmp_path, env=env, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "goes on again on the workers (resumed after a restart of a host)" in result.stderr
  assert _calls(tmp_path) == [
      "tpu-vm ssh start", "tpu-vm ssh follow", "tpu-vm ssh state", "tpu-vm describe",
      "tpu-vm ssh stop-marker", "tpu-vm ssh state", "tpu-vm ssh follow"]
  assert (home / "runs").read_text() == "2\n"


def _wait_for(condition, timeout=30):
  deadline = time.time() + timeout
  while not condition():
    assert time.time() < deadline, "timed out"
    time.sleep(0.05)


def test_the_run_goes_on_when_the_connection_drops(tmp_path):
  """The SSH session that follows the run is hung up halfway: the run goes on
  on the worker to its end, its log is complete on disk, run.sh follows it
  again and returns its exit status, and so does logs.sh later."""
  _worker_home(tmp_path, 'for i in $(seq 8); do echo "step $i"; sleep 0.25; done\n'
                         'echo finished; exit 5')
  env = _gcloud_stub(tmp_path, 'case "$*" in *"tpu-vm ssh"*) remote "$@" ;; esac')
  log = tmp_path / "bertjax-logs" / "demo.log"
  sessions = tmp_path / "sessions.txt"
  run = subprocess.Popen(
      ["bash", os.path.join(ROOT, "launch", "run.sh"), *SETTINGS, "--config=configs/demo.py",
       "--workdir=gs://bucket/run", "--run-id=demo"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
  try:
    _wait_for(lambda: sessions.exists() and len(sessions.read_text().split()) == 2
              and log.exists() and "step 2" in log.read_text())
    follow_session = int(sessions.read_text().split()[1])
    os.killpg(follow_session, signal.SIGHUP)  # as sshd does when the connection goes
    stdout, stderr = run.communicate(timeout=60)
  finally:
    if run.poll() is None:
      run.kill()
  assert run.returncode == 5, stderr
  assert "while run demo goes on on the workers (a dropped connection?); following it again" \
      in stderr
  assert f"{HOST}: finished" in stdout
  text = log.read_text()
  assert all(f"step {i}\n" in text for i in range(1, 9)) and "finished" in text
  assert text.rstrip().endswith("with exit status 5")
  assert (tmp_path / "bertjax-logs" / "demo.status").read_text() == "5\n"

  result = _script("logs.sh", "--follow", env=env, cwd=tmp_path)
  assert result.returncode == 5
  assert result.stdout.splitlines()[1:10] == [f"{HOST}: step {i}" for i in range(1, 9)] + [
      f"{HOST}: finished"]
  result = _script("logs.sh", "--fetch", "fetched", env=env, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert (tmp_path / "fetched" / "0.log").read_text() == text


def _limit_to_group(tmp_path, group):
  """pkill and pgrep that see only one process group, so that nothing else on
  this machine is touched."""
  for tool in ("pkill", "pgrep"):
    wrapper = tmp_path / "bin" / tool
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/usr/bin/env bash\nexec {shutil.which(tool)} -g {group} "$@"\n')
    wrapper.chmod(0o755)


def test_a_detached_run_is_stopped_with_a_checkpoint_and_its_status_kept(tmp_path):
  """run.sh --detach returns while the run goes on; stop.sh signals its Python
  (not the shell that records its status), which saves and exits 143;
  logs.sh --follow then shows the log and returns 143."""
  _worker_home(tmp_path, """trap 'echo "saved at step $i"; exit 143' TERM
for i in $(seq 600); do echo "step $i"; sleep 0.1; done""")
  env = _gcloud_stub(tmp_path, 'case "$*" in *"tpu-vm ssh"*) remote "$@" ;; esac')
  result = _script("run.sh", "--config=configs/demo.py", "--workdir=gs://bucket/run",
                   "--detach", env=env, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert "goes on on every worker of bert" in result.stderr
  logs = tmp_path / "bertjax-logs"
  run_id = (logs / "latest").read_text().strip()
  _wait_for(lambda: "step 3" in (logs / f"{run_id}.log").read_text())
  assert not (logs / f"{run_id}.status").exists()
  _limit_to_group(tmp_path, int((logs / f"{run_id}.pid").read_text()))
  result = _script("stop.sh", "--timeout=30", env=env, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith(": stopped")
  result = _script("logs.sh", "--follow", env=env, cwd=tmp_path)
  assert result.returncode == 143
  assert re.search(rf"^{re.escape(HOST)}: saved at step \d+$", result.stdout, re.M)
  assert (logs / f"{run_id}.status").read_text() == "143\n"
  assert (tmp_path / "bertjax.stop").exists()  # run.sh --restarts will not restart it


# A stand-in run that notes each start (its flags, its pid), logs 40 steps and,
# on SIGTERM, "saves" and exits 143 as bertjax.main does.
_RESUMABLE_RUN = """echo "$*" >> ~/attempts.txt
echo $$ > ~/python.pid
trap 'echo "saved at step $i"; exit 143' TERM
for i in $(seq 40); do echo "step $i"; sleep 0.1; done"""


def _attempts(home):
  path = home / "attempts.txt"
  return path.read_text().splitlines() if path.exists() else []


def _start_detached(tmp_path, env):
  """run.sh --detach, until the run has logged step 3: (its logs folder, its id)."""
  result = _script("run.sh", "--config=configs/demo.py", "--workdir=gs://bucket/run",
                   "--detach", env=env, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  logs = pathlib.Path(env["HOME"]) / "bertjax-logs"
  run_id = (logs / "latest").read_text().strip()
  _wait_for(lambda: "step 3" in (logs / f"{run_id}.log").read_text())
  return logs, run_id


def test_a_run_resumes_by_itself_when_another_host_restarts(tmp_path):
  """Another host of the slice restarting: its SIGTERM reaches this host's
  training loop too (JAX's preemption sync point), which saves and exits 143.
  This host goes on, so worker.sh starts the run again at once, waiting longer
  for the hosts to join; nobody watches (run.sh --detach)."""
  _worker_home(tmp_path, _RESUMABLE_RUN)
  env = _gcloud_stub(tmp_path, 'case "$*" in *"tpu-vm ssh"*) remote "$@" ;; esac')
  logs, run_id = _start_detached(tmp_path, env)
  os.kill(int((tmp_path / "python.pid").read_text()), signal.SIGTERM)
  _wait_for(lambda: (logs / f"{run_id}.status").exists(), timeout=60)
  assert (logs / f"{run_id}.status").read_text() == "0\n"
  first, second = _attempts(tmp_path)
  assert "--initialization_timeout_s" not in first
  assert second == first + " --initialization_timeout_s=1800"
  log = (logs / f"{run_id}.log").read_text()
  assert "saved at step" in log and "starting it again (attempt 2)" in log
  assert log.count("step 40") == 1


def _host_gone_down(tmp_path, run):
  """A detached run on a worker whose host then goes down (SIGTERM to
  everything): (its home, boot-id file, env, logs folder, run id)."""
  home = tmp_path / "homes" / "worker"
  home.mkdir(parents=True)
  _worker_home(home, run)
  boot_id = tmp_path / "boot_id"
  boot_id.write_text("boot-1\n")
  env = _gcloud_stub(tmp_path, 'case "$*" in *"tpu-vm ssh"*) remote "$@" ;; esac')
  env |= {"HOME": str(home), "BERTJAX_BOOT_ID_FILE": str(boot_id),
          "BERTJAX_HOMES": str(tmp_path / "homes")}
  logs, run_id = _start_detached(tmp_path, env)
  os.killpg(int((logs / f"{run_id}.pid").read_text()), signal.SIGTERM)  # the shutdown
  _wait_for(lambda: (logs / f"{run_id}.status").exists())
  return home, boot_id, env, logs, run_id


def test_a_restarted_host_resumes_its_run_from_the_startup_script(tmp_path):
  """The host going down (SIGTERM to everything: the run saves and exits 143)
  does not start the run again there; at the next boot the slice's startup
  script does, as the user who started it, in the same log. A run that ended
  is left as it is at the boot after."""
  home, boot_id, env, logs, run_id = _host_gone_down(tmp_path, _RESUMABLE_RUN)
  assert (logs / f"{run_id}.status").read_text() == "143\n"
  time.sleep(0.5)
  assert len(_attempts(home)) == 1  # not started again on a host going down

  boot_id.write_text("boot-2\n")
  startup = [os.path.join(ROOT, "launch", "startup.sh")]
  result = subprocess.run(startup, capture_output=True, text=True, env=env, timeout=60)
  assert result.returncode == 0, result.stderr
  assert f"resumed run {run_id}" in result.stdout
  _wait_for(lambda: (logs / f"{run_id}.status").exists(), timeout=60)
  assert (logs / f"{run_id}.status").read_text() == "0\n"
  first, second = _attempts(home)
  assert second == first + " --initialization_timeout_s=1800"
  log = (logs / f"{run_id}.log").read_text()
  assert log.index("saved at step") < log.index("started again") < log.index("step 40")

  result = subprocess.run(startup, capture_output=True, text=True, env=env, timeout=60)
  assert f"run {run_id} ended with exit status 0: nothing to resume" in result.stdout
  assert len(_attempts(home)) == 2


def test_a_run_is_alive_only_in_the_boot_that_started_it(tmp_path):
  """After a restart, a recorded pid may be another process's: a run is going
  only if its shell lives and it was started in this boot (or recorded none,
  as a run started by an earlier worker.sh)."""
  logs = tmp_path / "bertjax-logs"
  logs.mkdir()
  shell = subprocess.Popen(["sleep", "60"])
  try:
    (logs / "r1.pid").write_text(f"{shell.pid}\n")
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("boot-2\n")
    env = _clean_env({"HOME": str(tmp_path), "BERTJAX_BOOT_ID_FILE": str(boot_id)})

    def state():
      return subprocess.run(["bash", os.path.join(ROOT, "launch", "worker.sh"), "state", "r1"],
                            capture_output=True, text=True, env=env, timeout=30).stdout.strip()

    assert state() == f"{HOST}: running"  # no boot recorded
    (logs / "r1.boot").write_text("boot-2\n")
    assert state() == f"{HOST}: running"
    (logs / "r1.boot").write_text("boot-1\n")
    assert state() == f"{HOST}: ended without an exit status"
  finally:
    shell.kill()
    shell.wait()


def test_stop_signals_the_run_on_every_worker_and_waits():
  ssh = dry_run("stop.sh", *SETTINGS, "--timeout", "30")[0]
  assert ssh[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert", "--worker=all"]
  command = next(a for a in ssh if a.startswith("--command=")).split("=", 1)[1]
  assert command.startswith("touch ~/bertjax.stop;")
  assert "pkill -TERM -f 'python[0-9.]* -m [b]ertjax[.]main'" in command
  assert "seq 30" in command
  assert "pkill -KILL" in " ".join(dry_run("stop.sh", *SETTINGS, "--kill")[0])


def test_stop_runs_its_worker_command_to_a_clean_exit(tmp_path):
  """The worker command itself, run here by the stand-in gcloud: it signals a
  process that looks like a run started by hand, which saves and exits 143,
  and returns when it is gone. pkill and pgrep are held to that process's
  group, so no other process of this machine is touched."""
  saved = tmp_path / "saved"
  worker = subprocess.Popen(
      ["bash", "-c", f'exec -a "python3 -m bertjax.main --config=x" {sys.executable} -c '
       f'"import signal, sys, time\n'
       f'signal.signal(signal.SIGTERM, lambda *_: (open(\'{saved}\', \'w\').write(\'step 7\'), '
       f'sys.exit(143)))\ntime.sleep(60)"'], start_new_session=True)
  env = _gcloud_stub(tmp_path, 'case "$*" in *"tpu-vm ssh"*) remote "$@" ;; esac')
  _limit_to_group(tmp_path, worker.pid)
  _wait_for(lambda: b"bertjax.main" in open(f"/proc/{worker.pid}/cmdline", "rb").read())
  time.sleep(0.5)  # the handler is installed
  result = _script("stop.sh", "--timeout=30", env=env, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith(": stopped")
  assert worker.wait(timeout=10) == 143 and saved.read_text() == "step 7"
  assert (tmp_path / "bertjax.stop").exists()  # run.sh will not restart it
  # Nothing left to stop: said, and not an error.
  result = _script("stop.sh", env=env, cwd=tmp_path)
  assert result.returncode == 0 and result.stdout.strip().endswith(": no bertjax run")


@pytest.mark.parametrize("queued", [False, True])
def test_delete_when_done_deletes_the_slice_after_success_only(tmp_path, queued):
  """--delete-when-done: the TPU (its queued resource, when it has one) goes
  once the run succeeded; a run that failed leaves it for a look or a rerun."""
  body = """case "$*" in
  *"queued-resources describe"*) %s ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""" % ("echo bert" if queued else _NOT_FOUND["queued-resources"])
  result, calls = _run_with_stub(tmp_path, body, "echo done", "--delete-when-done",
                                 restarts=0)
  assert result.returncode == 0, result.stderr
  assert calls[-1] == ("queued-resources delete" if queued else "tpu-vm delete")
  assert "run.sh: run demo succeeded; deleted bert (--delete-when-done)" in result.stderr
  failed = tmp_path / "failed"
  failed.mkdir()
  result, calls = _run_with_stub(failed, body, "exit 1", "--delete-when-done", restarts=0)
  assert result.returncode == 1
  assert not [call for call in calls if call.endswith("delete")]


def test_setup_refuses_while_a_run_goes_on(tmp_path):
  """Setting up replaces ~/bertjax and ~/bertjax-venv: not under a live run."""
  _worker_home(tmp_path, "sleep 60")
  env = _gcloud_stub(tmp_path, 'case "$*" in *"tpu-vm ssh"*) remote "$@" ;; esac')
  started = _script("run.sh", "--config=configs/demo.py", "--workdir=gs://bucket/run",
                    "--run-id=live", "--detach", env=env, cwd=tmp_path)
  assert started.returncode == 0, started.stderr
  run = int((tmp_path / "bertjax-logs" / "live.pid").read_text())
  try:
    result = _script("setup.sh", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"setup.sh: {HOST}: run live is still going: setup would replace its code and "
        "Python; stop it first (launch/stop.sh) or wait for it to end (launch/logs.sh "
        "--follow)")
    assert "tpu-vm scp" not in _calls(tmp_path) and (tmp_path / "bertjax-venv").exists()
  finally:
    os.killpg(run, signal.SIGKILL)


def test_a_detached_supervisor_restarts_the_run_with_nobody_watching(tmp_path):
  """--detach with --restarts: run.sh returns at once and goes on in a
  session of its own, with its own log; the terminal it was started from
  goes (SIGHUP to its whole group), and it still reruns the run that failed."""
  _worker_home(tmp_path, _FIRST_RUN_FAILS)
  env = _gcloud_stub(tmp_path, """case "$*" in
  *"tpu-vm describe"*) echo READY ;;
  *"tpu-vm ssh"*) remote "$@" ;;
esac""")
  launcher = subprocess.Popen(
      ["bash", os.path.join(ROOT, "launch", "run.sh"), *SETTINGS, "--config=configs/demo.py",
       "--workdir=gs://bucket/run", "--run-id=demo", "--restarts=2", "--detach"],
      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  _, stderr = launcher.communicate(timeout=60)
  assert launcher.returncode == 0, stderr
  log = tmp_path / ".bertjax" / "launch" / "bert-demo.log"
  assert "supervising run demo of bert in the background (pid" in stderr and str(log) in stderr
  try:
    os.killpg(launcher.pid, signal.SIGHUP)  # the terminal goes
  except ProcessLookupError:
    pass
  logs = tmp_path / "bertjax-logs"
  _wait_for(lambda: (logs / "demo-1.status").exists(), timeout=60)
  assert (logs / "demo.status").read_text() == "143\n"
  assert (logs / "demo-1.status").read_text() == "0\n"
  _wait_for(lambda: "run.sh: the run failed (143); the TPU is READY" in log.read_text())


# The stand-in gcloud's `storage` verbs (ls, cat, cp), on the GCS API server
# of the `gcs` fixture through gcsfs.
_STORAGE = """
import os, sys
import fsspec
fs = fsspec.filesystem("gs")
verb, *args = sys.argv[1:]
if verb == "ls":
  for entry in sorted(fs.ls(args[0].rstrip("/"), detail=True), key=lambda e: e["name"]):
    print("gs://" + entry["name"] + ("/" if entry["type"] == "directory" else ""))
elif verb == "cat":
  for path in sorted(fs.glob(args[0])):
    sys.stdout.buffer.write(fs.cat_file(path))
elif verb == "cp":
  for path in sorted(fs.glob(args[0])):
    fs.get_file(path, os.path.join(args[1], os.path.basename(path)))
"""


def test_a_runs_logs_outlive_the_slice_in_its_workdir(tmp_path, gcs):
  """Each worker copies its log into the workdir as it is written, with how
  the run ended; once the workers' disks are gone, logs.sh --workdir reads both."""
  import json

  workdir = gcs.url_of("launch/run")
  storage = tmp_path / "storage.py"
  storage.write_text(_STORAGE)
  _worker_home(tmp_path, 'for i in 1 2 3; do echo "step $i/3  loss 1.0"; sleep 0.3; done\n'
               'echo "error: train.batch_size=7 does not divide over the 8 devices" >&2; exit 2',
               ship_logs=True)
  env = _gcloud_stub(tmp_path, f"""case "$*" in
  *"tpu-vm ssh"*) remote "$@" ;;
  "storage "*) shift; {sys.executable} {storage} "$@" ;;
esac""")
  result = _script("run.sh", "--config=configs/demo.py", f"--workdir={workdir}",
                   "--run-id=r1", env=env, cwd=tmp_path)
  assert result.returncode == 2, result.stderr
  ended = f"launch/run/logs/r1/{HOST}.json"
  _wait_for(lambda: os.path.exists(gcs.local_path(gcs.url_of(ended))), timeout=60)
  shutil.rmtree(tmp_path / "bertjax-logs")  # the slice is gone, and its disks
  result = _script("logs.sh", f"--workdir={workdir}", "--ended", env=env, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  record = json.loads(result.stdout)
  assert record["host"] == HOST and record["exit_status"] == 2 and record["last_step"] == 3
  assert record["reason"] == "error: train.batch_size=7 does not divide over the 8 devices"
  result = _script("logs.sh", f"--workdir={workdir}", "--fetch", "fetched", env=env,
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  log = (tmp_path / "fetched" / f"{HOST}.log").read_text()
  assert "step 3/3" in log and "ended" in log and "with exit status 2" in log


# ... killed as it writes a line: the log's last line is cut.
_CUT_RUN = _RESUMABLE_RUN.replace('echo "saved at step $i"', 'printf "step $i  lo"')


def test_a_log_cut_mid_line_by_a_stop_goes_on_in_whole_lines(tmp_path):
  """The run is stopped while it writes a line, and worker.sh starts it again
  on this host: the cut line is kept and worker.sh's own lines start lines of
  their own."""
  _worker_home(tmp_path, _CUT_RUN)
  env = _gcloud_stub(tmp_path, 'case "$*" in *"tpu-vm ssh"*) remote "$@" ;; esac')
  logs, run_id = _start_detached(tmp_path, env)
  os.kill(int((tmp_path / "python.pid").read_text()), signal.SIGTERM)
  _wait_for(lambda: (logs / f"{run_id}.status").exists(), timeout=60)
  lines = (logs / f"{run_id}.log").read_text().splitlines()
  cut = [i for i, line in enumerate(lines) if line.endswith("  lo")]
  assert len(cut) == 1 and lines[cut[0] + 1].startswith("worker.sh: run "), lines
  assert all(line.startswith(("worker.sh: ", "step ")) for line in lines), lines


def test_a_log_cut_mid_line_as_the_host_went_down_resumes_on_a_line_of_its_own(tmp_path):
  _, boot_id, env, logs, run_id = _host_gone_down(tmp_path, _CUT_RUN)
  log = logs / f"{run_id}.log"
  with open(log, "a") as f:  # the shell went down before it could end the line
    f.write("step 9  lo")
  boot_id.write_text("boot-2\n")
  result = subprocess.run([os.path.join(ROOT, "launch", "startup.sh")], capture_output=True,
                          text=True, env=env, timeout=60)
  assert result.returncode == 0, result.stderr
  _wait_for(lambda: (logs / f"{run_id}.status").exists(), timeout=60)
  lines = log.read_text().splitlines()
  assert "step 9  lo" in lines, lines
  after = lines[lines.index("step 9  lo") + 1]
  assert after.startswith("worker.sh: ") and "started again" in after, lines
