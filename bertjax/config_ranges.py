"""The range of every number a config holds, in one table, and its check.

A learning rate of -1e-4 trains with a rising loss, a dropout of 1.5 runs, a
batch of 0 fails deep in the data pipeline: each is refused instead, in one
line naming the field, where a config enters: `bertjax.usage.parse_flags`
(every command's `--config`, before anything starts or is written) and
`bertjax.tasks.run` (a config built in Python, the sweep's runs).
`bertjax.tasks.pretrain_checks.validate` checks too, for a pre-training config
handed to it directly (the compile tool's report).

`RANGES` maps a field's dotted name, or a pattern (`mesh.*`) for a family of
fields, to its `Range`; the long phase's model fields (`train.long_model.*`)
have the model's. A value outside the numbers is accepted where it means
something (-1: "the devices left"); None (a field left unset) and fields the
table does not name (a config's own, added with `config.unlocked()`) are not
checked. Ranges here are each field's own; settings that bound each other
are checked by `bertjax.schedule_fit` (the warmup and decay within the run)
and by the tasks (heads dividing the width). docs/configs.md's field tables show each range
(`bertjax.tools.config_fields`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Iterator

from bertjax import errors

NEGATIVE = "negative"  # in `Range.also`: any value below 0


@dataclasses.dataclass(frozen=True)
class Range:
  """Finite numbers from `low` to `high` (each end included unless open), and
  values outside them that mean something.

  Attributes:
    also: (value, what it means) accepted besides; the value `NEGATIVE`
      stands for every number below 0.
  """

  low: float = -math.inf
  high: float = math.inf
  low_open: bool = False
  high_open: bool = False
  also: tuple[tuple[float | str, str], ...] = ()

  def __contains__(self, value: float) -> bool:
    if not math.isfinite(value):  # NaN and infinities are never a setting
      return False
    if any(value == special or special == NEGATIVE and value < 0 for special, _ in self.also):
      return True
    above = self.low < value if self.low_open else self.low <= value
    below = value < self.high if self.high_open else value <= self.high
    return above and below

  def or_(self, value: float | str, meaning: str) -> Range:
    """This range, and `value` (meaning `meaning`) besides."""
    return dataclasses.replace(self, also=(*self.also, (value, meaning)))

  def __str__(self) -> str:
    if math.isfinite(self.low) and math.isfinite(self.high):
      text = (f"in {'(' if self.low_open else '['}{self.low:g}, "
              f"{self.high:g}{')' if self.high_open else ']'}")
    elif math.isfinite(self.low):
      text = f"{'>' if self.low_open else '>='} {self.low:g}"
    elif math.isfinite(self.high):
      text = f"{'<' if self.high_open else '<='} {self.high:g}"
    else:
      text = "a finite number"
    return text + "".join(
        f", or {special if special == NEGATIVE else format(special, 'g')} ({meaning})"
        for special, meaning in self.also)


@dataclasses.dataclass(frozen=True)
class ByTask:
  """A field whose range differs between pre-training and fine-tuning."""

  pretrain: Range
  finetune: Range


def above(low: float) -> Range:
  """Numbers > `low`."""
  return Range(low=low, low_open=True)


def at_least(low: float) -> Range:
  """Numbers >= `low`."""
  return Range(low=low)


def between(low: float, high: float, *, low_open: bool = False,
            high_open: bool = False) -> Range:
  """Numbers from `low` to `high`, each end included unless open."""
  return Range(low=low, high=high, low_open=low_open, high_open=high_open)


POSITIVE = above(0)            # rates, epsilons, rotary bases
NON_NEGATIVE = at_least(0)     # weight decay, clipping (0: none), steps that may be 0
COUNT = at_least(1)            # sizes, batches, intervals
DROPOUT = between(0, 1, high_open=True)   # 1 would drop everything
SHARE = between(0, 1)          # shares and fractions, both ends meaningful
DECAY = between(0, 1, high_open=True)     # Adam's betas: 1 never forgets
ALL_DEVICES = COUNT.or_(-1, "the devices left")
# The data loader's shortest sequence (`bertjax.data.loader.LoaderConfig`).
PRETRAIN_LENGTH = at_least(8)

RANGES: dict[str, Range | ByTask] = {
    # Both kinds of run.
    "seed": NON_NEGATIVE,  # numpy's generators take no negative seed
    "log_every_steps": COUNT,
    "max_consecutive_skips": COUNT,  # 0 would stop at the first step
    "mesh.*": ALL_DEVICES,
    "train.batch_size": COUNT,
    # Fine-tuning: negative takes the checkpoint's own (`finetune.load_model`).
    "model.hidden_dropout_prob": ByTask(DROPOUT, DROPOUT.or_(NEGATIVE, "the checkpoint's own")),
    "model.attention_dropout_prob": ByTask(DROPOUT,
                                           DROPOUT.or_(NEGATIVE, "the checkpoint's own")),
    "divergence.factor": above(1).or_(0, "off"),
    "divergence.steps": COUNT,
    "divergence.window": COUNT,
    "divergence.max_shift": above(1).or_(0, "never re-base"),
    "divergence.max_rise": at_least(1),
    "divergence.max_grad_ratio": at_least(1),

    # The model (`EncoderConfig`).
    "model.vocab_size": COUNT,
    "model.vocab_pad_multiple": COUNT,
    "model.hidden_size": COUNT,
    "model.num_layers": COUNT,
    "model.num_heads": COUNT,
    "model.intermediate_size": COUNT,
    "model.max_position_embeddings": COUNT,
    "model.type_vocab_size": COUNT,
    "model.mlp_dropout_prob": DROPOUT,
    "model.attention_output_dropout_prob": DROPOUT.or_(NEGATIVE, "attention_dropout_prob's"),
    "model.classifier_dropout": DROPOUT,
    "model.layer_norm_eps": POSITIVE,
    "model.pad_token_id": NON_NEGATIVE,
    "model.global_attention_every": COUNT,
    "model.local_attention": COUNT,
    "model.*_rope_theta": POSITIVE,

    # Pre-training's data.
    "data.vocab_size": at_least(6),  # the 5 special tokens and one more
    "data.masked_lm_prob": between(0, 1, low_open=True, high_open=True),
    "data.mask_rate": SHARE,
    "data.random_rate": SHARE,
    "data.short_seq_prob": SHARE,
    "data.shuffle_window": COUNT,  # 1: no shuffle
    "data.worker_count": NON_NEGATIVE.or_(-1, "sized for the devices"),
    "data.read_ahead": NON_NEGATIVE.or_(-1, "64 on gs://, else 0"),
    "data.max_sequences_per_row": COUNT,
    "data.packing_window": COUNT,
    "data.eval_percent": between(0, 100, high_open=True),
    "data.static_dupe_factor": COUNT,
    # Pre-training's steps and batches.
    "train.accumulation_steps": COUNT,
    "train.total_steps": COUNT,
    "train.max_seq_length": PRETRAIN_LENGTH,
    "train.max_predictions": COUNT,
    "train.long_from_step": NON_NEGATIVE.or_(-1, "one phase"),
    "train.long_seq_length": PRETRAIN_LENGTH,
    "train.long_max_predictions": COUNT,
    "train.long_batch_size": COUNT.or_(-1, "train.batch_size"),
    "train.batch_ramp_start": NON_NEGATIVE,  # 0: the whole batch from the start
    "train.batch_ramp_steps": NON_NEGATIVE,
    # Pre-training's optimizer.
    "optimizer.learning_rate": POSITIVE,
    "optimizer.long_learning_rate": POSITIVE.or_(-1, "optimizer.learning_rate"),
    "optimizer.warmup_steps": NON_NEGATIVE,
    "optimizer.decay_steps": NON_NEGATIVE,
    "optimizer.final_fraction": SHARE,
    "optimizer.weight_decay": NON_NEGATIVE,
    "optimizer.b1": DECAY,
    "optimizer.b2": DECAY,
    "optimizer.eps": POSITIVE,
    "optimizer.max_grad_norm": NON_NEGATIVE,  # 0: no clipping
    # Pre-training's saves, evaluations and reports.
    "checkpoint.every_steps": COUNT,
    "checkpoint.every_seconds": NON_NEGATIVE,  # 0: by steps only
    "checkpoint.max_to_keep": COUNT,  # None keeps every save
    "eval.every_steps": NON_NEGATIVE,  # 0: no evaluation
    "eval.batches": COUNT,
    "eval.batch_size": COUNT,
    "eval.masked_lm_prob": between(0, 1, low_open=True, high_open=True).or_(
        -1, "data.masked_lm_prob"),
    "price_per_chip_hour": NON_NEGATIVE,  # 0: no cost said
    "profile.start_step": NON_NEGATIVE.or_(-1, "no trace"),
    "profile.num_steps": COUNT,

    # Fine-tuning.
    "max_seq_length": at_least(3),  # [CLS], a token and [SEP]
    "train.learning_rate": POSITIVE,
    "train.epochs": POSITIVE,
    "train.warmup_proportion": SHARE,
    "train.weight_decay": NON_NEGATIVE,
    "train.eps": POSITIVE,
    "train.max_grad_norm": NON_NEGATIVE,  # 0: no clipping
    "train.eval_batch_size": COUNT,
    # SQuAD.
    "doc_stride": COUNT,
    "max_query_length": COUNT,
    "n_best_size": COUNT,
    "max_answer_length": COUNT,
    "null_score_diff_threshold": Range(),  # a score difference, of either sign
    # The feature-based approach.
    "extract_batch_size": COUNT,
    "lstm.hidden_size": COUNT,
    "lstm.num_layers": COUNT,
    "lstm.dropout_rate": DROPOUT,
}

_LONG_MODEL = "train.long_model."


def range_of(field: str, task: str | None) -> Range | None:
  """The range of `field` (a dotted name) in a config of `task` (None where
  the table names none).

  Args:
    task: `config.task`: "pretrain", else a fine-tuning task.
  """
  if field.startswith(_LONG_MODEL):  # the long phase's model fields: the model's
    field = "model." + field[len(_LONG_MODEL):]
  found = RANGES.get(field)
  if found is None:
    found = next((entry for pattern, entry in RANGES.items()
                  if fnmatch.fnmatchcase(field, pattern)), None)
  if isinstance(found, ByTask):
    found = found.pretrain if task == "pretrain" else found.finetune
  return found


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(config: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
  """(dotted name, value) of each number in `config`, a ConfigDict."""
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _numbers(value, f"{prefix}{key}.")
    elif _is_number(value):
      yield f"{prefix}{key}", value


def _refusal(field: str, value: float, allowed: Range, prefix: str = "--config.") -> str:
  """The line that refuses `value` for `field`."""
  return f"{prefix}{field}={value!r}: must be {allowed}; docs/configs.md lists each field's range"


def out_of_range(config: Any, prefix: str = "--config.") -> str | None:
  """The line refusing the first number of `config` outside its range (None:
  every one is in range)."""
  task = config.get("task")
  for field, value in _numbers(config):
    allowed = range_of(field, task)
    if allowed is not None and value not in allowed:
      return _refusal(field, value, allowed, prefix)
  return None


def check(config: Any, prefix: str = "config.") -> None:
  """Refuses a config that holds a number outside its range.

  Raises:
    errors.UsageError: naming the first such field, its value and its range.
  """
  line = out_of_range(config, prefix)
  if line is not None:
    raise errors.UsageError(line)
