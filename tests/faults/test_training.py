"""Faults in a pre-training run, each checked for "nothing lost, clear message".

Real runs of `python -m bertjax.main` (the tiny model of tests/tasks/test_pretrain.py)
are stopped by real signals, given damaged checkpoints and hostile settings; a
few faults that cannot be produced from outside (an error while a save is in
flight) are injected into the real code with a patch.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.tasks.finetuning import set_fields, tiny_pretrain_config
from tests.tasks.test_pretrain import ROOT, _args, _env, _losses, _run, _saved_steps


def _tiny(workdir, prepared_dir, **overrides):
  settings = {"train.total_steps": 60, "train.long_from_step": -1,
              "checkpoint.every_steps": 10, "eval.every_steps": 30, **overrides}
  return _args(workdir, prepared_dir, **settings)


def _error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("error: ")]


def _start(args, log_path, env=None, **kwargs):
  log = open(log_path, "w")
  return subprocess.Popen(args, cwd=ROOT, env=env or _env(), stdout=subprocess.DEVNULL,
                          stderr=log, **kwargs), log


def _wait_for_step(process, workdir, step, timeout=300):
  path = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + timeout
  while time.time() < deadline and process.poll() is None:
    if os.path.exists(path) and any(int(s) >= step for s in _losses(workdir)):
      return
    time.sleep(0.02)
  raise AssertionError(f"the run did not reach step {step}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_first_ctrl_c_saves_at_the_step_and_the_rerun_goes_on(prepared_dir, tmp_path, signum):
  """Ctrl-C, or the terminal closing (SIGHUP), stops a run as a person asks
  it to: saved at the step, whatever a preemption's grace would allow."""
  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 400})
  process, log = _start(args, str(tmp_path / "log"))
  _wait_for_step(process, workdir, 25)
  process.send_signal(signum)
  process.wait(timeout=300)
  log.close()
  stderr = open(tmp_path / "log").read()
  assert process.returncode == 128 + signum, stderr[-3000:]
  stopped = max(_losses(workdir))
  assert _saved_steps(workdir)[-1] == stopped, stderr[-3000:]  # saved where it stopped
  assert "Interrupted: checkpoint saved at step" in stderr
  assert not [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]
  result = _run(_tiny(workdir, prepared_dir, **{"train.total_steps": stopped + 10}), _env())
  losses = _losses(workdir)
  assert all(len(losses[s]) == 1 for s in range(1, stopped + 11))  # nothing ran twice
  # The finished run says what it made and what to do next.
  for text in ("Done: ", f"checkpoints/{stopped + 10}", "tensorboard --logdir",
               "bertjax.tools.convert --input=", "--config.init_checkpoint="):
    assert text in result.stderr, text


# Saves are made slow (their finalisation sleeps), so that a fault can land
# while one is in flight.
_SLOW_SAVES = """
import time
import orbax.checkpoint as ocp
from bertjax import main
from bertjax.tasks import pretrain
finalize = ocp.CheckpointManager._finalize
def slow_finalize(self, *args, **kwargs):
  import sys
  sys.stderr.write("test: finalising a save\\n"); sys.stderr.flush()  # not split by a signal
  time.sleep(3)
  return finalize(self, *args, **kwargs)
ocp.CheckpointManager._finalize = slow_finalize
"""
_RUN = "main.run()\n"
# ... and the step after step 20's save raises.
_ERROR_WHILE_SAVING = _SLOW_SAVES + """
report = pretrain._Trainer._report
def failing_report(self, step, *args, **kwargs):
  if step > 20:
    raise RuntimeError("injected failure after step 20")
  return report(self, step, *args, **kwargs)
pretrain._Trainer._report = failing_report
""" + _RUN


