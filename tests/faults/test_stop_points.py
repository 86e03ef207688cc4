"""Stops that land outside a training step: during an evaluation, and before
the run's first step (restoring, starting the input, compiling).

Real runs of `python -m bertjax.main` (the tiny model of tests/tasks/test_pretrain.py),
with the evaluation or the compile slowed by a patch so that a signal lands
inside it.
"""

import os
import signal
import sys
import time

import pytest

from tests.faults.test_training import _RUN, _start, _tiny, _wait_for_step
from tests.tasks.test_pretrain import _env, _losses, _run, _saved_steps

# Each evaluation batch takes half a second longer (and says so).
_SLOW_EVALUATION = """
import sys, time
from bertjax import main
from bertjax.tasks import pretrain
jit_steps = pretrain.train.jit_steps
def slowed(*args, **kwargs):
  train_step, eval_step = jit_steps(*args, **kwargs)
  def slow_eval_step(*inputs):
    sys.stderr.write("test: evaluating\\n"); sys.stderr.flush()  # not split by a signal
    time.sleep(0.5)
    return eval_step(*inputs)
  return train_step, slow_eval_step
pretrain.train.jit_steps = slowed
""" + _RUN

# Each compile of the step takes two seconds longer (and says so).
_SLOW_COMPILE = """
import sys, time
from bertjax import main
from bertjax.tasks import pretrain
compile_step = pretrain._Trainer._compile
def slow_compile(self, *args, **kwargs):
  sys.stderr.write("test: compiling\\n"); sys.stderr.flush()  # not split by a signal
  time.sleep(2)
  return compile_step(self, *args, **kwargs)
pretrain._Trainer._compile = slow_compile
""" + _RUN


def _stopped_when(program, args, tmp_path, says, signum, timeout=300):
  """Runs `program` with the run's flags, sends `signum` once its stderr
  `says` so, and checks it ended by that signal at once, with no traceback.
  Returns its stderr."""
  log_path = str(tmp_path / "log")
  process, log = _start([sys.executable, "-c", program, *args[3:]], log_path)
  deadline = time.time() + timeout
  while says not in open(log_path).read():
    assert process.poll() is None and time.time() < deadline, open(log_path).read()[-3000:]
    time.sleep(0.02)
  process.send_signal(signum)
  sent = time.time()
  process.wait(timeout=timeout)
  log.close()
  stderr = open(log_path).read()
  assert process.returncode == 128 + signum, stderr[-3000:]
  assert time.time() - sent < 10, stderr[-3000:]  # not the program's slowed work
  assert "Traceback" not in stderr, stderr[-3000:]
  return stderr


def _evaluations(workdir):
  import json

  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line)["step"] for line in f if '"eval/' in line]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_an_evaluation_ends_it_and_saves_its_step(prepared_dir, tmp_path,
                                                                 signum):
  """A preemption notice (or Ctrl-C) during a long evaluation does not wait
  for its end, which could take the grace the save needs: the evaluation
  stops at its next batch, unrecorded, and the step it evaluated is saved."""
  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 400, "eval.every_steps": 30,
                                         "eval.batches": 40, "checkpoint.every_steps": 1000})
  stderr = _stopped_when(_SLOW_EVALUATION, args, tmp_path, "test: evaluating", signum)
  name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
  assert f"{name} during the evaluation at step 30: it stopped after " in stderr
  assert "checkpoint saved at step 30; rerun the same command to resume" in stderr
  assert _saved_steps(workdir) == [30]
  assert max(_losses(workdir)) == 30 and _evaluations(workdir) == []
  # The rerun goes on from step 30 and evaluates at its next evaluation step.
  _run(_tiny(workdir, prepared_dir, **{"train.total_steps": 60, "eval.every_steps": 30,
                                       "eval.batches": 2}), _env())
  losses = _losses(workdir)
  assert all(len(losses[s]) == 1 for s in range(1, 61))
  assert _evaluations(workdir) == [60]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_before_the_first_step_ends_the_run_at_once(prepared_dir, tmp_path, signum):
  """A stop while a resumed run compiles (nothing of its own trained yet)
  ends it there, as any command ends: no step is trained to be saved, the
  checkpoints are as they were, and the rerun goes on from them."""
  workdir = str(tmp_path / "run")
  _run(_tiny(workdir, prepared_dir, **{"train.total_steps": 20, "optimizer.warmup_steps": 5}),
       _env())
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 40, "optimizer.warmup_steps": 5})
  stderr = _stopped_when(_SLOW_COMPILE, args, tmp_path, "test: compiling", signum)
  name = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}[signum]
  errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
  assert errors == [f"error: interrupted ({name}): finished checkpoints and data are kept: "
                    "rerun the same command to resume"], stderr[-3000:]
  assert "Interrupted:" not in stderr and "Aborted:" not in stderr
  assert _saved_steps(workdir) == [10, 20] and max(_losses(workdir)) == 20
  _run(args, _env())
  losses = _losses(workdir)
  assert all(len(losses[s]) == 1 for s in range(1, 41))
  assert _saved_steps(workdir)[-1] == 40
