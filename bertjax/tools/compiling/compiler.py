"""A pre-training config's steps compiled for a Cloud TPU slice, on any host.

`make_target` builds the mesh a run of the config would build on the
slice(s) (libtpu's description of the chips, `bertjax.topology`); `Compiler`
jits the trainer's own steps with the run's shardings over an abstract state
and batch (`batch_spec`), compiles each phase's for the chips
(`program.compile_step`), and searches the largest batch a chip
holds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import checkpoint, errors, flops, optim, sharding, topology, train
from bertjax import phases as phase_lib
from bertjax.models import EncoderConfig, attention
from bertjax.tasks import pretrain
from bertjax.tools.compiling import batch_search, jaxpr_flops, program as compiled_program
from bertjax.tools.compiling.real_work import RealWork, local_window

@dataclasses.dataclass
class Target:
  """The slice(s) compiled for and the run's mesh over them."""

  tpu_slice: Any  # bertjax.topology.Slice
  num_slices: int
  devices: list[Any]
  mesh: Any

  @property
  def chips(self) -> int:
    return len(self.devices)

  @property
  def hosts(self) -> int:
    return self.tpu_slice.hosts * self.num_slices


def make_target(config, accelerator_type: str, num_slices: int) -> Target:
  """The devices and mesh of a run of `config` on the slice(s).

  Raises:
    errors.UsageError: an unknown slice, or a config that does not fit its shape.
  """
  if config.get("task") != "pretrain":
    raise errors.UsageError(
        f"config.task is {config.get('task')!r}: give a pre-training config "
        "(configs/base_pretrain.py, configs/large_pretrain.py, configs/demo.py)")
  if num_slices < 1:
    raise errors.UsageError(f"--num_slices={num_slices}: set it to 1 or more")
  try:
    tpu_slice = topology.parse(accelerator_type)
    devices = topology.devices(tpu_slice, num_slices)
    shape = pretrain.validate(config, len(devices))
    mesh = sharding.make_mesh(shape, devices)
  except ValueError as e:
    raise errors.UsageError(str(e)) from None
  hosts = tpu_slice.hosts * num_slices
  batches = [("train.batch_size", config.train.batch_size),
             ("eval.batch_size", config.eval.batch_size)]
  batches += [("train.long_batch_size", phase.batch_size)
              for phase in phase_lib.phases(config)[1:]]
  batches += [("train.batch_ramp_start", phase.ramp_start)
              for phase in phase_lib.phases(config) if phase.ramp_steps]
  for name, batch in batches:
    if batch % hosts:  # each host loads its share (pretrain.validate checks one host here)
      raise errors.UsageError(f"{name}={batch} does not divide over the {hosts} hosts of "
                              f"{accelerator_type}" + (f" x {num_slices}" if num_slices > 1 else "")
                              + f"; make it a multiple of {hosts}")
  return Target(tpu_slice, num_slices, devices, mesh)


def batch_spec(objective: str, batch_size: int, length: int, predictions: int,
               sharding, max_sequences_per_row: int = 1) -> dict[str, Any]:
  """ShapeDtypeStructs of a pre-training batch as `bertjax.data.loader` makes it
  (rows of up to `max_sequences_per_row` sequences: `bertjax.data.packing`)."""

  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

  tokens = (batch_size, length)
  batch = {"input_ids": spec(tokens, jnp.int32), "token_type_ids": spec(tokens, jnp.int32)}
  packed = max_sequences_per_row > 1
  if packed:
    batch.update(segment_ids=spec(tokens, jnp.int32), position_ids=spec(tokens, jnp.int32))
  else:
    batch["attention_mask"] = spec(tokens, jnp.int32)
  if objective == "ltr":
    batch.update(lm_labels=spec(tokens, jnp.int32), lm_weights=spec(tokens, jnp.float32))
    return batch
  masked = (batch_size, predictions)
  batch.update(masked_positions=spec(masked, jnp.int32), masked_ids=spec(masked, jnp.int32),
               masked_weights=spec(masked, jnp.float32))
  if objective == "mlm_nsp" and packed:
    pairs = (batch_size, max_sequences_per_row)
    batch.update(next_sentence_labels=spec(pairs, jnp.int32),
                 nsp_positions=spec(pairs, jnp.int32), nsp_weights=spec(pairs, jnp.float32))
  elif objective == "mlm_nsp":
    batch["next_sentence_labels"] = spec((batch_size,), jnp.int32)
  return batch