def test_second_ctrl_c_aborts_at_once_and_says_where_a_rerun_resumes(prepared_dir, tmp_path):
  """The first Ctrl-C starts the save of the current step; a second one, while
  it is written, abandons it: the rerun resumes from the last finished step."""
  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 400, "checkpoint.every_steps": 1000})
  log_path = str(tmp_path / "log")
  process, log = _start([sys.executable, "-c", _SLOW_SAVES + _RUN, *args[3:]], log_path)
  _wait_for_step(process, workdir, 25)
  process.send_signal(signal.SIGINT)
  deadline = time.time() + 60
  # The save starts at the next step boundary; wait until it is in flight.
  while "test: finalising a save" not in open(log_path).read() and time.time() < deadline:
    time.sleep(0.02)
  started = time.time()
  process.send_signal(signal.SIGINT)
  process.wait(timeout=300)
  log.close()
  stderr = open(log_path).read()
  assert process.returncode == 130, stderr[-3000:]
  assert time.time() - started < 2.5  # did not wait for the 3 s save
  assert "Traceback" not in stderr, stderr[-3000:]
  assert "error: interrupted" in stderr
  assert "is abandoned; a rerun resumes from step 0 (no finished checkpoint)" in stderr
  assert _saved_steps(workdir) == []
  _run(_tiny(workdir, prepared_dir, **{"train.total_steps": 30}), _env())
  assert _saved_steps(workdir) == [10, 20, 30]


# ... orbax's commit of the step (the rename that makes it a checkpoint) waits
# for the test's go, and the process takes 2 s to end once it has said what a
# rerun resumes from: whatever commits meanwhile is what a rerun finds.
_COMMIT_ON_GO = """
import os, sys, time
import orbax.checkpoint as ocp
from bertjax import main
base = ocp.path.atomicity.AtomicRenameTemporaryPath
finalize = base.finalize
async def held(self, *args, **kwargs):
  if self.get_final().name.isdigit():  # the step's commit (its items commit before it)
    sys.stderr.write("test: committing\\n"); sys.stderr.flush()  # not split by a signal
    while not os.path.exists(os.environ["TEST_GO"]):
      time.sleep(0.01)
  return await finalize(self, *args, **kwargs)
base.finalize = held
exit_at_once = os._exit
def slow_exit(code):
  time.sleep(2)
  exit_at_once(code)
os._exit = slow_exit
""" + _RUN


@pytest.mark.parametrize("go_first", [False, True])
def test_second_ctrl_c_as_a_save_commits_names_the_step_a_rerun_takes(
    prepared_dir, tmp_path, go_first):
  """The second Ctrl-C lands while orbax commits the save the first one
  started (the commit let go just before or just after it): the step the abort
  names is the newest step on disk once the process has ended, whatever the
  timing."""
  import re

  workdir = str(tmp_path / "run")
  go = str(tmp_path / "go")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 400,
                                         "checkpoint.every_steps": 1000})
  log_path = str(tmp_path / "log")
  process, log = _start([sys.executable, "-c", _COMMIT_ON_GO, *args[3:]], log_path,
                        env={**_env(), "TEST_GO": go})
  _wait_for_step(process, workdir, 25)
  process.send_signal(signal.SIGINT)
  deadline = time.time() + 120
  while "test: committing" not in open(log_path).read() and time.time() < deadline:
    time.sleep(0.02)
  if go_first:
    open(go, "w").close()
  process.send_signal(signal.SIGINT)
  if not go_first:
    open(go, "w").close()
  process.wait(timeout=300)
  log.close()
  stderr = open(log_path).read()
  assert process.returncode == 130, stderr[-3000:]
  assert "Traceback" not in stderr, stderr[-3000:]
  # (Let go first, the save may finish before the second Ctrl-C is taken.)
  named = re.findall(r"(?:Aborted: .*; a rerun resumes from step|Interrupted: checkpoint "
                     r"saved at step) (\d+)", stderr)
  assert named and int(named[0]) == max(_saved_steps(workdir), default=0), stderr[-3000:]
  assert int(named[0]) > 0  # the commit under way was waited for, not cut off


