"""Whether a pre-training run's schedule fits in its length, every conflict at once.

A run shortened with `--config.train.total_steps=N` keeps the config's
batch-size warmup, learning-rate warmup and decay, each sized for the full
run. Each of them that no longer fits is refused together, in one line that
names the `--config.` flag to change and a value that fits beside the others,
where a config enters (`bertjax.usage.parse_flags`, before anything starts or
is written; `bertjax.tasks.run`, before the workdir is made, for a config
built in Python; `bertjax.tasks.pretrain_checks.validate`): never one at a
time, and never after the vocabulary and the data were built.
"""

from __future__ import annotations

from typing import Any

from bertjax import errors


def misfit(config: Any, prefix: str = "--config.") -> str | None:
  """The line refusing every part of a pre-training schedule that does not fit
  in `train.total_steps` (None: all of it fits, or the config is not a
  pre-training one).

  Args:
    config: A run's config (an `ml_collections.ConfigDict`).
    prefix: Put before each field's dotted name: a flag (`--config.`).
  """
  if config.get("task") != "pretrain":
    return None
  train, optimizer = config.train, config.optimizer
  total = train.total_steps
  long_from = train.get("long_from_step", -1)
  first = long_from if long_from is not None and 0 <= long_from < total else total
  tenth = max(total // 10, 1)
  conflicts: list[str] = []
  fits: list[str] = []

  def refuse(field: str, value: int, why: str, fit: int) -> None:
    conflicts.append(f"{prefix}{field}={value} {why}")
    fits.append(f"{prefix}{field}={fit}")

  ramp = train.get("batch_ramp_steps", 0) or 0
  if ramp > first:
    phase = (f"the first phase ({prefix}train.long_from_step={long_from})" if first < total
             else "the run")
    refuse("train.batch_ramp_steps", ramp, f"is longer than {phase}", min(tenth, first))
  warmup = fit_warmup = optimizer.warmup_steps
  if warmup >= total:  # the learning rate would end at its peak
    fit_warmup = tenth if tenth < total else 0
    refuse("optimizer.warmup_steps", warmup, "is the whole run", fit_warmup)
  if optimizer.get("schedule", "linear") == "wsd":
    decay = optimizer.get("decay_steps", 0) or 0
    if decay > total - fit_warmup:
      refuse("optimizer.decay_steps", decay,
             "does not fit after the warmup (the warmup and the decay take at most "
             f"{total} steps together)", min(total - fit_warmup, max(total // 5, 1)))
  restarts = optimizer.get("restarts", ()) or ()
  late = [entry[0] for entry in restarts if isinstance(entry, (tuple, list)) and entry
          and isinstance(entry[0], (int, float)) and not fit_warmup <= entry[0] < total]
  if late:
    conflicts.append(f"optimizer.restarts (set in the config file) restarts at step "
                     f"{late[0]}, outside the run's steps after its warmup: give a config "
                     "file of your own without it")
  if not conflicts:
    return None
  fit = f"; these fit: {' '.join(fits)}" if fits else ""
  return (f"the schedule does not fit in {prefix}train.total_steps={total}: "
          f"{'; '.join(conflicts)}{fit} (or raise {prefix}train.total_steps)")


def check(config: Any, prefix: str = "--config.") -> None:
  """Refuses a pre-training config whose schedule does not fit in its run.

  Raises:
    errors.UsageError: naming each conflict (`misfit`).
  """
  line = misfit(config, prefix)
  if line is not None:
    raise errors.UsageError(line)
