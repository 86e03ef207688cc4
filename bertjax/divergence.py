"""A loss that leaves its recent range: a run that diverged, stopped before it
saves diverged weights.

Non-finite steps are skipped by the step itself (`bertjax.train`); a run can
also diverge with a finite loss (a learning rate mistyped by a few orders of
magnitude drives it to 1e16), and its checkpoints would then replace the good
ones. The guard keeps the losses of the last `window` steps that were in range
and calls a step's loss out of range when it is above `factor` times their
median and `MARGIN` above it (a converged fine-tuning run's median of 0.01
makes a batch at 0.05 no divergence). A checkpoint is not saved while the last
loss is out of range (the trainer waits for it to come back), and `steps` out
of range in a row stop the run, saying where a rerun resumes. A short spike that comes back costs a
delayed save, nothing else.
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Any, Callable

from bertjax import errors

MARGIN = 1.0  # in the loss's units (nats of cross-entropy): less is never divergence


class DivergenceGuard:
  """Watches a run's loss, step by step.

  Args:
    factor: A loss above `factor` x the recent median is out of range; 0
      turns the guard off.
    steps: Out-of-range steps in a row that stop the run.
    window: In-range steps the median is taken over.
    recent: The in-range losses of a checkpoint (`recent`), to go on from.
  """

  def __init__(self, factor: float, steps: int, window: int = 100,
               recent: list[float] | None = None):
    if factor and factor <= 1:
      raise errors.UsageError(f"divergence.factor={factor}: give a bound above 1 (times the "
                              "recent median loss), or 0 to turn the guard off")
    if steps < 1 or window < 1:
      raise errors.UsageError(f"divergence.steps={steps} and divergence.window={window} must "
                              "be >= 1")
    self.factor, self.steps = factor, steps
    self._recent: collections.deque[float] = collections.deque(recent or (), maxlen=window)
    self._out: list[tuple[int, float]] = []  # (step, loss) out of range, in a row

  @property
  def recent(self) -> list[float]:
    """The in-range losses the bound is taken from (stored with a checkpoint)."""
    return list(self._recent)

  @property
  def out_of_range(self) -> bool:
    """Whether the last loss was out of range: weights to keep out of a checkpoint."""
    return bool(self._out)

  def diverged_from(self) -> int | None:
    """The first step whose weights are out of range, while the loss is (None
    when it is in range). A step's loss is that of the weights before its
    update, so a checkpoint saved at the step before the first loss out of
    range already holds them."""
    return self._out[0][0] - 1 if self._out else None

  def bound(self) -> float:
    """The largest loss in range."""
    if not self._recent:
      return math.inf
    median = statistics.median(self._recent)
    return max(self.factor * median, median + MARGIN)

  def update(self, step: int, loss: float, advice: Callable[[], str]) -> None:
    """Takes the loss of `step` (a non-finite one is left to the skip guard).

    Args:
      advice: What the error says to do, with where a rerun resumes (called
        when the run stops).

    Raises:
      TrainingStoppedError: `steps` losses in a row were out of range.
    """
    if not self.factor or not math.isfinite(loss):
      return
    if loss <= self.bound():
      self._recent.append(loss)
      self._out.clear()
      return
    self._out.append((step, loss))
    if len(self._out) >= self.steps:
      first = self._out[0][0]
      raise errors.TrainingStoppedError(
          f"the loss diverged: {loss:.4g} at step {step}, above {self.factor:g} x its recent "
          f"median ({statistics.median(self._recent):.4g}) for {len(self._out)} steps in a "
          f"row since step {first}, and no checkpoint was saved since; {advice()}")

  def describe(self) -> str:
    """'loss 52.1 at step 340, above 3 x its recent median 7.2' (when out of range)."""
    step, loss = self._out[-1]
    return (f"loss {loss:.4g} at step {step}, above {self.factor:g} x its recent median "
            f"{statistics.median(self._recent):.4g}")

  def state(self) -> dict[str, Any]:
    return {"recent_losses": self.recent}
