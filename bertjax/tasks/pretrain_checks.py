"""Checks of a pre-training config before anything is compiled: batch sizes
against the mesh, gradient accumulation and processes (the batch-size warmup's
too), sequence lengths against the model, and every setting's range."""

from __future__ import annotations

import jax
import ml_collections

from bertjax import errors, sharding
from bertjax.models import EncoderConfig, family
from bertjax.phases import Phase, phases
from bertjax.tasks.pretrain_data import masking_config, vocabulary_file


def validate(config: ml_collections.ConfigDict, mesh_devices: int) -> tuple[int, ...]:
  """Checks the config before anything is compiled; returns the mesh shape.

  Raises:
    ValueError: saying what to change.
  """
  bert = EncoderConfig.from_run_config(config)  # hidden size vs heads and the like
  family.of(bert).check_objective(config.objective)
  vocabulary_file(config, "")  # a data.tokenizer it can train
  shape = sharding.mesh_shape([config.mesh.data, config.mesh.fsdp, config.mesh.tensor],
                              mesh_devices)
  accumulation = config.train.accumulation_steps
  data_shards = shape[0] * shape[1]
  processes = jax.process_count()
  for phase in phases(config):
    batch = phase.batch_size
    name = "train.batch_size" if phase.index == 0 else "train.long_batch_size"
    if accumulation < 1 or batch % accumulation:
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
  if config.data.static and config.data.static_dupe_factor < 1:
    raise errors.UsageError(f"data.static_dupe_factor must be >= 1, got "
                            f"{config.data.static_dupe_factor}")
  if config.train.total_steps < 1:
    raise errors.UsageError(f"train.total_steps must be positive, got {config.train.total_steps}")
  if config.checkpoint.every_seconds < 0:
    raise errors.UsageError(f"checkpoint.every_seconds must be >= 0 (0: save by steps only), "
                            f"got {config.checkpoint.every_seconds}")
  for name, value in (("checkpoint.every_steps", config.checkpoint.every_steps),
                      ("checkpoint.max_to_keep", config.checkpoint.max_to_keep),
                      ("log_every_steps", config.log_every_steps),
                      ("max_consecutive_skips", config.max_consecutive_skips)):
    if value is not None and value < 1:  # max_to_keep=None keeps every step
      raise errors.UsageError(f"{name} must be >= 1, got {value}")
  if config.data.worker_count < -1:
    raise errors.UsageError(
        f"data.worker_count={config.data.worker_count}: give the loader processes "
        "(0: in the training process), or -1 to size them for the devices")
  if config.data.max_sequences_per_row < 1:
    raise errors.UsageError(
        f"data.max_sequences_per_row={config.data.max_sequences_per_row} must be "
        ">= 1 (1: one sequence a row; more: packed rows)")
  eval_percent = config.data.eval_percent
  if not 0 <= eval_percent < 100:
    raise errors.UsageError(f"data.eval_percent={eval_percent} must be in [0, 100): the share of "
                     "documents held out for evaluation")
  eval_rate = config.eval.masked_lm_prob
  if eval_rate != -1 and not 0 < eval_rate < 1:
    raise errors.UsageError(f"eval.masked_lm_prob={eval_rate} must be in (0, 1), or -1 for "
                            "data.masked_lm_prob's")
  if config.eval.every_steps > 0:
    if eval_percent == 0:
      raise errors.UsageError("data.eval_percent=0 holds no document out, but eval.every_steps="
                              f"{config.eval.every_steps} evaluates: hold some out or set "
                              "--config.eval.every_steps=0")
    if config.eval.batches < 1:
      raise errors.UsageError(f"eval.batches must be >= 1 to evaluate, got {config.eval.batches} "
                              "(--config.eval.every_steps=0 turns evaluation off)")
  if config.get("price_per_chip_hour", 0.0) < 0:
    raise errors.UsageError(f"price_per_chip_hour={config.price_per_chip_hour} must be >= 0 "
                            "(0: no cost on the progress lines)")
  warmup, total = config.optimizer.warmup_steps, config.train.total_steps
  if warmup < 0:
    raise errors.UsageError(f"optimizer.warmup_steps={warmup} must be >= 0")
  if warmup >= total:  # a shortened run: the learning rate would end at its peak
    raise errors.UsageError(
        f"optimizer.warmup_steps={warmup} is the whole run (train.total_steps={total}): set "
        "--config.optimizer.warmup_steps below it (the paper warms up over 1% of the steps)")
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
  if phase.ramp_steps > phase.end - phase.start:
    raise errors.UsageError(f"train.batch_ramp_steps={phase.ramp_steps} is longer than the "
                            f"first phase ({phase.end - phase.start} steps)")