class Compiler:
  """The steps of `config` on a target, compiled with the run's own functions."""

  def __init__(self, config, target: Target, real_work: RealWork | None = None):
    self.config, self.target, self.real_work = config, target, real_work
    self.bert = EncoderConfig.from_run_config(config)
    self.model = train.pretraining_model(self.bert, config.objective)
    self.optimizer, self.schedule = optim.make_optimizer(config)
    self.rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
    mesh = target.mesh
    with jax.set_mesh(mesh), nn.logical_axis_rules(self.rules):
      abstract = train.abstract_train_state(self.model, self.optimizer, config.seed)
      self.shardings = train.state_shardings(abstract, mesh, self.rules)
    self.state = checkpoint.abstract_with_shardings(abstract, self.shardings)
    self.batch_sharding = sharding.batch_sharding(mesh)
    self.data_shards = sharding.batch_shards(mesh)
    self.parameter_count = sum(math.prod(leaf.shape)
                               for leaf in jax.tree.leaves(self.state.params))

  def _steps(self, accumulation_steps: int, phase):
    model = train.pretraining_model(phase.model(self.bert), self.config.objective)
    return train.jit_steps(model, self.optimizer, self.schedule, self.config.objective,
                           accumulation_steps, self.shardings, self.batch_sharding,
                           sharding.replicated(self.target.mesh))

  def train(self, phase, batch_size: int, accumulation_steps: int) -> dict[str, Any]:
    """Compiles the training step of a phase; its memory, FLOPs, collectives."""
    return self._compile(self._steps(accumulation_steps, phase)[0], phase, batch_size, True)

  def evaluate(self, phase, batch_size: int) -> dict[str, Any]:
    """Compiles the evaluation step of a phase; its memory, FLOPs, collectives."""
    return self._compile(self._steps(1, phase)[1], phase, batch_size, False)

  def _compile(self, step, phase, batch_size: int, training: bool) -> dict[str, Any]:
    length = phase.max_seq_length
    batch = batch_spec(self.config.objective, batch_size, length, phase.max_predictions,
                       self.batch_sharding, self.config.data.max_sequences_per_row)
    # Where a kernel's block mask cannot be read: the blocks a causal mask reaches.
    share = (jaxpr_flops.causal_block_share(length, attention.SPLASH_BLOCK)
             if self.bert.causal else 1.0)
    with jax.set_mesh(self.target.mesh), nn.logical_axis_rules(self.rules):
      result = compiled_program.compile_step(
          step, self.state if training else self.state.params, batch, kernel_block_share=share)
    total = result["per_chip_bytes"].get("total")
    result.setdefault("fits", total is not None
                      and total <= self.target.tpu_slice.generation.hbm_bytes)
    if "flops_per_chip" in result:
      # Full rows: every slot a token, every prediction slot used.
      full = flops.row_work(self.config.objective, length, phase.max_predictions, 1.0,
                            local_window(self.config, phase))
      model = flops.work_flops(phase.model(self.bert), full, batch_size, training)
      compiled = result.pop("flops_per_chip") * self.target.chips
      traced = result.pop("traced_flops")
      counts = {
          "matmuls": traced.matmuls, "attention_kernels": traced.kernel_flops,
          "attention_kernel_calls": int(traced.kernel_calls), "model": model,
          "ratio": round(traced.matmuls / model, 3), "cost_analysis": compiled,
          "cost_analysis_ratio": round(compiled / model, 3)}
      if self.real_work is not None:
        row = self.real_work.per_row[phase.index]
        real = flops.work_flops(phase.model(self.bert), row, batch_size, training)
        counts.update(model_real=real, real_share=round(real / traced.matmuls, 3))
      result["flops_per_step"] = counts
      # XLA's count of the bytes the step's ops read and write in HBM, a chip's.
      accessed = result.pop("bytes_accessed_per_chip")
      result["bytes_accessed"] = {
          "per_chip": accessed,
          "per_token": round(accessed / (batch_size * length / self.target.chips), 1),
          "loop_bodies_counted_once": result.pop("loops")}
    return result

  def max_per_chip_batch(self, phase, start: int,
                         known: dict[int, dict[str, Any]] | None = None
                         ) -> tuple[int, list[dict[str, Any]]]:
    """The largest per-chip batch (one micro-batch, in steps of 8 from 8 on)
    whose training step fits.

    `batch_search.largest_batch` searches it.

    Args:
      phase: The phase (sequence length) to search.
      start: A per-chip batch to begin from (the configured one).
      known: Results already compiled, by per-chip batch (accumulation 1).

    Returns:
      The batch (0 if not even one sequence fits) and every batch tried:
      whether it fit, its total bytes and XLA's refusal.
    """
    results = dict(known or {})

    def compile_at(per_chip: int) -> dict[str, Any]:
      logging.info("Trying %d sequences a chip at length %d", per_chip, phase.max_seq_length)
      return self.train(phase, per_chip * self.data_shards, 1)

    best = batch_search.largest_batch(compile_at, start,
                                      self.target.tpu_slice.generation.hbm_bytes, results)
    return best, batch_search.trials(results)