def test_an_error_while_a_save_is_in_flight_waits_for_the_save(prepared_dir, tmp_path):
  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir)
  result = subprocess.run([sys.executable, "-c", _ERROR_WHILE_SAVING, *args[3:]], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=600)
  assert result.returncode != 0
  assert "injected failure after step 20" in result.stderr
  assert "finishing the checkpoint of step 20 first" in result.stderr
  assert _saved_steps(workdir) == [10, 20]
  assert not [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]


@pytest.mark.parametrize("changes,message", [
    ({"checkpoint.max_to_keep": 0}, "checkpoint.max_to_keep=0: must be >= 1"),
    ({"eval.every_steps": 10, "eval.batches": 0}, "eval.batches=0: must be >= 1"),
    ({"data.eval_percent": -5.0}, r"data.eval_percent=-5.0: must be in \[0, 100\)"),
    ({"data.eval_percent": 100.0}, r"data.eval_percent=100.0: must be in \[0, 100\)"),
    ({"eval.every_steps": 10, "data.eval_percent": 0.0}, "holds no document out"),
])
def test_settings_that_lose_work_or_fail_later_are_refused_first(prepared_dir, changes,
                                                                 message):
  from bertjax.tasks import pretrain

  with pytest.raises(ValueError, match=message):
    pretrain.validate(tiny_pretrain_config(prepared_dir, **changes), 8)


def test_an_empty_evaluation_split_is_refused_before_training(prepared_dir, tmp_path):
  from bertjax.tasks import pretrain

  config = tiny_pretrain_config(prepared_dir, **{"eval.every_steps": 10, "data.eval_percent": 0.01})
  with pytest.raises(ValueError, match="leaves 0 in the eval split.*raise data.eval_percent"):
    pretrain.run(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "checkpoints")


@pytest.fixture(scope="module")
def finished_run(prepared_dir, tmp_path_factory):
  """A 30-step run with checkpoints at 10, 20 and 30."""
  from bertjax.tasks import pretrain

  workdir = str(tmp_path_factory.mktemp("finished"))
  pretrain.run(tiny_pretrain_config(prepared_dir), workdir)
  return workdir


def _copy(run, tmp_path):
  import shutil

  target = str(tmp_path / "copy")
  shutil.copytree(run, target)
  return target


def test_a_refused_rerun_leaves_the_config_and_the_run_as_they_were(finished_run,
                                                                    prepared_dir, tmp_path):
  import bertjax
  from bertjax.tasks import pretrain

  workdir = _copy(finished_run, tmp_path)
  before = open(os.path.join(workdir, "config.json")).read()
  bigger = tiny_pretrain_config(prepared_dir, **{"model.hidden_size": 64, "train.total_steps": 40})
  with pytest.raises(ValueError, match=r"does not fit this run's model and optimizer \(\d+ "
                                       r"arrays differ, e\.g\. "):
    pretrain.run(bigger, workdir)
  assert open(os.path.join(workdir, "config.json")).read() == before
  assert bertjax.load_pretrained(workdir).config.hidden_size == 32


def test_a_rerun_refuses_a_data_position_of_other_stream_settings(finished_run,
                                                                   prepared_dir, tmp_path):
  """A loader position is a place in the stream of its shuffle and packing
  windows: resumed under others it would be another place (or fail in the
  loader), so the rerun is refused in one line that says what to set."""
  import shutil

  from bertjax.tasks import pretrain

  workdir = _copy(finished_run, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "30"))  # resume mid-run, at 20
  before = open(os.path.join(workdir, "config.json")).read()
  for changes, flag in (({"data.shuffle_window": 7}, "--config.data.shuffle_window=1000"),
                        ({"data.max_sequences_per_row": 2},
                         "--config.data.max_sequences_per_row=1"),
                        ({"data.eval_percent": 20.0}, "--config.data.eval_percent=10.0"),
                        ({"seed": 5}, "--config.seed=0")):
    with pytest.raises(ValueError, match=f"the checkpoint's data position is in the stream of "
                                         f"{flag}, not of this run's .*: resume with {flag}, "
                                         "or start a new --workdir"):
      pretrain.run(tiny_pretrain_config(prepared_dir, **{"train.total_steps": 30, **changes}),
                   workdir)
    assert open(os.path.join(workdir, "config.json")).read() == before  # left as it was
  # Unpacked rows never read the packing window: changing it changes nothing.
  pretrain.run(tiny_pretrain_config(prepared_dir, **{"train.total_steps": 30,
                                             "data.packing_window": 17}), workdir)


