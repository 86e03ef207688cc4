"""Checkpoints: exact round trips into shardings, unfinished saves, wrong shapes."""

import logging
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import checkpoint, checkpoint_failures, optim, sharding, train
from bertjax.models import EncoderConfig
from bertjax.configs.common import LOGICAL_AXIS_RULES

CONFIG = EncoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                    intermediate_size=48, max_position_embeddings=32, scan_layers=True)


def _state(config, mesh):
  model = train.pretraining_model(config, "mlm_nsp")
  optimizer = optim.create_optimizer("adamw", 1e-3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_AXIS_RULES):
    abstract = train.abstract_train_state(model, optimizer, 0)
    shardings = train.state_shardings(abstract, mesh, LOGICAL_AXIS_RULES)
    state = train.init_train_state(model, optimizer, 3, shardings)
  return state, checkpoint.abstract_with_shardings(abstract, shardings)


def test_round_trip_is_exact_and_keeps_shardings(tmp_path):
  mesh = sharding.make_mesh((2, 2, 2))
  state, target = _state(CONFIG, mesh)
  manager = checkpoint.Checkpointer(str(tmp_path))
  data_state = {"phase": 1, "loader": {"position": 17, "nested": [1, 2]}}
  assert manager.save(5, state, data_state, {"objective": "mlm_nsp"})
  manager.wait()
  assert manager.latest_step() == 5
  restored, data, meta = manager.restore(5, target)
  manager.close()
  assert data == data_state and meta == {"objective": "mlm_nsp"}
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    assert got.sharding == want.sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  kernel = restored.params["bert"]["layers"]["layer"]["intermediate"]["kernel"]
  assert kernel.sharding.spec == jax.P(None, "fsdp", "tensor")
  assert os.path.isfile(tmp_path / "5" / "data" / "process_0-of-1.json")


def test_a_step_saved_already_is_not_saved_again(tmp_path):
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  manager = checkpoint.Checkpointer(str(tmp_path))
  assert manager.save(5, state, {"phase": 0, "loader": None}, {"n": 1})
  manager.wait()
  assert not manager.save(5, state, {"phase": 0, "loader": None}, {"n": 2})
  manager.close()
  assert checkpoint.Checkpointer(str(tmp_path)).all_steps() == [5]


def test_a_save_in_flight_is_not_among_the_finished_steps(tmp_path, monkeypatch):
  """orbax lists a step from the moment its save starts; a second Ctrl-C that
  lands while it is written must not tell a rerun to resume from it; once
  written, it counts, waited for or not."""
  import threading
  import time
  import orbax.checkpoint as ocp

  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  release = threading.Event()
  finalize = ocp.CheckpointManager._finalize

  def held_finalize(self, step, *args, **kwargs):
    if step == 10:
      release.wait(60)
    return finalize(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "_finalize", held_finalize)
  manager = checkpoint.Checkpointer(str(tmp_path))
  manager.save(5, state, {"phase": 0, "loader": None}, {})
  manager.wait()
  manager.save(10, state, {"phase": 0, "loader": None}, {})
  assert manager._manager.all_steps() == [5, 10]  # orbax's own list
  assert manager.saving()
  assert manager.all_steps() == [5]
  release.set()
  deadline = time.monotonic() + 60  # finished in the background, not yet waited for
  while manager._manager.is_saving_in_progress() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not manager.saving()
  assert manager.all_steps() == [5, 10]
  manager.wait()
  assert manager.all_steps() == [5, 10]
  manager.close()


def test_a_synchronous_save_is_finished_when_it_returns(tmp_path):
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  manager = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  manager.save(5, state, {"phase": 0, "loader": None}, {})
  assert not manager.saving()
  assert manager.all_steps() == [5]
  manager.close()


def test_a_bug_in_a_save_is_raised_as_it_is(tmp_path):
  """What is not the storage failing keeps its type and traceback: a rerun
  would fail the same way, so no 'rerun to resume' line stands for it."""
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  manager = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  with pytest.raises(TypeError, match="not JSON serializable"):
    manager.save(5, state, {"phase": 0, "loader": None}, {"objective": object()})
  manager.close()


