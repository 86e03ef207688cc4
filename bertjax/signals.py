"""Stop requests: SIGTERM (a preemption notice), Ctrl-C and SIGHUP (the
terminal closed) during training."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from absl import logging

from bertjax import usage


class StopRequests:
  """SIGTERM (a preemption notice), a first Ctrl-C and SIGHUP ask the loop to
  stop at the current step, saving a checkpoint there (on SIGTERM, when the
  grace allows: `bertjax.preemption`); a second Ctrl-C (or SIGHUP) aborts at
  once. SIGHUP ignored by the run's starter (`nohup`) stays ignored.

  Until the run's first step (`begin_training()`), there is nothing of this run's
  to save: a stop request ends the run at once, as it would any command
  (KeyboardInterrupt, `usage.Terminated`), as soon as Python sees it (a
  compile under way ends first).

  With one process the handlers set `requested`, which the loop checks after
  each step. With several, the hosts must agree on the step to save at, which
  JAX's preemption sync point provides: its own SIGTERM handler (installed by
  `jax.distributed`) stays in place, and Ctrl-C is passed on to it as SIGTERM.
  """

  def __init__(self, multi_process: bool):
    self.requested: str | None = None  # "SIGTERM", "Ctrl-C" or "SIGHUP"
    self.signalled: float | None = None  # when (time.monotonic()), for the grace left
    self._multi_process = multi_process
    self._previous: dict[int, Any] = {}
    self.training = False  # whether this run's first step is under way

  def begin_training(self) -> None:
    """Says the run's first step is under way: from now on a stop request
    stops the run at a step (saving it), not at once."""
    self.training = True

  def __enter__(self):
    signals = [signal.SIGINT] + ([] if self._multi_process else [signal.SIGTERM])
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
      signals.append(signal.SIGHUP)
    for signum in signals:
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread: rely on JAX's sync point only
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if not self.training and not self._multi_process:
      raise KeyboardInterrupt if signum == signal.SIGINT else usage.Terminated(signum)
    self.signalled = self.signalled or time.monotonic()
    if signum in (signal.SIGINT, signal.SIGHUP):
      name = "Ctrl-C" if signum == signal.SIGINT else "SIGHUP"
      if self.interrupted:
        raise KeyboardInterrupt  # the second: abort, abandoning any save in flight
      logging.warning("%s: saving a checkpoint at this step, then stopping (press Ctrl-C "
                      "again to abort without it)", name)
      self.requested = name
      if self._multi_process:  # the hosts agree on the step via JAX's sync point
        os.kill(os.getpid(), signal.SIGTERM)
      return
    else:
      logging.warning("SIGTERM: stopping at the next step, saving a checkpoint there if the "
                      "grace allows")
      self.requested = "SIGTERM"

  @property
  def interrupted(self) -> bool:
    """Whether a person stopped the run (Ctrl-C, the terminal closed): it
    saves whatever the grace, unlike a preemption notice."""
    return self.requested in ("Ctrl-C", "SIGHUP")

  def stop_now(self) -> bool:
    """Whether this process was asked to stop (multi-process runs ask JAX instead)."""
    return self.requested is not None and not self._multi_process

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