def test_fine_tuning_refuses_to_write_into_a_pretraining_run(finished_run, tmp_path):
  from bertjax import tasks
  from bertjax.configs import glue as glue_config

  before = open(os.path.join(finished_run, "config.json")).read()
  config = glue_config.get_config("sst2")
  config.init_checkpoint = finished_run
  with pytest.raises(ValueError, match="is config.init_checkpoint"):
    tasks.run(config, finished_run)
  config.init_checkpoint = str(tmp_path / "elsewhere")
  with pytest.raises(ValueError, match="holds a 'pretrain' run .* this is a 'glue sst2' run"):
    tasks.run(config, finished_run)
  assert not os.path.exists(os.path.join(finished_run, "run.lock"))  # refused before locking
  assert open(os.path.join(finished_run, "config.json")).read() == before


def _damage(workdir, step, how):
  state = os.path.join(workdir, "checkpoints", str(step), "state")
  if how == "truncated array":  # every data file, wherever the OCDBT layout put them
    for root, _, names in os.walk(state):
      for name in names:
        if os.path.basename(root) == "d":
          with open(os.path.join(root, name), "r+b") as f:
            f.truncate(100)
  elif how == "lost manifest":
    os.remove(os.path.join(state, "manifest.ocdbt"))
    os.remove(os.path.join(state, "ocdbt.process_0", "manifest.ocdbt"))
  elif how == "lost metadata":
    os.remove(os.path.join(state, "_METADATA"))
  elif how == "garbled data position":
    data = os.path.join(workdir, "checkpoints", str(step), "data", "process_0-of-1.json")
    with open(data, "w") as f:
      f.write("{")


@pytest.mark.parametrize("how", ["truncated array", "lost manifest", "lost metadata",
                                 "garbled data position"])
def test_a_damaged_latest_step_is_set_aside_and_the_run_resumes_before_it(
    finished_run, prepared_dir, tmp_path, how, absl_caplog):
  from bertjax.tasks import pretrain

  workdir = _copy(finished_run, tmp_path)
  _damage(workdir, 30, how)
  pretrain.run(tiny_pretrain_config(prepared_dir, **{"train.total_steps": 40}), workdir)
  assert "DAMAGED CHECKPOINT: step 30 cannot be restored" in absl_caplog.text
  assert "Resuming from step 20" in absl_caplog.text
  assert "does not fit" not in absl_caplog.text  # damage is not called a model mismatch
  assert os.path.isdir(os.path.join(workdir, "checkpoints_damaged", "30"))
  assert _saved_steps(workdir)[-1] == 40


def test_a_run_with_every_step_damaged_stops_naming_them(finished_run, prepared_dir,
                                                        tmp_path):
  from bertjax.tasks import pretrain

  workdir = _copy(finished_run, tmp_path)
  for step in (10, 20, 30):
    _damage(workdir, step, "lost metadata")
  with pytest.raises(ValueError, match=r"no step of .*checkpoints reads back .*/30 is damaged"
                                       r".*/20 is damaged.*/10 is damaged"):
    pretrain.run(tiny_pretrain_config(prepared_dir, **{"train.total_steps": 40}), workdir)
  assert _saved_steps(workdir) == [10, 20, 30]  # nothing moved or deleted


def test_fine_tuning_reads_the_newest_step_that_is_intact(finished_run, tmp_path,
                                                         absl_caplog):
  from bertjax import checkpoint

  workdir = _copy(finished_run, tmp_path)
  _damage(workdir, 30, "truncated array")
  _, step, _ = checkpoint.params_from_run(workdir)
  assert step == 20 and "the newest that reads back" in absl_caplog.text
  assert _saved_steps(workdir) == [10, 20, 30]  # a reader changes nothing


