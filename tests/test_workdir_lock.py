"""One run per workdir (bertjax.workdir_lock): on a local disk and on gs://.

The holders are real processes: a second one is refused naming the first, a
lock whose holder died or went silent is taken over, and a holder whose lock
was taken over stops without writing.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from unittest import mock

import pytest

from bertjax import errors, workdir_lock

_HOLD = """
import sys, time
from bertjax import workdir_lock
workdir_lock.HEARTBEAT_S = float(sys.argv[2])
with workdir_lock.hold(sys.argv[1]):
  print("holding", flush=True)
  time.sleep(float(sys.argv[3]))
print("released", flush=True)
"""


def _holder(workdir, heartbeat_s=30.0, seconds=60.0, env=None):
  """A process holding the workdir's lock; returns once it holds it."""
  process = subprocess.Popen([sys.executable, "-c", _HOLD, workdir, str(heartbeat_s),
                              str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, **(env or {})})
  assert process.stdout.readline().strip() == "holding", process.stderr.read()
  return process


def test_a_second_run_is_refused_naming_the_holder_and_a_dead_holder_frees_it(tmp_path):
  workdir = str(tmp_path / "run")
  first = _holder(workdir)
  try:
    with pytest.raises(errors.WorkdirBusyError) as error:
      with workdir_lock.hold(workdir):
        pass
    message = str(error.value)
    assert f"{workdir} is in use by process {first.pid} on {socket.gethostname()}" in message
    assert "give another --workdir" in message
  finally:
    first.kill()  # kill -9: no release of its own; the OS drops the lock with the process
    first.wait()
  with workdir_lock.hold(workdir):
    assert json.load(open(os.path.join(workdir, workdir_lock.LOCK_FILE)))["pid"] == os.getpid()
  assert not os.path.exists(os.path.join(workdir, workdir_lock.LOCK_FILE))  # released


