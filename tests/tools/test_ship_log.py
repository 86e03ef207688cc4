"""A run's log copied into its workdir as it grows, and how the run ended
(bertjax.tools.ship_log): against a real GCS API server (fake-gcs-server)."""

import json
import signal
import subprocess
import sys
import time

from bertjax import files
from bertjax.tools import ship_log

_WRITER = """
import sys, time
with open(sys.argv[1], "a") as log:
  for step in range(1, 11):
    log.write(f"step {step}/10  loss 1.0\\n"); log.flush(); time.sleep(0.1)
  log.write("error: the loss diverged: ...\\n")
open(sys.argv[2], "w").write("2\\n")
"""


def test_the_log_follows_the_run_into_the_workdir_and_says_how_it_ended(gcs, tmp_path):
  log, status = tmp_path / "run.log", tmp_path / "run.status"
  writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(log), str(status)])
  to = gcs.url_of("runs/demo/logs/r1/host-0")
  record = ship_log.ship(str(log), to, writer.pid, str(status), every_s=0.2)
  writer.wait()
  assert files.read_bytes(f"{to}.log") == log.read_bytes()
  stored = json.loads(files.read_text(f"{to}.json"))
  assert stored == record
  assert stored["exit_status"] == 2 and stored["last_step"] == 10
  assert stored["reason"] == "error: the loss diverged: ..."


def test_how_a_run_ended_is_read_from_its_status_and_log():
  tail = "step 7/100 loss 2\nstep 8/100 loss 2\nTraceback ...\nKeyError: 'x'\n"
  assert ship_log.ending(tail, 1) == {"exit_status": 1, "last_step": 8, "total_steps": 100,
                                      "reason": "failed (exit 1): KeyError: 'x'"}
  assert ship_log.ending(tail, 143)["reason"].startswith("stopped to be resumed")
  assert ship_log.ending("", 0) == {"exit_status": 0, "last_step": None, "total_steps": None,
                                    "reason": "finished"}
  assert ship_log.ending(tail, None)["reason"].startswith("ended without an exit status")


def test_a_host_going_down_keeps_what_was_copied_and_a_resumed_copy_goes_on(gcs, tmp_path):
  """SIGTERM (the host shutting down): the copier sends what it has and stops
  without saying the run ended. After the restart the run appends to its log,
  and the next copier goes on from what the workdir holds: no line twice."""
  log = tmp_path / "run.log"
  log.write_text("step 1/10  loss 3.0\nstep 2/10  loss 2.9\n")
  to = gcs.url_of("runs/demo/logs/r2/host-0")
  runner = subprocess.Popen(["sleep", "60"])
  copier = subprocess.Popen(
      [sys.executable, "-m", "bertjax.tools.ship_log", f"--log={log}", f"--to={to}",
       f"--until_pid={runner.pid}", "--every_s=60"], cwd=tmp_path)
  time.sleep(3)  # started, and the two lines read (sent at the latest on stopping)
  copier.send_signal(signal.SIGTERM)
  assert copier.wait(timeout=60) == 0
  runner.kill()
  runner.wait()
  assert files.read_bytes(f"{to}.log") == log.read_bytes()
  assert not files.exists(f"{to}.json")
  with open(log, "a") as f:  # the run resumed, after the restart
    f.write("worker.sh: resuming run r1\nstep 3/10  loss 2.8\n")
  record = ship_log.ship(str(log), to, runner.pid, None, every_s=0.2)
  assert files.read_bytes(f"{to}.log") == log.read_bytes()
  assert record["last_step"] == 3


def test_a_copy_cut_mid_line_goes_on_whole(gcs, tmp_path):
  """A copier stopped mid-line (its host went down as the run wrote): after the
  restart the same log is copied on from there and the line is made whole,
  with nothing twice."""
  log = tmp_path / "run.log"
  log.write_text("step 1/10  loss 3.0\nstep 2/10  lo")
  to = gcs.url_of("runs/demo/logs/r3/host-0")
  files.write_bytes(f"{to}.log", log.read_bytes())  # what the first copier sent
  with open(log, "a") as f:
    f.write("ss 2.9\nstep 3/10  loss 2.8\n")
  finished = subprocess.Popen(["true"])
  finished.wait()
  record = ship_log.ship(str(log), to, finished.pid, None, every_s=0.2)
  assert files.read_bytes(f"{to}.log") == log.read_bytes()
  assert record["last_step"] == 3


def test_a_new_log_after_a_copy_of_another_cut_mid_line_starts_a_line(gcs, tmp_path):
  """The host came back with a new disk: its log is a new one, as long as the
  old copy or longer, which ends in part of a line. The old copy's lines are
  kept, and the new log's first line is a line of its own (not glued to the
  cut one, nor taken for a continuation because it is longer)."""
  to = gcs.url_of("runs/demo/logs/r4/host-0")
  old = b"step 1/10  loss 3.0\nstep 2/1"
  files.write_bytes(f"{to}.log", old)
  log = tmp_path / "run.log"
  log.write_bytes(b"worker.sh: host-0 started again\nstep 3/10  loss 2.8\n")
  finished = subprocess.Popen(["true"])
  finished.wait()
  record = ship_log.ship(str(log), to, finished.pid, None, every_s=0.2)
  assert files.read_bytes(f"{to}.log") == old + b"\n" + log.read_bytes()
  assert record["last_step"] == 3


def test_a_cut_last_line_does_not_give_a_cut_step_count():
  assert ship_log.ending("step 7/100 loss 2\nstep 8/1", None)["total_steps"] == 100
  assert ship_log.ending("step 7/100 loss 2\nstep 8/1", None)["last_step"] == 7
