"""A pre-training run's phases: the steps at one sequence length and batch size.

A run is one or two phases: `train.max_seq_length` (128 in the paper) until
`train.long_from_step`, then `train.long_seq_length` (512) to the end, with
`train.long_batch_size` sequences a step, if set, and the model fields
`train.long_model` changes (ModernBERT's context extension raises the global
rotary base). The trainer, the compile tool, the data benchmarks and a model
loaded from a run's checkpoint all read them from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from bertjax import errors
from bertjax.models.config import COMPUTATION_FIELDS, EncoderConfig

# Model fields a phase may change (`train.long_model`): none changes a
# parameter's shape, so one state runs through both phases.
PHASE_MODEL_FIELDS = ("global_rope_theta", "local_rope_theta", "local_attention",
                      "hidden_dropout_prob", "attention_dropout_prob", "mlp_dropout_prob",
                      "attention_output_dropout_prob",
                      "attention_impl", "remat_policy")


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps [start, end) at one sequence length and batch size (sequences a
  step), with the model fields the phase changes (ModernBERT's context
  extension raises the global rotary base)."""

  index: int
  start: int
  end: int
  max_seq_length: int
  max_predictions: int
  batch_size: int
  model_changes: tuple[tuple[str, Any], ...] = ()
  ramp_start: int = 0  # batch-size warmup: the first steps' batch, in its multiples ...
  ramp_steps: int = 0  # ... below `batch_size` over these steps (0: none), then all of it

  def model(self, base: EncoderConfig) -> EncoderConfig:
    """The run's model (`base`) as this phase trains it."""
    return base.replace(**dict(self.model_changes)) if self.model_changes else base

  def trained_model(self, base: EncoderConfig) -> EncoderConfig:
    """The run's model (`base`) as this phase's weights compute: the phase's
    changes but those of training only (dropout) and of how it computes
    (`COMPUTATION_FIELDS`), which are the loader's to choose."""
    changes = {name: value for name, value in self.model_changes
               if "dropout" not in name and name not in COMPUTATION_FIELDS}
    return base.replace(**changes) if changes else base

  @property
  def loader_batch(self) -> int:
    """Sequences (rows) of one loader batch: a step takes `parts(step)` of them."""
    return self.ramp_start if self.ramp_steps else self.batch_size

  def parts(self, step: int) -> int:
    """Loader batches of the step after `step` steps: during the batch-size
    warmup, 1, 2, ... up to one short of the whole batch, each in an equal
    run of steps, then all of the batch. ModernBERT's packer
    (`BatchSizeWarmupScheduler`) steps through the sizes so: each size until
    its share of the warmup's tokens (in proportion to the size) is used, the
    whole batch once all of them are; `ramp_steps` is that many steps."""
    full = self.batch_size // self.loader_batch
    if not self.ramp_steps or step >= self.start + self.ramp_steps:
      return full
    return 1 + (step - self.start) * max(full - 1, 1) // self.ramp_steps

  def part_runs(self, begin: int, end: int) -> list[tuple[int, int]]:
    """The steps after `begin` up to `end` steps of this phase, as (loader
    batches a step, steps) in order: `parts` of each step, counted a run of
    equal sizes at a time (a warmup of thousands of steps has a few sizes)."""
    begin, end = max(begin, self.start), min(end, self.end)
    if begin >= end:
      return []
    full = self.batch_size // self.loader_batch
    ramp_end = self.start + self.ramp_steps
    runs = []
    if self.ramp_steps:
      # Step start + k takes 1 + floor(k * sizes / ramp_steps) batches: j + 1
      # for k from ceil(j * ramp_steps / sizes) up to that of j + 1.
      sizes = max(full - 1, 1)
      for j in range(sizes):
        first = self.start + -(-j * self.ramp_steps // sizes)
        after = self.start + -(-(j + 1) * self.ramp_steps // sizes)
        steps = min(after, end, ramp_end) - max(first, begin)
        if steps > 0:
          runs.append((j + 1, steps))
    if end > max(begin, ramp_end):
      runs.append((full, end - max(begin, ramp_end)))
    return runs


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  """The run's phases from `config.train`.

  Raises:
    errors.UsageError: `train.long_model` names a field a phase cannot change.
  """
  train_config = config.train
  total = train_config.total_steps
  long_from = train_config.long_from_step
  batch = train_config.batch_size
  ramp = {"ramp_start": train_config.get("batch_ramp_start", 0),
          "ramp_steps": train_config.get("batch_ramp_steps", 0)}
  if ramp["ramp_steps"] <= 0:
    ramp = {}
  if long_from is None or long_from < 0 or long_from >= total:
    return [Phase(0, 0, total, train_config.max_seq_length, train_config.max_predictions, batch,
                  **ramp)]
  changes = train_config.get("long_model") or {}
  changes = changes.to_dict() if hasattr(changes, "to_dict") else dict(changes)
  fixed = sorted(set(changes) - set(PHASE_MODEL_FIELDS))
  if fixed:
    raise errors.UsageError(f"train.long_model changes {fixed}, which a phase cannot change "
                            f"(the parameters would not carry over); it may change "
                            f"{', '.join(PHASE_MODEL_FIELDS)}")
  long_batch = train_config.get("long_batch_size", -1)
  return [Phase(0, 0, long_from, train_config.max_seq_length, train_config.max_predictions,
                batch, **ramp),
          Phase(1, long_from, total, train_config.long_seq_length,
                train_config.long_max_predictions, long_batch if long_batch > 0 else batch,
                tuple(sorted(changes.items())))]


def phase_at(config: ml_collections.ConfigDict, step: int) -> Phase:
  """The phase whose steps the run had reached after `step` steps (the first
  one at step 0)."""
  return [phase for phase in phases(config) if phase.start < max(step, 1)][-1]

