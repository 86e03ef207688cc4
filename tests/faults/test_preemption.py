"""A preemption within the grace really given (bertjax.preemption): saves by
the wall clock, and SIGTERM with too little time left to save.

The run's saves are made slow (their finalisation, the part orbax runs in the
background before it commits a step, sleeps), as a BERT-large save to Cloud
Storage is against GKE's 15 s spot grace.
"""

import os
import re
import signal
import subprocess
import sys
import time

from tests.faults.test_training import _start, _tiny, _wait_for_step
from tests.tasks.test_pretrain import ROOT, _env, _saved_steps

SAVE_S, EVERY_S, GRACE_S = 18, 25, 15
_SLOW_SAVES = f"""
import sys, time
import orbax.checkpoint as ocp
from bertjax import main
finalize = ocp.CheckpointManager._finalize
def slow_finalize(self, *args, **kwargs):
  print("test: finalising a save", file=sys.stderr, flush=True)
  time.sleep({SAVE_S})
  return finalize(self, *args, **kwargs)
ocp.CheckpointManager._finalize = slow_finalize
main.run()
"""


def test_sigterm_with_a_short_grace_exits_at_once_and_loses_at_most_the_interval(
    prepared_dir, tmp_path):
  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{
      "train.total_steps": 1_000_000, "checkpoint.every_steps": 1_000_000,
      "checkpoint.every_seconds": EVERY_S, "eval.every_steps": 0})
  log_path = str(tmp_path / "log")
  process, log = _start([sys.executable, "-c", _SLOW_SAVES, *args[3:],
                         f"--grace_seconds={GRACE_S}"], log_path)
  try:
    _wait_for_step(process, workdir, 5)
    deadline = time.time() + 300
    while "test: finalising a save" not in open(log_path).read():  # the first, by the clock
      assert process.poll() is None and time.time() < deadline, open(log_path).read()[-3000:]
      time.sleep(0.1)
    time.sleep(SAVE_S + 3)  # finished, and measured by the run
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
      code = process.wait(timeout=GRACE_S)  # then the machine would kill it
    except subprocess.TimeoutExpired:
      process.kill()
      raise AssertionError(f"still running {GRACE_S} s after SIGTERM")
    took = time.monotonic() - signalled
  finally:
    process.kill()
    log.close()
  stderr = open(log_path).read()
  assert code == 143, stderr[-3000:]
  assert took < GRACE_S - 5, took
  assert re.search(rf"SIGTERM at step \d+: a save takes about {SAVE_S} s, more than the "
                   rf"\d+ s grace leaves \(--grace_seconds={GRACE_S}\): not saving", stderr)
  said = re.search(r"Preempted at step (\d+) without saving: a restart resumes from step "
                   r"(\d+), \d+ steps back, whose save started (\d+) s before this stop",
                   stderr)
  assert said, stderr[-3000:]
  stopped, resumes, age = map(int, said.groups())
  # What is lost: at most the interval, plus the save in flight's time.
  assert age <= EVERY_S + SAVE_S + 5, age
  assert _saved_steps(workdir)[-1] == resumes < stopped
  assert resumes % 1_000_000  # saved by the clock, not by steps
  # No step half-written is taken for a finished one: the rerun resumes there.
  result = subprocess.run(_tiny(workdir, prepared_dir, **{
      "train.total_steps": resumes + 5, "eval.every_steps": 0}), cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"at step {resumes}" in result.stderr
  assert _saved_steps(workdir)[-1] == resumes + 5