def test_a_workdir_built_from_other_text_is_not_reused(tmp_path, monkeypatch):
  from bertjax.tasks import pretrain_data
  from tests.conftest import write_corpus

  first, second = write_corpus(tmp_path / "a.txt"), write_corpus(tmp_path / "b.txt", seed=1)
  workdir = str(tmp_path / "run")
  config = tiny_pretrain_config("", **{"data.dir": "", "data.build_from": str(first),
                               "data.vocab_size": 300})
  pretrain_data.prepare_data(config, workdir)
  for change in ({"data.build_from": str(second)}, {"data.vocab_size": 400}):
    with pytest.raises(ValueError, match="were built with other settings .*give another "
                                         "--workdir, or delete both"):
      pretrain_data.prepare_data(set_fields(config.copy_and_resolve_references(), change), workdir)
  # The same file named another way is the same input.
  monkeypatch.chdir(tmp_path)
  pretrain_data.prepare_data(set_fields(config.copy_and_resolve_references(),
                                        {"data.build_from": "a.txt"}), workdir)
  # A workdir built before the record was kept is judged by its dataset's input.
  os.remove(os.path.join(workdir, "built_from.json"))
  with pytest.raises(ValueError, match="were built with other settings"):
    pretrain_data.prepare_data(set_fields(config.copy_and_resolve_references(),
                                          {"data.build_from": str(second)}), workdir)


def test_a_data_build_cut_short_is_completed_by_the_rerun(tmp_path, monkeypatch):
  from bertjax.data import shards
  from bertjax.tasks import pretrain_data
  from tests.conftest import write_corpus

  monkeypatch.chdir(tmp_path)
  corpus = write_corpus(tmp_path / "a.txt")
  workdir = str(tmp_path / "run")
  config = tiny_pretrain_config("", **{"data.dir": "", "data.build_from": str(corpus),
                               "data.vocab_size": 300})
  data_dir = pretrain_data.prepare_data(config, workdir)
  # As if killed before the last shard was marked finished.
  last = sorted(n for n in os.listdir(data_dir) if n.endswith(".stats.json"))[-1]
  os.remove(os.path.join(data_dir, last))
  pretrain_data.prepare_data(config, workdir)
  assert len(shards.complete_shards(data_dir)) == 4


@pytest.mark.parametrize("flag,says", [
    ("--config.train.bogus=1", "--config.train.bogus: the config has no field 'bogus'"),
    ("--config.train.batch_sise=8", "did you mean --config.train.batch_size?"),
    # A field of another section: the name as it is there.
    ("--config.train.learning_rate=1e-4", "did you mean --config.optimizer.learning_rate?"),
    ("--config.data.dir=/no/such/dir", "/no/such/dir"),
])
def test_usage_errors_are_one_line(prepared_dir, tmp_path, flag, says):
  args = [a for a in _tiny(str(tmp_path / "run"), prepared_dir) if "data.dir" not in a]
  args += [flag, "--config.data.build_from="]
  result = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = _error_lines(result.stderr)
  assert len(errors) == 1 and says in errors[0], result.stderr[-3000:]