def test_two_runs_started_together_on_one_workdir_one_runs_one_is_refused(prepared_dir,
                                                                         tmp_path):
  from tests.faults.test_training import _tiny
  from tests.tasks.test_pretrain import ROOT, _env, _losses

  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 30})
  processes = [subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outcomes = sorted((p.wait(timeout=600), p.stderr.read()) for p in processes)
  (ran, ran_log), (refused, refused_log) = outcomes
  assert ran == 0, ran_log[-3000:]
  assert refused == 2, refused_log[-3000:]
  assert refused_log.strip().splitlines()[-1].startswith(f"error: {workdir} is in use by")
  assert sorted(_losses(workdir)) == list(range(1, 31))  # each step logged once
  assert all(len(v) == 1 for v in _losses(workdir).values())


def test_on_gcs_a_live_lock_refuses_and_a_stale_or_dead_one_is_taken_over(gcs, absl_caplog):
  from google.cloud import storage

  workdir = gcs.url_of("locks/run")
  bucket = storage.Client().bucket(workdir.split("/")[2])
  blob = lambda: bucket.blob("locks/run/run.lock")  # noqa: E731  (no generation pinned)
  first = _holder(workdir, heartbeat_s=0.3, env=gcs.env)
  try:
    beats = json.loads(blob().download_as_bytes())["heartbeat"]
    time.sleep(1.0)
    assert json.loads(blob().download_as_bytes())["heartbeat"] > beats  # renewed
    with pytest.raises(errors.WorkdirBusyError, match=f"in use by process {first.pid} on "):
      with workdir_lock.hold(workdir):
        pass
  finally:
    first.kill()
    first.wait()
  # Killed, on this host: its process is gone, so the lock is taken at once.
  with workdir_lock.hold(workdir):
    assert json.loads(blob().download_as_bytes())["pid"] == os.getpid()
  assert "its process has ended" in absl_caplog.text
  # A holder elsewhere that went silent for longer than STALE_S.
  silent = {"host": "another-host", "pid": 1, "boot": "x", "process_start": "1",
            "command": "python -m bertjax.main", "since": time.time() - 7200,
            "heartbeat": time.time() - workdir_lock.STALE_S - 1}
  blob().upload_from_string(json.dumps(silent))
  with workdir_lock.hold(workdir):
    assert json.loads(blob().download_as_bytes())["pid"] == os.getpid()
  assert "not renewed for" in absl_caplog.text

def test_on_gcs_a_holder_heard_from_lately_is_watched_until_it_renews_or_goes_stale(
    gcs, absl_caplog, monkeypatch):
  """A holder elsewhere heard from a moment ago may be alive or just killed:
  it is watched for a heartbeat. One that stays silent is taken over once its
  lock is stale; one that renews is alive, and the run is refused."""
  from google.cloud import storage

  monkeypatch.setattr(workdir_lock, "STALE_S", 4.0)
  workdir = gcs.url_of("locks/watched")
  blob = storage.Client().bucket(workdir.split("/")[2]).blob("locks/watched/run.lock")
  silent = {"host": "another-host", "pid": 1, "since": time.time() - 60,
            "command": "python -m bertjax.main", "heartbeat": time.time(), "heartbeat_s": 0.5}
  blob.upload_from_string(json.dumps(silent))
  started = time.monotonic()
  with workdir_lock.hold(workdir):
    assert json.loads(blob.download_as_bytes())["pid"] == os.getpid()
  assert 3.0 < time.monotonic() - started < 30  # waited for staleness, no longer
  assert "watching whether it renews the lock" in absl_caplog.text
  assert "not renewed for 4 s" in absl_caplog.text
  first = _holder(workdir, heartbeat_s=0.5, env=gcs.env)
  try:
    with pytest.raises(errors.WorkdirBusyError, match=f"in use by process {first.pid} on "):
      with mock.patch.object(workdir_lock, "_gone_on_this_host", lambda holder: False):
        with workdir_lock.hold(workdir):  # as if from another host: it renews, so alive
          pass
  finally:
    first.kill()
    first.wait()


def test_on_gcs_the_next_attempt_of_a_workload_takes_the_lock_at_once(gcs, absl_caplog,
                                                                      monkeypatch):
  """GKE restarts a workload as a whole, its process 0 perhaps on another node:
  the lock of the workload's earlier attempt (still renewed by a pod in its
  grace period) is taken over at once, and that holder stops writing."""
  workdir = gcs.url_of("locks/workload")
  earlier = _holder(workdir, heartbeat_s=0.3, env={
      **gcs.env, "BERTJAX_WORKLOAD": "bert-large", "BERTJAX_RESTART_ATTEMPT": "0"})
  monkeypatch.setenv("BERTJAX_WORKLOAD", "bert-large")
  monkeypatch.setenv("BERTJAX_RESTART_ATTEMPT", "0")
  try:
    with mock.patch.object(workdir_lock, "_gone_on_this_host", lambda holder: False):
      with pytest.raises(errors.WorkdirBusyError, match="workload bert-large attempt 0"):
        with workdir_lock.hold(workdir):  # the same attempt: alive, not an earlier one
          pass
      monkeypatch.setenv("BERTJAX_RESTART_ATTEMPT", "1")
      started = time.monotonic()
      with workdir_lock.hold(workdir):
        assert time.monotonic() - started < 5
        assert "an earlier attempt of this workload" in absl_caplog.text
        assert earlier.wait(timeout=60) == workdir_lock.LOST_EXIT_CODE
    assert "was taken over by process" in earlier.stderr.read()
  finally:
    earlier.kill()
    earlier.wait()


@pytest.mark.parametrize("holder_attempt,caller_attempt", [
    ("0", None),  # an operator's shell (or kubectl exec) given the workload's variable
    (None, None),  # both started without an attempt (launch/xpk.sh passes none)
    (None, "1"),  # a holder that did not say which attempt it is
])
def test_on_gcs_the_workloads_name_without_both_attempts_takes_no_live_lock(
    gcs, monkeypatch, holder_attempt, caller_attempt):
  """Any process may carry the workload's name. Without an attempt number on
  both sides nothing says the holder is over: it is watched for a heartbeat
  as any holder is, and a live one (renewing) is refused, not taken over."""
  workdir = gcs.url_of(f"locks/shared-{holder_attempt}-{caller_attempt}")
  env = {**gcs.env, "BERTJAX_WORKLOAD": "bert-large"}
  if holder_attempt is not None:
    env["BERTJAX_RESTART_ATTEMPT"] = holder_attempt
  live = _holder(workdir, heartbeat_s=0.3, env=env)
  monkeypatch.setenv("BERTJAX_WORKLOAD", "bert-large")
  if caller_attempt is None:
    monkeypatch.delenv("BERTJAX_RESTART_ATTEMPT", raising=False)
  else:
    monkeypatch.setenv("BERTJAX_RESTART_ATTEMPT", caller_attempt)
  try:
    with mock.patch.object(workdir_lock, "_gone_on_this_host", lambda holder: False):
      with pytest.raises(errors.WorkdirBusyError,
                         match=f"in use by process {live.pid} on .*workload bert-large"):
        with workdir_lock.hold(workdir):
          pass
    assert live.poll() is None  # still holding, never told its lock was taken
  finally:
    live.kill()
    live.wait()


def test_on_gcs_storage_that_does_not_answer_is_waited_for(gcs, monkeypatch, absl_caplog):
  """The server down while the lock is taken: the run waits for it (and takes
  the lock once it answers), or gives up restartably (exit status 42)."""
  import threading

  from bertjax import outage

  workdir = gcs.url_of("locks/outage")
  monkeypatch.setattr(outage, "FIRST_PAUSE_S", 0.2)
  monkeypatch.setattr(workdir_lock, "REQUEST_RETRY_S", 1.0)
  gcs.stop()
  restart = threading.Timer(6.0, gcs.start)
  restart.start()
  try:
    with workdir_lock.hold(workdir):
      assert "does not answer" in absl_caplog.text and "answers again" in absl_caplog.text
  finally:
    restart.join()
  monkeypatch.setattr(outage, "WAIT_S", 3.0)
  gcs.stop()
  try:
    with pytest.raises(errors.StorageUnreachableError, match="did not answer for") as error:
      with workdir_lock.hold(workdir):
        pass
    assert errors.exit_status(error.value) == errors.RESTART_EXIT_CODE == 42
  finally:
    gcs.start()


def test_a_holder_whose_lock_was_taken_over_stops_without_writing(gcs):
  from google.cloud import storage

  workdir = gcs.url_of("locks/lost")
  first = _holder(workdir, heartbeat_s=0.3, env=gcs.env)
  blob = storage.Client().bucket(workdir.split("/")[2]).blob("locks/lost/run.lock")
  blob.upload_from_string(json.dumps({"host": "another-host", "pid": 7, "since": time.time(),
                                      "heartbeat": time.time(), "command": "a second run"}))
  try:
    code = first.wait(timeout=60)
  finally:
    first.kill()
  stderr = first.stderr.read()
  assert code == workdir_lock.LOST_EXIT_CODE, stderr
  assert "was taken over by process 7 on another-host" in stderr
  assert "released" not in first.stdout.read()  # it stopped where it was


def test_a_renewal_whose_answer_was_lost_keeps_the_lock(gcs):
  """A renewal that reached the server but whose answer was lost is retried
  with the generation it replaced, and refused: the lock read back is the
  run's own, so the run goes on (it does not stop as if taken over)."""
  from urllib.parse import parse_qs, urlsplit

  from tests.gcs import AnswerLosingProxy

  def renewal(method, path):  # an upload only if the lock's generation is the known one
    match = parse_qs(urlsplit(path).query).get("ifGenerationMatch", ["0"])[0]
    return method == "POST" and match != "0"

  proxy = AnswerLosingProxy(gcs.url, lose=renewal)
  workdir = gcs.url_of("locks/lost-answer")
  try:
    holder = _holder(workdir, heartbeat_s=0.3, seconds=4.0,
                     env={**gcs.env, "STORAGE_EMULATOR_HOST": proxy.url})
    code = holder.wait(timeout=60)
  finally:
    proxy.close()
  stderr = holder.stderr.read()
  assert proxy.lost, "no renewal's answer was lost"
  assert code == 0 and "released" in holder.stdout.read(), stderr
  assert "taken over" not in stderr


@pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0,
                    reason="needs root and unshare(1) to start a process in a PID namespace")
