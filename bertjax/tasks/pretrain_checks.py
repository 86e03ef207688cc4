"""Checks of a pre-training config before anything is compiled: every number's
range (`bertjax.config_ranges`), the schedule within the run, every conflict at
once (`bertjax.schedule_fit`), then the settings that bound each other: batch
sizes against the mesh, gradient accumulation and processes (the batch-size
warmup's too), sequence lengths against the model."""

from __future__ import annotations

import jax
import ml_collections

from bertjax import config_ranges, errors, optim, schedule_fit, sharding
from bertjax.data import corpus
from bertjax.models import EncoderConfig, family
from bertjax.phases import Phase, phases
from bertjax.tasks.pretrain_data import masking_config, vocabulary_file


def validate(config: ml_collections.ConfigDict, mesh_devices: int) -> tuple[int, ...]:
  """Checks the config before anything is compiled; returns the mesh shape.

  Raises:
    ValueError: saying what to change.
  """
  config_ranges.check(config)  # (a config checked on its own: the compile tool's)
  schedule_fit.check(config)
  bert = EncoderConfig.from_run_config(config)  # hidden size vs heads and the like
  family.of(bert).check_objective(config.objective)
  vocabulary_file(config, "")  # a data.tokenizer it can train
  if config.data.get("file_format", "") not in ("", *corpus.FILE_FORMATS):
    raise errors.UsageError(f"data.file_format={config.data.file_format!r} is not one of "
                            f"'', {', '.join(map(repr, corpus.FILE_FORMATS))}")
  shape = sharding.mesh_shape([config.mesh.data, config.mesh.fsdp, config.mesh.tensor],
                              mesh_devices)
  accumulation = config.train.accumulation_steps
  data_shards = shape[0] * shape[1]
  processes = jax.process_count()
  for phase in phases(config):
    batch = phase.batch_size
    name = "train.batch_size" if phase.index == 0 else "train.long_batch_size"
    if batch % accumulation:
      raise errors.UsageError(f"{name}={batch} is not divisible by "
                              f"train.accumulation_steps={accumulation}")
    if (batch // accumulation) % data_shards:
      raise errors.UsageError(
          f"a micro-batch of {batch // accumulation} sequences ({name} / "
          f"train.accumulation_steps) does not divide over the {data_shards} data "
          f"shards of the mesh (data x fsdp = {shape[0]} x {shape[1]}); make it a "
          "multiple")
    if batch % processes:
      raise errors.UsageError(f"{name}={batch} must divide over the {processes} processes")
    if phase.ramp_steps:
      check_ramp(phase, accumulation, data_shards, processes)
  if config.eval.batch_size % processes:
    raise errors.UsageError(f"eval.batch_size={config.eval.batch_size} must divide over the "
                            f"{processes} processes")
  if config.eval.batch_size % data_shards:
    raise errors.UsageError(f"eval.batch_size={config.eval.batch_size} does not divide over the "
                            f"{data_shards} data shards")
  for phase in phases(config):
    phase.model(bert)  # the phase's own model fields are valid
    if phase.max_seq_length > bert.max_position_embeddings:
      raise errors.UsageError(f"sequence length {phase.max_seq_length} is above the model's "
                              f"max_position_embeddings={bert.max_position_embeddings}; raise "
                              "model.max_position_embeddings or shorten the sequences")
    if config.objective != "ltr":
      for split in ("train", "eval"):
        masking_config(config, phase.max_predictions, split).check_length(phase.max_seq_length)
  if config.data.static and config.objective == "ltr":
    raise errors.UsageError(
        "data.static masks the data once, for the masked-LM objectives; the ltr "
        "objective has nothing to mask: set --config.data.static=false")
  optim.make_optimizer(config)  # its settings' refusals, before the data is built
  if config.eval.every_steps > 0 and config.data.eval_percent == 0:
    raise errors.UsageError("data.eval_percent=0 holds no document out, but eval.every_steps="
                            f"{config.eval.every_steps} evaluates: hold some out or set "
                            "--config.eval.every_steps=0")
  return shape


def stage_accumulation(rows: int, micro: int) -> int:
  """Micro-batches of a warmup step of `rows` rows: as few as keep each within
  the configured micro-batch (`micro` rows)."""
  return -(-rows // micro)


def check_ramp(phase: Phase, accumulation: int, data_shards: int, processes: int) -> None:
  """Every batch size of the batch-size warmup divides into micro-batches that
  divide over the data shards."""
  start, batch = phase.ramp_start, phase.batch_size
  if start <= 0 or batch % start:
    raise errors.UsageError(f"train.batch_ramp_start={start} must divide train.batch_size="
                            f"{batch} (the warmup's batches are its multiples)")
  if start % processes:
    raise errors.UsageError(f"train.batch_ramp_start={start} must divide over the "
                            f"{processes} processes")
  micro = batch // accumulation
  for rows in range(start, batch + 1, start):
    parts = stage_accumulation(rows, micro)
    if rows % parts or (rows // parts) % data_shards:
      raise errors.UsageError(
          f"the warmup's batch of {rows} rows does not divide into micro-batches of at most "
          f"{micro} (train.batch_size / train.accumulation_steps) that divide over the "
          f"{data_shards} data shards; choose train.batch_ramp_start to make it so")
