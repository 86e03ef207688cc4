"""A save failed by storage that does not answer (bertjax.outage): the run waits
for the storage, saves again at the next step and ends as an uninterrupted run;
storage that stays away ends the run with exit status 42, in one line.

The clients' own retries hide a short outage (tests/tasks/test_gcs_runs.py
stops a real server for two minutes); here the checkpointer's save fails as
theirs does once they give up, injected into the real run with a patch, and
the storage's answer to the run's probe is what the test says it is.
"""

import subprocess
import sys

from tests.faults.test_training import _tiny
from tests.tasks.test_pretrain import ROOT, _env, _losses, _run, _saved_steps

_OUTAGE = """
import sys
from bertjax import checkpoint, files, main, outage
outage.FIRST_PAUSE_S = 0.2
FAILED_SAVES, FAILED_PROBES = {saves}, {probes}
save, exists = checkpoint.Checkpointer.save, files.exists
calls = {{"save": 0, "probe": 0}}
def failing_save(self, step, *args, **kwargs):
  if step >= 20 and calls["save"] < FAILED_SAVES:
    calls["save"] += 1
    self.wait()  # as a save does before it starts: the one before has finished
    try:
      raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 443)")
    except OSError as e:
      raise checkpoint.CheckpointSaveError(f"saving step {{step}} failed") from e
  return save(self, step, *args, **kwargs)
def probe(path):
  if "checkpoints" in path and calls["probe"] < FAILED_PROBES:
    calls["probe"] += 1
    raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 443)")
  return exists(path)
checkpoint.Checkpointer.save = failing_save
files.exists = probe
main.run()
"""


def _run_with_outage(args, saves, probes):
  return subprocess.run([sys.executable, "-c", _OUTAGE.format(saves=saves, probes=probes),
                         *args[3:]], cwd=ROOT, env=_env(), capture_output=True, text=True,
                        timeout=600)


def test_a_save_the_storage_failed_is_made_again_once_it_answers(prepared_dir, tmp_path):
  settings = {"train.total_steps": 40, "eval.every_steps": 0}
  reference = str(tmp_path / "reference")
  _run(_tiny(reference, prepared_dir, **settings), _env())
  workdir = str(tmp_path / "run")
  result = _run_with_outage(_tiny(workdir, prepared_dir, **settings), saves=1, probes=3)
  assert result.returncode == 0, result.stderr[-3000:]
  for text in ("checkpoints does not answer (ConnectionRefusedError",
               "waiting up to 900 s for it (--storage_wait_s)", "answers again after",
               "The checkpoint of step 20 was not saved: saving the next step"):
    assert text in result.stderr, text
  assert _saved_steps(workdir) == [21, 30, 40]  # step 20's save made at step 21 (3 kept)
  expected = {step: values[0] for step, values in _losses(reference).items()}
  assert _losses(workdir) == {step: [expected[step]] for step in range(1, 41)}


def test_storage_that_stays_away_ends_the_run_with_42_and_the_rerun_resumes(prepared_dir,
                                                                           tmp_path):
  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 40, "eval.every_steps": 0})
  result = _run_with_outage(args + ["--storage_wait_s=2"], saves=1, probes=1000)
  assert result.returncode == 42, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {workdir}/checkpoints did not answer for ") and (
      "a restart resumes from step 10 once it answers" in last), last
  assert "Traceback" not in result.stderr
  assert _saved_steps(workdir) == [10]
  _run(args, _env())  # the storage back: the rerun resumes from step 10 and ends
  assert _saved_steps(workdir)[-1] == 40
