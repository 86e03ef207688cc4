"""A loss that leaves its recent range: a run that diverged, stopped before it
saves diverged weights; a loss that moved to a new level, followed there.

Non-finite steps are skipped by the step itself (`bertjax.train`); a run can
also diverge with a finite loss (a learning rate mistyped by a few orders of
magnitude drives it to 1e16), and its checkpoints would then replace the good
ones. The guard keeps the losses of the last `window` steps that were in range,
with their gradient norms, and calls a step's loss out of range when it is
above `factor` times their median and `MARGIN` above it (a converged
fine-tuning run's median of 0.01 makes a batch at 0.05 no divergence). A
checkpoint is not saved while the last loss is out of range (the trainer waits
for it to come back): a short spike that comes back costs a delayed save,
nothing else.

`steps` losses out of range in a row are judged:

- A shift: the loss moved to a new level and stays there (a new data mix).
  Every one of those losses is at most `max_shift` x the window's median, the
  median of their later half is at most `max_rise` x that of their earlier half
  (the loss is not still rising), and every gradient norm among them is finite
  and at most `max_grad_ratio` x the window's median norm. The window is
  re-based on those steps, with a warning, and saves go on.
- Anything else stops the run, saying why and where a rerun resumes: a loss
  orders of magnitude up, a loss that keeps rising, or gradients that blew up.

A window's losses are of one phase and one data stream (`begin`): when either
changes, the window starts empty. The steps out of range when that happens, or
when the run ends (`conclude`), have no later step to wait for: they are judged
at once, as `steps` of them would be.
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Any, Callable

from absl import logging
import ml_collections

from bertjax import errors

MARGIN = 1.0  # in the loss's units (nats of cross-entropy): less is never divergence


class DivergenceGuard:
  """Watches a run's loss, step by step.

  Args:
    factor: A loss above `factor` x the recent median is out of range; 0
      turns the guard off.
    steps: Out-of-range steps in a row that are judged (re-based or stopped).
    window: In-range steps the median is taken over.
    recent: The in-range losses of a checkpoint (`recent`), to go on from.
    recent_grad_norms: The gradient norms of those steps (`state`).
    max_shift: The highest loss of a shift, in times the recent median; 0
      never re-bases (`steps` out of range stop the run).
    max_rise: How far the later half of a shift's steps may be above its
      earlier half (medians): more is a loss still rising.
    max_grad_ratio: The highest gradient norm of a shift, in times the recent
      median norm.
    of: What the window's losses are of (`begin`); None: not said yet.
  """

  def __init__(self, factor: float, steps: int, window: int = 100,
               recent: list[float] | None = None, *,
               recent_grad_norms: list[float] | None = None, max_shift: float = 10.0,
               max_rise: float = 1.2, max_grad_ratio: float = 10.0,
               of: dict[str, Any] | None = None):
    if factor and factor <= 1:
      raise errors.UsageError(f"divergence.factor={factor}: give a bound above 1 (times the "
                              "recent median loss), or 0 to turn the guard off")
    if steps < 1 or window < 1:
      raise errors.UsageError(f"divergence.steps={steps} and divergence.window={window} must "
                              "be >= 1")
    if max_shift and factor and max_shift <= factor:
      raise errors.UsageError(f"divergence.max_shift={max_shift}: give a bound above "
                              f"divergence.factor={factor} (times the recent median loss), or 0 "
                              "to never re-base the range")
    if max_rise < 1 or max_grad_ratio < 1:
      raise errors.UsageError(f"divergence.max_rise={max_rise} and divergence.max_grad_ratio="
                              f"{max_grad_ratio} must be >= 1")
    self.factor, self.steps = factor, steps
    self.max_shift, self.max_rise, self.max_grad_ratio = max_shift, max_rise, max_grad_ratio
    self.of = of
    self._recent: collections.deque[float] = collections.deque(recent or (), maxlen=window)
    self._norms: collections.deque[float] = collections.deque(recent_grad_norms or (),
                                                              maxlen=window)
    # (step, loss, gradient norm or None) out of range, in a row
    self._out: list[tuple[int, float, float | None]] = []

  @classmethod
  def from_config(cls, settings: ml_collections.ConfigDict,
                  state: dict[str, Any] | None = None,
                  of: dict[str, Any] | None = None) -> DivergenceGuard:
    """The guard of `config.divergence`, going on from a checkpoint's `state`.

    Args:
      settings: `config.divergence`.
      state: A checkpoint's data state (`state()` is in it), or None.
      of: What the checkpoint's losses are of when it does not say (saved
        before it did).
    """
    state = state or {}
    return cls(settings.factor, settings.steps, settings.window, state.get("recent_losses"),
               recent_grad_norms=state.get("recent_grad_norms"),
               max_shift=settings.max_shift, max_rise=settings.max_rise,
               max_grad_ratio=settings.max_grad_ratio,
               of=state.get("recent_of", of) if state.get("recent_losses") else None)

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

  def update(self, step: int, loss: float, advice: Callable[[], str],
             grad_norm: float | None = None) -> None:
    """Takes the loss of `step` (a non-finite one is left to the skip guard).

    Args:
      advice: What the error says to do, with where a rerun resumes (called
        when the run stops).
      grad_norm: The step's gradient norm, before clipping (None: not
        measured; the losses alone then tell a shift).

    Raises:
      TrainingStoppedError: `steps` losses in a row were out of range, and
        they are not a shift to a new level.
    """
    if not self.factor or not math.isfinite(loss):
      return
    if loss <= self.bound():
      self._recent.append(loss)
      if grad_norm is not None and math.isfinite(grad_norm):
        self._norms.append(grad_norm)
      self._out.clear()
      return
    self._out.append((step, loss, grad_norm))
    if len(self._out) >= self.steps:
      self._judge(advice, "no checkpoint was saved since")

  def begin(self, of: dict[str, Any], advice: Callable[[], str], ended: str) -> None:
    """The losses from here on are of `of` (the phase and the data, as the
    trainer names them). A window of other losses ends here: its steps out of
    range are judged at once (`conclude`), and the window starts empty.

    Args:
      advice: As `update`'s.
      ended: What ended the steps out of range, for the error ("phase 0
        ended there, with no checkpoint saved since").

    Raises:
      TrainingStoppedError: the steps out of range are not a shift.
    """
    if self.of is not None and self.of != of and (self._recent or self._out):
      self.conclude(advice, ended)
      changed = ", ".join(f"{name} {self.of.get(name)} -> {value}" for name, value in of.items()
                          if self.of.get(name) != value)
      logging.info("The loss's range starts anew (%s): the losses before were of another "
                   "phase or other data", changed)
      self._recent.clear()
      self._norms.clear()
    self.of = of

  def conclude(self, advice: Callable[[], str], ended: str) -> None:
    """Judges the steps out of range now, as `steps` of them would be: no step
    comes after them to wait for (the run's or the phase's end). A shift
    re-bases the range (the last step is then in range and saved).

    Args:
      advice: As `update`'s.
      ended: What ended them, for the error ("the run ended there: its
        last step is not saved").

    Raises:
      TrainingStoppedError: the steps out of range are not a shift.
    """
    if self._out:
      self._judge(advice, ended)

  def _judge(self, advice: Callable[[], str], ended: str) -> None:
    """Re-bases the range on the steps out of range, or stops the run."""
    reason = self._not_a_shift()
    if reason is None:
      self._rebase()
      return
    step, loss, _ = self._out[-1]
    count, first = len(self._out), self._out[0][0]
    span = f" for {count} steps in a row since step {first}" if count > 1 else ""
    raise errors.TrainingStoppedError(
        f"the loss diverged: {loss:.4g} at step {step}, above {self.factor:g} x its recent "
        f"median ({statistics.median(self._recent):.4g}){span}, {reason}; {ended}; "
        f"{advice()}")

  def _not_a_shift(self) -> str | None:
    """Why the steps out of range are not a shift to a new level (None: they are)."""
    if not self.max_shift:
      return "and divergence.max_shift=0 never re-bases the range"
    median = statistics.median(self._recent)
    losses = [loss for _, loss, _ in self._out]
    if max(losses) > self.max_shift * median:
      return (f"up to {max(losses) / median:.3g} x that median, beyond "
              f"divergence.max_shift={self.max_shift:g} (a blow-up, not a new level)")
    norms = [norm for _, _, norm in self._out if norm is not None]
    if not all(math.isfinite(norm) for norm in norms):
      return "with non-finite gradient norms"
    usual = statistics.median(self._norms) if self._norms else None
    if norms and usual is not None and max(norms) > self.max_grad_ratio * usual:
      ratio = f"{max(norms) / usual:.3g} x" if usual > 0 else f"{max(norms):.3g}, above"
      return (f"with gradient norms up to {ratio} their recent median, beyond "
              f"divergence.max_grad_ratio={self.max_grad_ratio:g}")
    half = len(losses) // 2
    if half:
      earlier, later = statistics.median(losses[:half]), statistics.median(losses[-half:])
      if later > self.max_rise * earlier:
        return (f"still rising (the later half of those steps {later / earlier:.3g} x the "
                f"earlier, by their medians, beyond divergence.max_rise={self.max_rise:g})")
    return None

  def _rebase(self) -> None:
    """The steps out of range become the range: the loss moved and stays."""
    first, (step, _, _) = self._out[0][0], self._out[-1]
    before = statistics.median(self._recent)
    losses = [loss for _, loss, _ in self._out]
    norms = [norm for _, _, norm in self._out if norm is not None]
    usual = statistics.median(self._norms) if self._norms else None
    now = statistics.median(losses)
    gradients = (f", with gradient norms at most {max(norms) / usual:.3g} x the earlier median"
                 if norms and usual else "")
    held = f"the {len(losses)} steps since step {first}" if len(losses) > 1 else f"step {first}"
    logging.warning(
        "The loss's range is re-based at step %d: %s held a new level (median %.4g, %.3g x the "
        "earlier %.4g), not rising%s: a shift (new data, a new phase), not a divergence; "
        "checkpoints are saved at this level", step, held, now, now / before, before, gradients)
    self._recent.clear()
    self._recent.extend(losses)
    self._norms.clear()
    self._norms.extend(norm for norm in norms if math.isfinite(norm))
    self._out.clear()

  def describe(self) -> str:
    """'loss 52.1 at step 340, above 3 x its recent median 7.2' (when out of range)."""
    step, loss, _ = self._out[-1]
    return (f"loss {loss:.4g} at step {step}, above {self.factor:g} x its recent median "
            f"{statistics.median(self._recent):.4g}")

  def state(self) -> dict[str, Any]:
    """What a checkpoint keeps: the window's losses and gradient norms, and
    what they are of (`begin`)."""
    return {"recent_losses": self.recent, "recent_grad_norms": list(self._norms),
            "recent_of": self.of}