def test_on_gcs_a_holder_in_another_containers_pid_namespace_is_not_judged_by_its_pid(gcs):
  """Pods on a node's network share the node's host name, but each container
  numbers its processes itself: a live holder in another PID namespace (its
  pid there, 1 or so, is another process here) is not taken for one that
  ended; it is watched, and refused while it renews."""
  workdir = gcs.url_of("locks/namespaces")
  process = subprocess.Popen(
      ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c",
       _HOLD, workdir, "0.3", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, **gcs.env})
  try:
    assert process.stdout.readline().strip() == "holding", process.stderr.read()
    with pytest.raises(errors.WorkdirBusyError, match="in use by process"):
      with workdir_lock.hold(workdir):
        pass
    assert process.poll() is None  # still holding, never told its lock was taken
  finally:
    process.kill()
    process.wait()


def test_a_run_refused_by_the_lock_removes_none_of_the_holders_folders(tmp_path):
  """Two terminals on one new workdir: the one that loses the lock leaves the
  holder's folders, still empty, where they are."""
  from bertjax import files

  workdir = str(tmp_path / "new" / "run")
  with pytest.raises(errors.WorkdirBusyError):
    with files.removed_if_left_empty(workdir):  # the workdir was not there yet
      holder = _holder(workdir)
      try:
        os.makedirs(os.path.join(workdir, "checkpoints"))  # the holder's, empty so far
        with workdir_lock.hold(workdir), files.empty_folders_removed(workdir):
          pass
      finally:
        holder.kill()
        holder.wait()
  assert os.path.isdir(os.path.join(workdir, "checkpoints"))


def test_a_failed_run_removes_only_its_own_folders_beside_a_sibling_run(tmp_path):
  """Two runs started together into a new parent: the one that fails removes
  its own empty folders and leaves the parent and the other run's folders."""
  from bertjax import files

  first, second = str(tmp_path / "new" / "run1"), str(tmp_path / "new" / "run2")
  with pytest.raises(ValueError):
    with files.removed_if_left_empty(first):  # neither run's folder was there yet
      holder = _holder(second)  # the sibling, running
      try:
        os.makedirs(os.path.join(second, "checkpoints"))  # the sibling's, empty so far
        with workdir_lock.hold(first), files.empty_folders_removed(first):
          os.makedirs(os.path.join(first, "checkpoints", "0"))
          raise ValueError("the first run is refused")
      finally:
        holder.kill()
        holder.wait()
  assert os.listdir(tmp_path / "new") == ["run2"]
  assert os.path.isdir(os.path.join(second, "checkpoints"))
