"""Training checkpoints with orbax: the state, each host's data position, metadata.

A checkpoint `<workdir>/checkpoints/<step>/` holds
- `state/`: the `TrainState` (params, optimizer state, step, RNG, skip counters),
  saved asynchronously from its shards and restored into the same shardings;
- `data/process_<i>-of-<n>.json`: each host's loader state (and training
  phase), written by that host;
- `meta/`: JSON metadata (the phase, the model config).

Orbax writes a step under a temporary name and renames it when every host has
finished, so a save killed half-way never becomes the latest step. A finished
step damaged later (a truncated array file, a lost manifest) is told apart
from one of another model: `restore` raises `DamagedCheckpointError` for the
first and `CheckpointMismatchError` for the second, each naming the step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import threading
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from bertjax import checkpoint_failures, errors

STATE, DATA, META = "state", "data", "meta"


class CheckpointMismatchError(errors.UsageError):
  """A checkpoint that does not fit the run restoring it (another model, optimizer
  or number of processes)."""


class DamagedCheckpointError(errors.CorruptFileError):
  """A finished step whose files cannot be read back."""


class CheckpointSaveError(errors.StorageError):
  """A save that failed (storage unreachable or full, rights withdrawn); the
  message names the step and the newest finished one, where a rerun resumes."""


def _damage_or_raise(error: Exception, where: str) -> DamagedCheckpointError:
  """`error` from reading a step as `DamagedCheckpointError`, unless it is a
  storage error that says nothing about the files (then it is re-raised)."""
  if checkpoint_failures.says_nothing_of_files(error):
    raise error
  return DamagedCheckpointError(f"{where} is damaged: {checkpoint_failures.first_line(error)}")


class PerProcessJsonHandler(ocp.CheckpointHandler):
  """Saves one JSON document per JAX process (each host's data loader state)."""

  def save(self, directory: epath.Path, args: PerProcessJsonSave) -> None:
    path = epath.Path(directory) / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    path.write_text(json.dumps(args.item))

  def restore(self, directory: epath.Path, args: PerProcessJsonRestore | None = None) -> Any:
    path = epath.Path(directory) / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if not path.exists():
      found = sorted(p.name for p in epath.Path(directory).glob("process_*.json"))
      if not found:
        raise DamagedCheckpointError(f"{directory} holds no host's data position")
      raise CheckpointMismatchError(f"{path} is missing: the checkpoint was written by a "
                                    f"different number of processes ({found}); restart "
                                    "with as many hosts")
    return json.loads(path.read_text())

  def structure(self, directory: epath.Path) -> Any:
    return None

  def metadata(self, directory: epath.Path) -> Any:
    return None

  def finalize(self, directory: epath.Path) -> None:
    pass

  def close(self) -> None:
    pass


@ocp.args.register_with_handler(PerProcessJsonHandler, for_save=True)
@dataclasses.dataclass
class PerProcessJsonSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(PerProcessJsonHandler, for_restore=True)
@dataclasses.dataclass
class PerProcessJsonRestore(ocp.args.CheckpointArgs):
  pass


class _CommitGate:
  """Lets saves commit (orbax's rename of a finished step, or its commit file on
  gs://) until the run is abandoned; from then on none does.

  An abandoned run names the step a rerun resumes from by reading what is
  committed on the storage: with the gate closed, a save still being written
  cannot commit after that read, and one committing as it closed is waited for.
  """

  def __init__(self):
    self._changed = threading.Condition()
    self._open = True
    self._committing = 0

  def enter(self) -> bool:
    """Whether a commit may start (then `leave` when it is done)."""
    with self._changed:
      if self._open:
        self._committing += 1
      return self._open

  def leave(self) -> None:
    with self._changed:
      self._committing -= 1
      self._changed.notify_all()

  def close(self, timeout: float) -> bool:
    """Stops commits; returns whether none is under way (one that started is
    waited for, up to `timeout` seconds)."""
    with self._changed:
      self._open = False
      return self._changed.wait_for(lambda: not self._committing, timeout)


_ABANDONED_HOLD_S = 300.0  # an abandoning process exits long before


class AbandonedSaveError(RuntimeError):
  """The commit of a save the run abandoned (raised in orbax's save thread)."""


def _gated_temporary_path(directory: str, gate: _CommitGate) -> type:
  """orbax's temporary-path class for `directory` (rename locally, a commit
  file on gs://), committing only through `gate`."""
  base = ocp.path.atomicity_defaults.get_default_temporary_path_class(epath.Path(directory))

  class Gated(base):

    async def finalize(self, *args, **kwargs):
      if not gate.enter():
        # The process is ending: hold the save thread until it has, so that it
        # neither logs a failure nor goes on to orbax's clean-up (which would
        # delete the step older checkpoints make way for).
        await asyncio.sleep(_ABANDONED_HOLD_S)
        raise AbandonedSaveError(f"the save of {self.get_final()} was abandoned")
      try:
        return await super().finalize(*args, **kwargs)
      finally:
        gate.leave()

  Gated.__name__ = Gated.__qualname__ = f"Gated{base.__name__}"
  return Gated


class Checkpointer:
  """Asynchronous, atomic checkpoints of one training run; the trainer decides
  when to save.

  Args:
    directory: Where the steps go (`<workdir>/checkpoints`).
    max_to_keep: Keep the newest this many steps.
    async_save: Write in the background while training goes on.
    create: Create the directory (a reader passes False).
  """

  def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True,
               create: bool = True):
    self.directory = os.fspath(directory)
    self._closed = False
    self._async = async_save
    # The step of the save started and not yet waited for (orbax's own flag
    # stays set when a save fails before its background part starts), and
    # whether orbax's save call for it has not returned (a Ctrl-C inside it).
    self._in_flight: int | None = None
    self._in_call = False
    self._failure: CheckpointSaveError | None = None  # a failed save, once raised
    self._last_step: int | None = None  # of the last save asked for
    self._failed: set[int] = set()  # steps whose save failed (orbax still lists them)
    self._gate = _CommitGate()
    checkpoint_failures.quiet_closed_event_loop()
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=1, max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save, create=create,
        # Only the run's own manager clears unfinished saves: a reader (fine-tuning
        # from a run still in progress) must leave the run's pending save alone.
        cleanup_tmp_directories=create,
        temporary_path_class=_gated_temporary_path(self.directory, self._gate))
    # The handlers named up front, so that a step's metadata (the stored array
    # shapes) can be read before anything is restored.
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers={
        STATE: ocp.StandardCheckpointHandler(), DATA: PerProcessJsonHandler(),
        META: ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def reached_preemption(self, step: int) -> bool:
    """JAX's preemption sync point on pods (all hosts agree on the step)."""
    return self._manager.reached_preemption(step)

  def save(self, step: int, state: Any, data_state: dict[str, Any],
           meta: dict[str, Any]) -> bool:
    """Starts saving a step (unless it is saved already); returns whether it did.

    Raises:
      CheckpointSaveError: the storage failed this save, or the one before it
        (orbax reports a background save's failure when the next one starts).
    """
    self.wait()  # the save before (orbax would wait for it too): its error is its own
    if step in self._manager.all_steps():
      return False
    self._last_step = step
    # In flight from before orbax is called: orbax lists the step among its steps
    # as the save starts, and a Ctrl-C may land anywhere inside the call.
    self._in_flight, self._in_call = step, True
    try:
      started = self._manager.save(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardSave(state),
          DATA: PerProcessJsonSave(data_state),
          META: ocp.args.JsonSave(meta),
      }), force=True)
    except Exception as e:  # pylint: disable=broad-except
      self._in_flight, self._in_call = None, False  # nothing to wait for (a Ctrl-C: in flight)
      if not checkpoint_failures.storage_failure(e):
        raise
      self._failure = self._save_failed(step, e)
      raise self._failure from e
    self._in_call = False
    if not self._async:
      self._in_flight = None  # written when the call returned
    return started

  def _save_failed(self, step: int | None, error: Exception) -> CheckpointSaveError:
    """The error that says which save failed, why, and where a rerun resumes.

    On a full disk or quota, or another write the storage refused (a file-size
    limit, a read-only disk: `errors.write_failure`), the save's partial files
    are removed (they hold the space a rerun needs), and the error says why
    and what to do.
    """
    checkpoint_failures.quiet_unretrieved_save_errors()  # this error says what they would
    if step is not None:
      self._failed.add(step)
    try:
      finished = self.all_steps()
      resume = f"step {max(finished)}" if finished else "step 0 (no finished checkpoint)"
    except Exception:  # pylint: disable=broad-except
      resume = "its newest finished checkpoint"
    if errors.storage_full(error) is not None:
      self._remove_unfinished()
      return CheckpointSaveError(
          f"saving the checkpoint of step {step} to {self.directory} failed: "
          f"{errors.full_disk(self.directory, error)}; the "
          "run stopped there: free space on that disk (older checkpoints go with a lower "
          "checkpoint.max_to_keep) or use a --workdir elsewhere, then rerun the same "
          f"command to resume from {resume}")
    if errors.write_failure(error) is not None:  # a file-size limit, a read-only disk, ...
      self._remove_unfinished()
      what, advice = errors.write_problem(self.directory, error)
      return CheckpointSaveError(
          f"saving the checkpoint of step {step} to {self.directory} failed: {what}; the run "
          f"stopped there: {advice} (or use a --workdir elsewhere), then rerun the same "
          f"command to resume from {resume}")
    return CheckpointSaveError(
        f"saving the checkpoint of step {step} to {self.directory} failed "
        f"({type(error).__name__}: {checkpoint_failures.first_line(error)}); the run stopped "
        f"there: rerun the same command to resume from {resume}")

  def _remove_unfinished(self) -> None:
    """Removes the temporary directories of saves that never finished (local)."""
    if "://" in self.directory or not os.path.isdir(self.directory):
      return
    for name in os.listdir(self.directory):
      if ".orbax-checkpoint-tmp" in name:
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

  def all_steps(self) -> list[int]:
    """The finished steps, oldest first: not a save still being written, which
    orbax lists from the moment it starts, nor one that failed."""
    writing = self._in_flight if self.saving() else None
    return sorted(s for s in self._manager.all_steps()
                  if s != writing and s not in self._failed)

  def abandon(self, timeout: float = 10.0) -> tuple[list[int], str]:
    """Stops every save from committing (the run ends without waiting for
    them) and reads the steps committed on the storage: what a rerun finds.

    A commit already under way is waited for, up to `timeout` seconds; so is
    the storage's answer.

    Returns:
      (the committed steps, oldest first; a caveat: "" when they are exact,
      else why they may not be).
    """
    settled = self._gate.close(timeout)
    caveat = "" if settled else (f"or step {self._in_flight}, if the commit still under way "
                                 "lands")
    result: list[Any] = []
    reader = threading.Thread(target=lambda: result.append(self._read_committed()),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    if not result or isinstance(result[0], BaseException):
      why = (f"{type(result[0]).__name__}: {checkpoint_failures.first_line(result[0], 120)}"
             if result else f"no answer in {timeout:g} s")
      return self.all_steps(), f"as far as this run knows: the storage did not answer ({why})"
    return result[0], caveat

  def _read_committed(self) -> list[int] | BaseException:
    try:
      return sorted(ocp.path.step.checkpoint_steps(self.directory))
    except Exception as e:  # pylint: disable=broad-except  # the storage's, said by `abandon`
      return e

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(state, this host's data state, metadata) of a step.

    Args:
      abstract_state: `jax.ShapeDtypeStruct`s with shardings: the state is read
        straight into them.

    Raises:
      CheckpointMismatchError: the checkpoint's arrays do not fit the abstract state.
      DamagedCheckpointError: the step's files cannot be read back.
    """
    self._check_shapes(step, abstract_state)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(abstract_state),
          DATA: PerProcessJsonRestore(),
          META: ocp.args.JsonRestore(),
      }))
    except (CheckpointMismatchError, DamagedCheckpointError):
      raise
    except Exception as e:  # tensorstore, JSON and file errors: the shapes fit
      raise _damage_or_raise(e, f"{self.directory}/{step}") from e
    return restored[STATE], restored[DATA], restored[META]

  def restore_state(self, step: int, abstract_state: Any) -> Any:
    """Only the train state of a step (no data position), e.g. for fine-tuning."""
    self._check_shapes(step, abstract_state)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(abstract_state)}))
    except Exception as e:
      raise _damage_or_raise(e, f"{self.directory}/{step}") from e
    return restored[STATE]

  def move_aside(self, steps: list[int], to: str) -> None:
    """Moves finished steps out of the run (to `to/<step>`), kept for inspection;
    the caller makes sure no other process is reading or writing them.

    A local step is renamed. On object storage a step is copied, then deleted:
    a failure part-way leaves the step in place (and perhaps a partial copy),
    never nowhere.
    """
    from bertjax import files

    for step in steps:
      source = files.join(self.directory, str(step))
      destination = files.join(to, str(step))
      if files.exists(destination):
        destination = files.join(to, f"{step}-{int(time.time())}")
      if not files.is_remote(source):
        os.makedirs(to, exist_ok=True)
        os.rename(source, destination)
        continue
      _copy_tree(epath.Path(source), epath.Path(destination))
      epath.Path(source).rmtree()

  def reload(self) -> None:
    """Rereads the steps on storage (after another process moved some)."""
    self._manager.reload()

  def _check_shapes(self, step: int, abstract_state: Any) -> None:
    """Compares the stored array shapes with the state to restore into.

    Raises:
      CheckpointMismatchError: naming the first arrays that differ.
      DamagedCheckpointError: the step's metadata cannot be read.
    """
    try:
      stored = self._manager.item_metadata(step)[STATE]
    except Exception as e:
      raise _damage_or_raise(e, f"{self.directory}/{step} (its metadata)") from e
    if stored is None:
      raise DamagedCheckpointError(f"{self.directory}/{step} is damaged: its state has no "
                                   "metadata")
    stored_shapes = {_name(path): tuple(leaf.shape)
                     for path, leaf in jax.tree_util.tree_leaves_with_path(stored)
                     if hasattr(leaf, "shape")}
    wanted = {_name(path): tuple(leaf.shape)
              for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)}
    problems = [f"{name}: stored {stored_shapes.get(name, 'nothing')}, this run needs "
                f"{shape}" for name, shape in wanted.items()
                if stored_shapes.get(name) != shape]
    problems += [f"{name}: stored {shape}, this run has no such array"
                 for name, shape in stored_shapes.items() if name not in wanted]
    if problems:
      raise CheckpointMismatchError(
          f"{self.directory}/{step}: the checkpoint does not fit this run's model and "
          f"optimizer ({len(problems)} arrays differ, e.g. {'; '.join(problems[:3])}); use "
          "another --workdir or the config the checkpoint was made with")

  def saving(self) -> bool:
    """Whether a save is still being written: orbax's save call for it has
    not returned, or its background part is still running."""
    return self._in_flight is not None and (self._in_call
                                            or self._manager.is_saving_in_progress())

  def wait(self) -> None:
    """Waits for the save in flight.

    The wait polls, so that a KeyboardInterrupt (a second Ctrl-C) lands here,
    leaving the save in flight as `saving()` says, rather than inside orbax's
    join, which would log it as a failed save with a traceback.

    Raises:
      CheckpointSaveError: the storage failed the save (raised by the wait
        that finds it; later ones return).
    """
    while self._in_flight is not None and self._manager.is_saving_in_progress():
      time.sleep(0.05)
    step, self._in_flight = self._in_flight, None
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      if not checkpoint_failures.storage_failure(e):
        raise
      self._failure = self._failure or self._save_failed(step, e)
      raise self._failure from e

  def close(self) -> None:
    """Waits for the save in flight, then releases the manager (again: no-op).
    Interrupted (KeyboardInterrupt), it leaves both as they were."""
    if self._closed:
      return
    try:
      self.wait()
    except KeyboardInterrupt:
      raise  # the save is still in flight: `saving()` says so
    except BaseException:
      self._closed = True  # the save failed: nothing is in flight
      try:
        self._manager.close()  # its threads; the save's error is the one raised
      except Exception:  # pylint: disable=broad-except
        pass
      raise
    self._closed = True
    try:
      self._manager.close()
    except Exception as e:  # pylint: disable=broad-except  # a failed save, reported again
      if not checkpoint_failures.storage_failure(e):
        raise
      self._failure = self._failure or self._save_failed(self._last_step, e)
      raise self._failure from e


def _copy_tree(source: epath.Path, destination: epath.Path) -> None:
  """Copies every object under `source` (copied by the store itself)."""
  for item in source.iterdir():
    if item.is_dir():
      _copy_tree(item, destination / item.name)
    else:
      item.copy(destination / item.name, overwrite=True)


def params_from_run(workdir: str) -> tuple[Any, int, Any]:
  """(config, step, parameters) of the latest checkpoint of a pre-training run.

  `workdir` is local or a URL (`gs://...`). The state is restored into arrays
  on this host's first device, whatever mesh and number of hosts the run had.
  A damaged latest step is skipped, with a warning, for the newest one that
  reads back (nothing in the run is changed).

  Returns:
    The run's `config.json` as an `ml_collections.ConfigDict`, the step, and
    the parameters as host arrays.
  """
  import ml_collections

  from bertjax import files, optim, train
  from bertjax.models import EncoderConfig

  config = ml_collections.ConfigDict(files.read_json(files.join(workdir, "config.json")))
  model = train.pretraining_model(EncoderConfig.from_run_config(config), config.objective)
  optimizer, _ = optim.make_optimizer(config)
  abstract = train.abstract_train_state(model, optimizer, config.seed)
  target = abstract_with_shardings(
      abstract, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
  checkpointer = Checkpointer(files.join(workdir, "checkpoints"), async_save=False,
                              create=False)
  try:
    steps = checkpointer.all_steps()
    if not steps:
      raise errors.MissingFileError(f"{workdir}/checkpoints: no finished checkpoint")
    damage = []
    for step in reversed(steps):
      try:
        state = checkpointer.restore_state(step, target)
        break
      except DamagedCheckpointError as e:
        damage.append(str(e))
    else:
      raise DamagedCheckpointError(f"no step of {workdir}/checkpoints reads back: "
                                   + "; ".join(damage))
  finally:
    checkpointer.close()
  if damage:
    from absl import logging

    logging.warning("Using step %d of %s, the newest that reads back: %s", step, workdir,
                    "; ".join(damage))
  return config, step, jax.device_get(state.params)


def _name(path) -> str:
  """'params/bert/pooler/kernel' for a tree path (dict keys, attributes or indices)."""
  parts = (getattr(p, "key", None) or getattr(p, "name", None) or getattr(p, "idx", None)
           for p in path)
  return "/".join(str(p) for p in parts)


def strip_boxes(tree: Any) -> Any:
  """A tree without logical-partitioning boxes (no sharding constraints applied)."""
  import flax.linen as nn

  return jax.tree.map(lambda x: x.unbox(apply_constraint=False)
                      if isinstance(x, nn.meta.AxisMetadata) else x, tree,
                      is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying the shardings to restore into.

  `abstract` may hold logical-partitioning boxes (from `jax.eval_shape` of a
  Flax init); `shardings` is a matching tree or one sharding for every leaf.
  """
  plain = strip_boxes(abstract)
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, plain)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      plain, shardings)
