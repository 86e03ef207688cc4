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
  sys.stderr.write("test: finalising a save\\n"); sys.stderr.flush()  # not split by a signal
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
      "train.total_steps": resumes + 5, "eval.every_steps": 0,
      "optimizer.warmup_steps": min(20, resumes)}), cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"at step {resumes}" in result.stderr
  assert _saved_steps(workdir)[-1] == resumes + 5


def test_on_two_hosts_process_0_decides_and_both_exit_at_once(prepared_dir, tmp_path):
  """A SIGTERM to one host reaches both through JAX's preemption sync point;
  process 0's measured saves and clock decide for both, which exit 143 at
  once, neither waiting for the other in a collective."""
  from tests.tasks.test_pretrain import _free_port

  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{
      "train.total_steps": 1_000_000, "checkpoint.every_steps": 1_000_000,
      "checkpoint.every_seconds": EVERY_S, "eval.every_steps": 0})
  port = _free_port()
  logs = [str(tmp_path / f"log{i}") for i in range(2)]
  processes = [subprocess.Popen(
      [sys.executable, "-c", _SLOW_SAVES, *args[3:], f"--grace_seconds={GRACE_S}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=ROOT, env={**_env(devices=2), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"},
      stdout=subprocess.DEVNULL, stderr=open(logs[i], "w")) for i in range(2)]
  try:
    deadline = time.time() + 300
    while "test: finalising a save" not in open(logs[0]).read():
      assert all(p.poll() is None for p in processes) and time.time() < deadline, (
          open(logs[0]).read()[-3000:])
      time.sleep(0.1)
    time.sleep(SAVE_S + 3)
    signalled = time.monotonic()
    processes[0].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=GRACE_S) for p in processes]
    took = time.monotonic() - signalled
  finally:
    for p in processes:
      p.kill()
  outputs = [open(log).read() for log in logs]
  assert codes == [143, 143], outputs[0][-3000:] + outputs[1][-3000:]
  assert took < GRACE_S - 3, took
  said = [re.search(r"Preempted at step (\d+) without saving: a restart resumes from step "
                    r"(\d+)", output) for output in outputs]
  assert all(said), outputs[1][-3000:]
  assert said[0].groups() == said[1].groups()  # the same step, the same resume point
  assert _saved_steps(workdir)[-1] == int(said[0].group(2))
