"""Stop requests: SIGTERM (a preemption notice) and Ctrl-C during training."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from absl import logging


class StopRequests:
  """SIGTERM (a preemption notice) and a first Ctrl-C ask the loop to stop at
  the current step, saving a checkpoint there (on SIGTERM, when the grace
  allows: `bertjax.preemption`); a second Ctrl-C aborts at once.

  With one process the handlers set `requested`, which the loop checks after
  each step. With several, the hosts must agree on the step to save at, which
  JAX's preemption sync point provides: its own SIGTERM handler (installed by
  `jax.distributed`) stays in place, and Ctrl-C is passed on to it as SIGTERM.
  """

  def __init__(self, multi_process: bool):
    self.requested: str | None = None  # "SIGTERM" or "Ctrl-C"
    self.signalled: float | None = None  # when (time.monotonic()), for the grace left
    self._multi_process = multi_process
    self._previous: dict[int, Any] = {}

  def __enter__(self):
    signals = [signal.SIGINT] + ([] if self._multi_process else [signal.SIGTERM])
    for signum in signals:
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread: rely on JAX's sync point only
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    self.signalled = self.signalled or time.monotonic()
    if signum == signal.SIGINT:
      if self.requested == "Ctrl-C":
        raise KeyboardInterrupt  # the second: abort, abandoning any save in flight
      logging.warning("Ctrl-C: saving a checkpoint at this step, then stopping (press "
                      "Ctrl-C again to abort without it)")
      if self._multi_process:
        self.requested = "Ctrl-C"  # only for the second press: the hosts agree via JAX
        os.kill(os.getpid(), signal.SIGTERM)
        return
      self.requested = "Ctrl-C"
    else:
      logging.warning("SIGTERM: stopping at the next step, saving a checkpoint there if the "
                      "grace allows")
      self.requested = "SIGTERM"

  def stop_now(self) -> bool:
    """Whether this process was asked to stop (multi-process runs ask JAX instead)."""
    return self.requested is not None and not self._multi_process

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
