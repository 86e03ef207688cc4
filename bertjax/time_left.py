"""How long a pre-training run has still to go.

Everything still to come counts, each by its work at the speed the run goes
now: the remaining steps of each phase weighed by their model FLOPs (a
batch-size warmup's later, larger batches and a phase at length 512 take
longer a step than the steps timed), the evaluations (as long as the last one
took, for its FLOPs; before the first, at the training steps' rate for their
forward passes) and the compiles of the steps not compiled yet (as long as
this run's compiles took). Checkpoint saves, which mostly overlap the
training, are left out.
"""

from __future__ import annotations

import ml_collections

from bertjax import flops
from bertjax.models import EncoderConfig
from bertjax.phases import Phase


class TimeLeft:
  """A run's remaining time, from the speed of its latest steps."""

  def __init__(self, config: ml_collections.ConfigDict, run_phases: list[Phase],
               model: EncoderConfig):
    self.phases = run_phases
    self.total = config.train.total_steps
    self.eval_every = config.eval.every_steps
    rows = config.eval.batches * config.eval.batch_size
    self.row_flops, self.eval_flops = {}, {}
    for phase in run_phases:
      length, predictions = phase.max_seq_length, phase.max_predictions
      self.row_flops[phase.index] = length * flops.flops_per_token(
          phase.model(model), length, predictions)
      self.eval_flops[phase.index] = rows * length * flops.flops_per_token(
          phase.model(model), length, predictions, training=False)
    self.compiles: dict[tuple[int, int], float] = {}  # (phase, loader batches) -> seconds
    self.eval_seconds_per_flop: float | None = None

  def compiled(self, phase: Phase, parts: int, seconds: float) -> None:
    """The step of `parts` loader batches of `phase` compiled in `seconds`."""
    self.compiles[(phase.index, parts)] = seconds

  def evaluated(self, phase: Phase, seconds: float) -> None:
    """An evaluation of `phase` took `seconds`."""
    self.eval_seconds_per_flop = seconds / self.eval_flops[phase.index]

  def seconds(self, step: int, seconds_per_row: float, evaluating_now: bool = False) -> float:
    """The time the run has left after `step` steps, whose latest took
    `seconds_per_row` a row (a window's time over all of its steps' rows: a
    batch-size warmup's steps differ in size); `evaluating_now`: the
    evaluation at `step` is still to come."""
    current = self._phase_of(step)
    per_flop = seconds_per_row / self.row_flops[current.index]
    training = sum(self._rows_left(phase, step) * self.row_flops[phase.index]
                   for phase in self.phases)
    evaluations = sum(self.eval_flops[self._phase_of(at).index]
                      for at in self._evaluations_left(step, evaluating_now))
    # Forward passes only, at the training steps' rate until one is timed.
    eval_per_flop = per_flop if self.eval_seconds_per_flop is None else self.eval_seconds_per_flop
    compile_s = (sum(self.compiles.values()) / len(self.compiles)) if self.compiles else 0.0
    return (training * per_flop + evaluations * eval_per_flop
            + compile_s * len(self._programs_left(step)))

  def _phase_of(self, step: int) -> Phase:
    """The phase of the step that ends with `step` steps done (the first at 0)."""
    return [phase for phase in self.phases if phase.start < max(step, 1)][-1]

  def _rows_left(self, phase: Phase, step: int) -> int:
    """Rows of the phase's steps after `step` steps."""
    return sum(parts * steps for parts, steps in phase.part_runs(step, phase.end)
               ) * phase.loader_batch

  def _evaluations_left(self, step: int, evaluating_now: bool) -> list[int]:
    if self.eval_every <= 0:
      return []
    first = step if evaluating_now else step + 1
    due = [at for at in range(first + (-first) % self.eval_every, self.total + 1,
                              self.eval_every)]
    return due + ([self.total] if self.total % self.eval_every and first <= self.total else [])

  def _programs_left(self, step: int) -> set[tuple[int, int]]:
    """The steps (phase, loader batches) still to run that are not compiled."""
    needed = {(phase.index, parts) for phase in self.phases
              for parts, _ in phase.part_runs(step, phase.end)}
    return needed - set(self.compiles)