@pytest.mark.parametrize("error,storage", [
    (FileNotFoundError("http://127.0.0.1/upload/storage/v1/b/gone/o"), True),
    (ConnectionRefusedError("refused"), True),
    (ValueError("NOT_FOUND: Error writing \"x\" [tensorstore_spec=...]"), True),
    (ValueError("Checkpoint directory does not exist: gs://b/run/30/state"), True),
    (RuntimeError("UNAVAILABLE: the server went away"), True),
    (ValueError("Expected a tree of arrays, got a list"), False),
    (RuntimeError("RESOURCE_EXHAUSTED"), True),
    (ValueError("UNKNOWN: HTTP response code: 418 with body: teapot [tensorstore_spec=...]"),
     True),
    (RuntimeError("INTERNAL: during compilation of the step"), False),
    (TypeError("Object of type object is not JSON serializable"), False),
    (KeyError("NOT_FOUND"), False),  # a bug whatever its text
])
def test_storage_failures_are_told_from_bugs(error, storage):
  assert checkpoint_failures.storage_failure(error) == storage
  try:
    raise RuntimeError("the save failed") from error
  except RuntimeError as wrapped:
    assert checkpoint_failures.storage_failure(wrapped) == (
        storage and not isinstance(error, KeyError))


def test_unfinished_save_is_never_latest(tmp_path):
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, target = _state(CONFIG, mesh)
  manager = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  manager.save(2, state, {"phase": 0, "loader": None}, {})
  manager.close()
  # What a save killed half-way leaves: orbax's temporary step directory.
  partial = tmp_path / "4.orbax-checkpoint-tmp-1795966215"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "garbage").write_bytes(b"\x00" * 10)
  reopened = checkpoint.Checkpointer(str(tmp_path))
  assert reopened.latest_step() == 2
  restored, _, _ = reopened.restore(2, target)
  assert int(restored.step) == int(state.step)
  reopened.close()


def test_a_checkpoint_of_another_model_is_a_clear_error(tmp_path):
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  manager = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  manager.save(1, state, {"phase": 0, "loader": None}, {})
  _, other_target = _state(CONFIG.replace(hidden_size=64, num_heads=4), mesh)
  with pytest.raises(ValueError, match="does not fit this run's model and optimizer"):
    manager.restore(1, other_target)
  manager.close()


def test_on_gcs_a_step_without_its_commit_file_is_never_latest(gcs):
  """On gs:// (no atomic rename) orbax marks a finished step with
  commit_success.txt; a step a kill left without it is not taken, and a reader
  (fine-tuning from a run in progress) leaves it for the run to clean up."""
  from bertjax import files

  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, target = _state(CONFIG, mesh)
  directory = gcs.url_of("checkpoints/commit")
  manager = checkpoint.Checkpointer(directory, async_save=False)
  for step in (2, 4):
    manager.save(step, state, {"phase": 0, "loader": None}, {})
  manager.close()
  files.remove(files.join(directory, "4", "commit_success.txt"))  # the kill came first
  reader = checkpoint.Checkpointer(directory, async_save=False, create=False)
  assert reader.latest_step() == 2
  restored = reader.restore_state(2, target)
  assert int(restored.step) == int(state.step)
  reader.close()
  assert "4" in files.listdir(directory)  # the reader removed nothing
  writer = checkpoint.Checkpointer(directory)  # the run itself clears it, in the background
  assert writer.latest_step() == 2
  import time
  deadline = time.monotonic() + 60
  while "4" in files.listdir(directory) and time.monotonic() < deadline:
    time.sleep(0.2)
  writer.close()
  assert files.listdir(directory) == ["2"]


def test_a_save_the_storage_refuses_is_one_clear_error_and_nothing_waits(gcs):
  """The bucket vanishes (every request answered 404): the save says which step
  failed and where a rerun resumes, and nothing is left to wait for (orbax's
  own 'saving' flag stays set when a save fails before its background part)."""
  import time

  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  bucket = os.path.join(gcs.root, "storage", "bertjax-vanishing")
  os.makedirs(bucket)
  manager = checkpoint.Checkpointer("gs://bertjax-vanishing/checkpoints")
  manager.save(10, state, {"phase": 0, "loader": None}, {})
  manager.wait()
  os.rename(bucket, bucket + "-gone")
  started = time.monotonic()
  with pytest.raises(checkpoint.CheckpointSaveError,
                     match=r"saving the checkpoint of step 20 to gs://bertjax-vanishing/"
                     r"checkpoints failed \(FileNotFoundError: .*\); the run stopped there: "
                     r"rerun the same command to resume from step 10$"):
    manager.save(20, state, {"phase": 0, "loader": None}, {})
    manager.wait()
  assert not manager.saving()
  try:
    manager.close()
  except checkpoint.CheckpointSaveError as e:
    assert "step 20" in str(e)
  assert time.monotonic() - started < 30
  # The error said what failed: asyncio's notes at exit of the same save's
  # unretrieved task and write failures are dropped from now on, others kept.
  notes = [f for f in logging.getLogger("asyncio").filters
           if isinstance(f, checkpoint_failures.UnretrievedSaveErrors)]
  assert len(notes) == 1
  task = logging.LogRecord(
      "asyncio", logging.ERROR, "/usr/lib/python3.11/asyncio/base_events.py", 1,
      "Task exception was never retrieved\nfuture: <Task finished coro=<save() defined at "
      "/venv/lib/python3.11/site-packages/orbax/checkpoint/_src/x.py:1>>", (), None)
  write = logging.LogRecord(
      "asyncio", logging.ERROR, "/x/base_events.py", 1,
      "%s exception was never retrieved\nValueError('NOT_FOUND: ... [tensorstore_spec=...]')",
      ("Future",), None)
  other = logging.LogRecord("asyncio", logging.ERROR, "/x/base_events.py", 1,
                            "Task exception was never retrieved\n<Task a.py>", (), None)
  assert not notes[0].filter(task) and not notes[0].filter(write) and notes[0].filter(other)


