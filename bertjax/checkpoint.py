"""Training checkpoints with orbax: the state, each host's data position, metadata.

A checkpoint `<workdir>/checkpoints/<step>/` holds
- `state/`: the `TrainState` (params, optimizer state, step, RNG, skip counters),
  saved asynchronously from its shards and restored into the same shardings;
- `data/process_<i>-of-<n>.json`: each host's loader state (and training
  phase), written by that host;
- `meta/`: JSON metadata (the phase, the model config).

Orbax writes a step under a temporary name and renames it when every host has
finished, so a save killed half-way never becomes the latest step.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

STATE, DATA, META = "state", "data", "meta"


class PerProcessJsonHandler(ocp.CheckpointHandler):
  """Saves one JSON document per JAX process (each host's data loader state)."""

  def save(self, directory: epath.Path, args: PerProcessJsonSave) -> None:
    path = epath.Path(directory) / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    path.write_text(json.dumps(args.item))

  def restore(self, directory: epath.Path, args: PerProcessJsonRestore | None = None) -> Any:
    path = epath.Path(directory) / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if not path.exists():
      found = sorted(p.name for p in epath.Path(directory).glob("process_*.json"))
      raise ValueError(f"{path} is missing: the checkpoint was written by a different number "
                       f"of processes ({found}); restart with as many hosts")
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
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=1, max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save, create=create,
        # Only the run's own manager clears unfinished saves: a reader (fine-tuning
        # from a run still in progress) must leave the run's pending save alone.
        cleanup_tmp_directories=create)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=(STATE, DATA, META))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def reached_preemption(self, step: int) -> bool:
    """JAX's preemption sync point on pods (all hosts agree on the step)."""
    return self._manager.reached_preemption(step)

  def save(self, step: int, state: Any, data_state: dict[str, Any],
           meta: dict[str, Any]) -> bool:
    """Starts saving a step (unless it is saved already); returns whether it did."""
    return self._manager.save(step, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardSave(state),
        DATA: PerProcessJsonSave(data_state),
        META: ocp.args.JsonSave(meta),
    }), force=True)

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(state, this host's data state, metadata) of a step.

    Args:
      abstract_state: `jax.ShapeDtypeStruct`s with shardings: the state is read
        straight into them.

    Raises:
      ValueError: the checkpoint's arrays do not fit the abstract state.
    """
    self._check_shapes(step, abstract_state)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(abstract_state),
          DATA: PerProcessJsonRestore(),
          META: ocp.args.JsonRestore(),
      }))
    except ValueError as e:
      raise ValueError(f"{self.directory}/{step}: the checkpoint does not fit this run's "
                       f"model and optimizer ({str(e).splitlines()[0]}); use another "
                       "--workdir or the config the checkpoint was made with") from None
    return restored[STATE], restored[DATA], restored[META]

  def restore_state(self, step: int, abstract_state: Any) -> Any:
    """Only the train state of a step (no data position), e.g. for fine-tuning."""
    self._check_shapes(step, abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardRestore(abstract_state)}))
    return restored[STATE]

  def _check_shapes(self, step: int, abstract_state: Any) -> None:
    """Compares the stored array shapes with the state to restore into."""
    stored = self._manager.item_metadata(step)[STATE]
    if stored is None:
      return
    stored_shapes = {_name(path): tuple(leaf.shape)
                     for path, leaf in jax.tree_util.tree_leaves_with_path(stored)
                     if hasattr(leaf, "shape")}
    wanted = {_name(path): tuple(leaf.shape)
              for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)}
    problems = [f"{name}: stored {stored_shapes.get(name, 'nothing')}, this run needs "
                f"{shape}" for name, shape in wanted.items()
                if stored_shapes.get(name) != shape]
    if problems:
      raise ValueError(
          f"{self.directory}/{step}: the checkpoint does not fit this run's model and "
          f"optimizer ({len(problems)} arrays differ, e.g. {'; '.join(problems[:3])}); use "
          "another --workdir or the config the checkpoint was made with")

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def params_from_run(workdir: str) -> tuple[Any, int, Any]:
  """(config, step, parameters) of the latest checkpoint of a pre-training run.

  `workdir` is local or a URL (`gs://...`). The state is restored into arrays
  on this host's first device, whatever mesh and number of hosts the run had.

  Returns:
    The run's `config.json` as an `ml_collections.ConfigDict`, the step, and
    the parameters as host arrays.
  """
  import ml_collections

  from bertjax import files, optim, train
  from bertjax.models import BertConfig

  config = ml_collections.ConfigDict(files.read_json(files.join(workdir, "config.json")))
  model = train.pretraining_model(BertConfig.from_run_config(config), config.objective)
  optimizer, _ = optim.make_optimizer(config)
  abstract = train.abstract_train_state(model, optimizer, config.seed)
  target = abstract_with_shardings(
      abstract, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
  checkpointer = Checkpointer(files.join(workdir, "checkpoints"), async_save=False,
                              create=False)
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise FileNotFoundError(f"{workdir}/checkpoints: no finished checkpoint")
    state = checkpointer.restore_state(step, target)
  finally:
    checkpointer.close()
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