def test_a_workdir_that_is_a_file_is_one_line_and_the_file_is_left(prepared_dir, tmp_path):
  for name in ("notes.txt", "run.lock"):  # any file; one named as a run's own file
    path = tmp_path / name
    path.write_text("mine\n")
    result = subprocess.run(_tiny(str(path), prepared_dir), cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert _error_lines(result.stderr)[-1].startswith(
        f"error: --workdir={path} is a file, not a directory"), result.stderr[-3000:]
    assert path.read_text() == "mine\n"
  assert sorted(os.listdir(tmp_path)) == ["notes.txt", "run.lock"]  # nothing else written


def _two_processes(args, timeout=240):
  """Runs `args` as processes 0 and 1 of one job; returns (exit codes, stderr of each)."""
  from tests.tasks.test_pretrain import _free_port

  port = _free_port()
  processes = [subprocess.Popen(
      args + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
              f"--process_id={i}"],
      cwd=ROOT, env={**_env(devices=2), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"},
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    outputs = [p.communicate(timeout=timeout)[1] for p in processes]
  finally:
    for p in processes:
      p.kill()  # a hang fails the test instead of stalling the suite
  return [p.returncode for p in processes], outputs


def test_a_failed_build_on_host_0_stops_every_host(tmp_path):
  """Host 0 builds the data while the others wait for it: its failure reaches them."""
  unusable = tmp_path / "blank.txt"
  unusable.write_text("\n\n   \n" * 50)
  args = _tiny(str(tmp_path / "run"), "", **{"data.build_from": str(unusable),
                                             "data.vocab_size": 300})
  codes, outputs = _two_processes([a for a in args if not a.startswith("--config.data.dir")])
  assert codes == [2, 2], outputs[1][-3000:]
  assert str(unusable) in _error_lines(outputs[0])[0]
  assert "preparing the data failed on process 0 of 2" in _error_lines(outputs[1])[0]


def test_an_evaluation_split_that_misses_a_host_stops_every_host(prepared_dir, tmp_path):
  """With documents split between hosts, an evaluation split of one document
  leaves a host none: both refuse before training instead of one waiting."""
  import numpy as np

  from bertjax.data import loader

  count = len(loader.DocumentSource(prepared_dir))
  percent = next(p for p in np.arange(0.5, 20, 0.25)
                 if len(loader.split_documents(count, "eval", p)) == 1)
  args = _tiny(str(tmp_path / "run"), prepared_dir, **{"data.host_sharding": "documents",
                                                       "data.eval_percent": float(percent)})
  codes, outputs = _two_processes(args)
  assert codes == [2, 2], outputs[1][-3000:]
  for output in outputs:
    assert "leaves 1 in the eval split, fewer than the 2 process(es)" in _error_lines(output)[0]


def test_ctrl_c_on_one_host_saves_every_host_at_the_same_step(prepared_dir, tmp_path):
  """On several hosts, Ctrl-C goes through JAX's preemption sync point: all of
  them save the same step and stop."""
  from tests.tasks.test_pretrain import _free_port

  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 3000, "eval.every_steps": 0,
                                         "checkpoint.every_steps": 1000})
  port = _free_port()
  logs = [str(tmp_path / f"log{i}") for i in range(2)]
  processes = [subprocess.Popen(
      args + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
              f"--process_id={i}"],
      cwd=ROOT, env={**_env(devices=2), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"},
      stdout=subprocess.DEVNULL, stderr=open(logs[i], "w")) for i in range(2)]
  try:
    _wait_for_step(processes[0], workdir, 30)
    processes[0].send_signal(signal.SIGINT)
    codes = [p.wait(timeout=240) for p in processes]
  finally:
    for p in processes:
      p.kill()
  outputs = [open(log).read() for log in logs]
  assert codes == [130, 143], outputs[0][-3000:]
  saved = _saved_steps(workdir)
  assert len(saved) == 1 and 30 <= saved[0] < 3000
  assert f"Interrupted: checkpoint saved at step {saved[0]}" in outputs[0]
  assert f"Preempted: checkpoint saved at step {saved[0]}" in outputs[1]


def test_a_damaged_step_on_cloud_storage_is_set_aside_too(gcs, prepared_dir, absl_caplog):
  """On gs:// a step is copied aside by the store, then deleted (no rename there)."""
  from etils import epath

  from bertjax import files
  from bertjax.tasks import pretrain

  workdir = gcs.url_of("faults/damaged")
  pretrain.run(tiny_pretrain_config(prepared_dir), workdir)
  epath.Path(files.join(workdir, "checkpoints", "30", "state", "_METADATA")).unlink()
  pretrain.run(tiny_pretrain_config(prepared_dir, **{"train.total_steps": 40}), workdir)
  assert "DAMAGED CHECKPOINT: step 30 cannot be restored" in absl_caplog.text
  assert files.isfile(files.join(workdir, "checkpoints_damaged", "30", "state", "manifest.ocdbt"))
  # Steps 30 (again) and 40 saved anew; the oldest dropped (max_to_keep=3).
  assert sorted(files.listdir(files.join(workdir, "checkpoints"))) == ["20", "30", "40"]


def test_a_checkpoint_with_arrays_this_run_lacks_is_a_mismatch_not_damage(finished_run,
                                                                         prepared_dir,
                                                                         tmp_path):
  """The MLM-only objective has no NSP head: the checkpoint's extra arrays are
  named, and nothing is set aside."""
  from bertjax.tasks import pretrain

  workdir = _copy(finished_run, tmp_path)
  with pytest.raises(ValueError, match="does not fit .*nsp/.*this run has no "
                                       "such array"):
    pretrain.run(tiny_pretrain_config(prepared_dir, **{"objective": "mlm_pairs",
                                               "train.total_steps": 40}), workdir)
  assert _saved_steps(workdir) == [10, 20, 30]


_BROKEN_CONFIGS = {
    # A doubled comma, and a tab among spaces: Python refuses the file itself.
    "comma.py": ("from bertjax.configs import demo\n\ndef get_config(arg=None):\n"
                 "  config = demo.get_config(arg)\n  config.seed = 1,,\n  return config\n"),
    "tabs.py": ("from bertjax.configs import demo\n\ndef get_config(arg=None):\n"
                "  config = demo.get_config(arg)\n\treturn config\n"),
    # The file's own code fails as it runs: an import, a typo, a field that is not.
    "imports.py": "from bertjax.configs import demo\nimport bertjax_extras\n",
    "typo.py": ("from bertjax.configs import demo\n\ndef get_config(arg=None):\n"
                "  config = demo.get_config(arg)\n  config.seed = seeed + 1\n"
                "  return config\n"),
    "field.py": ("from bertjax.configs import demo\n\ndef get_config(arg=None):\n"
                 "  config = demo.get_config(arg)\n  config.optimizer.learning_rte = 1e-4\n"
                 "  return config\n"),
    # The file's shape: no get_config, one that returns nothing or a dict, one
    # that refuses its argument.
    "noget.py": "from bertjax.configs import demo\nconfig = demo.get_config()\n",
    "none.py": "def get_config(arg=None):\n  config = {'task': 'pretrain'}\n",
    "dict.py": "def get_config(arg=None):\n  return {'task': 'pretrain'}\n",
    "refuses.py": ("def get_config(arg=None):\n"
                   "  raise ValueError(f'unknown size {arg!r}')\n"),
}


@pytest.mark.parametrize("config,says", [
    ("configs/no_such_config.py", "--config=configs/no_such_config.py: no such file under "),
    ("configs/glue.py:foo", "configs/glue.py needs a GLUE task as its argument"),
    ("comma.py", "comma.py, line 5, column 19: invalid syntax (SyntaxError); correct the "
     "config file"),
    ("tabs.py", "tabs.py, line 5"),
    ("imports.py", "imports.py, line 2, column 1: ModuleNotFoundError: No module named "
     "'bertjax_extras'; correct the config file"),
    ("typo.py", "typo.py, line 5, column 17: NameError: name 'seeed' is not defined; correct "
     "the config file"),
    ("field.py", "field.py, line 5, column 3: the config has no field 'learning_rte' (did you "
     "mean 'learning_rate'?)"),
    ("noget.py", "noget.py has no get_config function: a config file defines "
     "get_config(arg=None) returning the config"),
    ("none.py", "none.py's get_config returned None: return the ml_collections.ConfigDict"),
    ("dict.py", "dict.py's get_config returned a dict, not a config"),
    ("refuses.py", "refuses.py, line 2, column 3: ValueError: unknown size None; correct the "
     "config file"),
])
def test_a_config_file_that_does_not_load_is_one_line(tmp_path, config, says):
  if config in _BROKEN_CONFIGS:
    (tmp_path / config).write_text(_BROKEN_CONFIGS[config])
    config = str(tmp_path / config)
  result = subprocess.run([sys.executable, "-m", "bertjax.main", f"--config={config}",
                           f"--workdir={tmp_path}"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = _error_lines(result.stderr)
  assert len(errors) == 1 and says in errors[0], result.stderr[-3000:]


def _tree_bytes(directory):
  return {os.path.relpath(os.path.join(root, name), directory):
          open(os.path.join(root, name), "rb").read()
          for root, _, names in os.walk(directory) for name in names}


def test_a_mistyped_learning_rate_stops_before_its_weights_are_saved(finished_run,
                                                                     prepared_dir, tmp_path):
  """A learning rate of 1e4 drives the loss up by orders of magnitude while it
  stays finite: the run stops in one line before a checkpoint holds those
  weights, and a rerun with a sane one resumes from the last good step."""
  workdir = _copy(finished_run, tmp_path)
  good = _tree_bytes(os.path.join(workdir, "checkpoints", "30"))
  same = {"data.host_sharding": "documents"}  # as finished_run's stream
  # Its gradients overflow (the steps are skipped) while the loss, 1e16, stays
  # finite: with skips allowed, the divergence guard is what stops it. A save
  # at every step: step 31 is saved before the loss of its weights is known.
  args = _tiny(workdir, prepared_dir, **same, **{"train.total_steps": 90,
                                                 "checkpoint.every_steps": 1,
                                                 "optimizer.learning_rate": 1e4,
                                                 "optimizer.warmup_steps": 0,
                                                 "max_consecutive_skips": 1000})
  result = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  line = _error_lines(result.stderr)[-1]
  assert line.startswith("error: the loss diverged: ") and "in a row since step 32" in line, line
  assert ("a rerun resumes from step 30 (step 31, saved as the loss left its range, goes to "
          "checkpoints_diverged/): lower optimizer.learning_rate (now 10000)" in line), line
  assert _saved_steps(workdir) == [20, 30]  # (10 went with max_to_keep=3 when 31 was saved)
  assert os.listdir(os.path.join(workdir, "checkpoints_diverged")) == ["31"]
  assert _tree_bytes(os.path.join(workdir, "checkpoints", "30")) == good
  assert "The checkpoint of step 32 waits: loss " in result.stderr
  _run(_tiny(workdir, prepared_dir, **same, **{"train.total_steps": 50}), _env())
  assert _saved_steps(workdir)[-1] == 50
  assert _losses(workdir)[50][-1] < 10  # the rerun's step 50: on from the good weights


def test_a_run_in_relative_paths_from_another_directory_resumes_and_converts(prepared_dir,
                                                                            tmp_path):
  """What a new user types: a shipped config as the docs name it
  (`configs/demo.py`, not there), a relative workdir and data directory, a
  rerun through the same relative path, then a conversion of the run with
  relative paths."""
  import shutil

  home = tmp_path / "home"
  home.mkdir()
  shutil.copytree(prepared_dir, home / "data")
  args = _tiny("runs/demo", "data", **{"train.total_steps": 20, "optimizer.warmup_steps": 5})
  assert "--config=configs/demo.py" in args and not (home / "configs").exists()
  first = subprocess.run(args, cwd=home, env=_env(), capture_output=True, text=True,
                         timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  workdir = str(home / "runs" / "demo")
  assert _saved_steps(workdir) == [10, 20]
  assert json.load(open(os.path.join(workdir, "config.json")))["data"]["dir"] == str(
      home / "data")  # resolved where it was typed
  again = subprocess.run([a.replace("total_steps=20", "total_steps=30") for a in args],
                         cwd=home, env=_env(), capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "DAMAGED" not in again.stderr and "Resumed from" in again.stderr
  assert _saved_steps(workdir) == [10, 20, 30]
  converted = subprocess.run([sys.executable, "-m", "bertjax.tools.convert",
                              "--input=runs/demo", "--output=exported", "--to=hf"], cwd=home,
                             env=_env(), capture_output=True, text=True, timeout=600)
  assert converted.returncode == 0, converted.stderr[-3000:]
  assert os.path.isfile(home / "exported" / "config.json")
