"""Saving by the wall clock, and a SIGTERM met within the grace really given.

A preempted machine's processes get SIGTERM and, a grace period later,
SIGKILL. The grace is the environment's, not the run's: GKE gives spot pods
about 15 s whatever the pod spec asks, Compute Engine 30 s
(`python -m bertjax.main --grace_seconds`, which the launch scripts set; see
docs/tpu.md). A BERT-large save does not fit in that, so two things bound the
work a preemption loses:

- saves by the clock as well as by steps (`checkpoint.every_seconds`), in the
  background while training goes on: a preemption goes back at most that long
  plus one save's time;
- on SIGTERM, a save only when the measured time of the run's saves fits in
  what is left of the grace; otherwise the run exits at once (status 143, a
  restart resumes) and its log says from which step, and how long before the
  stop that step was saved. A save cut off by SIGKILL is never taken for a
  finished step (orbax commits a step last).

With several processes every decision is process 0's, shared with the others
(`bertjax.hosts.from_process_0`): each host's clock and measured saves differ,
and a save is a collective.
"""

from __future__ import annotations

import time

GRACE_S = 30.0  # seconds between SIGTERM and SIGKILL (main's --grace_seconds)
EXIT_MARGIN_S = 3.0  # after the save: closing the run, its logs, the process
SAVE_MARGIN = 1.25  # a save may take this much longer than the slowest measured


class ExitAtOnce(SystemExit):
  """Ends the run now, abandoning a save in flight (`bertjax.usage` exits
  without waiting for background threads)."""


class SaveClock:
  """When the run's saves started and how long they took.

  Args:
    every_s: Seconds between two saves started by the clock (0: steps only).
  """

  def __init__(self, every_s: float):
    self.every_s = every_s
    self._last_start = time.monotonic()  # the run's start counts as one
    self._in_flight: tuple[int, float] | None = None  # (step, started)
    self._durations: list[float] = []  # of the last few saves, start to finish
    # The newest step this run saved, and when its save started (monotonic).
    self.finished: tuple[int, float] | None = None

  def started(self, step: int) -> None:
    self._last_start = time.monotonic()
    self._in_flight = (step, self._last_start)

  def done(self) -> None:
    """The save in flight has finished (written and committed)."""
    if self._in_flight is None:
      return
    step, start = self._in_flight
    self._durations = (self._durations + [time.monotonic() - start])[-3:]
    self.finished = (step, start)
    self._in_flight = None

  def in_flight(self) -> bool:
    return self._in_flight is not None

  def start_of(self, step: int) -> float | None:
    """When this run started saving `step` (monotonic), if it did."""
    for saved in (self.finished, self._in_flight):
      if saved is not None and saved[0] == step:
        return saved[1]
    return None

  def due(self) -> bool:
    """Whether `every_s` seconds have passed since the last save started."""
    return self.every_s > 0 and time.monotonic() - self._last_start >= self.every_s

  def save_seconds(self) -> float | None:
    """The longest of the last few saves, start to finish (None before one)."""
    return max(self._durations) if self._durations else None

  def in_flight_left(self) -> float | None:
    """Seconds the save in flight is expected to need still (None: none, or
    none measured yet)."""
    estimate = self.save_seconds()
    if self._in_flight is None or estimate is None:
      return None
    return max(0.0, estimate - (time.monotonic() - self._in_flight[1]))


def fits_in_grace(needed_s: float | None, signalled: float, grace_s: float) -> bool:
  """Whether work of `needed_s` seconds (None: unknown, tried) ends before
  SIGKILL, for SIGTERM at `signalled` (`time.monotonic()`)."""
  if needed_s is None:
    return True  # nothing measured: the first save is tried (a cut one is never used)
  left = grace_s - (time.monotonic() - signalled)
  return needed_s * SAVE_MARGIN + EXIT_MARGIN_S <= left