def _failing_commit(monkeypatch, failing_step: int, *, gcs: bool = False):
  """orbax's commit of `failing_step` fails as storage does (the step's data
  was written, its rename or commit file was not)."""
  import orbax.checkpoint as ocp

  base = (ocp.path.atomicity.CommitFileTemporaryPath if gcs
          else ocp.path.atomicity.AtomicRenameTemporaryPath)
  finalize = base.finalize

  async def failing(self, *args, **kwargs):
    if self.get_final().name == str(failing_step):
      raise ConnectionResetError("injected: the storage dropped the commit")
    return await finalize(self, *args, **kwargs)

  monkeypatch.setattr(base, "finalize", failing)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_save_whose_commit_failed_is_not_named_as_finished(where, tmp_path, monkeypatch,
                                                             request):
  """orbax goes on listing a step whose background commit failed: neither the
  finished steps nor the abandoned run's answer may name it (a rerun cannot
  resume from it). On gs:// the commit is a file, locally a rename."""
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  _failing_commit(monkeypatch, 20, gcs=where == "gcs")
  directory = (request.getfixturevalue("gcs").url_of("checkpoints/failed") if where == "gcs"
               else str(tmp_path / "checkpoints"))
  manager = checkpoint.Checkpointer(directory)
  manager.save(10, state, {"phase": 0, "loader": None}, {})
  manager.wait()
  manager.save(20, state, {"phase": 0, "loader": None}, {})
  with pytest.raises(checkpoint.CheckpointSaveError, match="resume from step 10$"):
    manager.wait()
  assert manager.all_steps() == [10]
  assert manager.abandon() == ([10], "")
  rerun = checkpoint.Checkpointer(directory, create=False)
  assert rerun.all_steps() == [10]
  rerun.close()


def test_an_abandoned_run_names_what_is_committed_and_nothing_commits_after(
    tmp_path, monkeypatch):
  """Once a run is abandoned, a save still being written never commits, and
  the steps it names are those read from the storage."""
  import threading
  import time
  import orbax.checkpoint as ocp

  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _ = _state(CONFIG, mesh)
  directory = tmp_path / "checkpoints"
  finalize = ocp.path.atomicity.AtomicRenameTemporaryPath.finalize
  reached, release = threading.Event(), threading.Event()

  async def held(self, *args, **kwargs):
    if self.get_final().name == "20":
      reached.set()
      release.wait(60)
    return await finalize(self, *args, **kwargs)

  monkeypatch.setattr(ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize", held)
  monkeypatch.setattr(checkpoint, "_ABANDONED_HOLD_S", 0.5)  # the test's process goes on
  manager = checkpoint.Checkpointer(str(directory))
  manager.save(10, state, {"phase": 0, "loader": None}, {})
  manager.wait()
  manager.save(20, state, {"phase": 0, "loader": None}, {})
  assert reached.wait(60)  # step 20 is committing: the abandon waits for it
  threading.Timer(0.5, release.set).start()
  started = time.monotonic()
  assert manager.abandon(timeout=30) == ([10, 20], "")
  assert time.monotonic() - started >= 0.4
  manager._in_flight = None  # (a run exits here; the test goes on to a third save)

  manager.save(30, state, {"phase": 0, "loader": None}, {})  # written, never committed
  committed, caveat = manager.abandon(timeout=5)
  assert (committed, caveat) == ([10, 20], "")
  time.sleep(1.0)  # had it committed, it would have by now
  assert sorted(n for n in os.listdir(directory) if n.isdigit()) == ["10", "20"]
