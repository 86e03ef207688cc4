"""Stop requests: SIGTERM (a preemption notice), Ctrl-C and SIGHUP (the
terminal closed) during training."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from typing import Any, Iterator

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
  `jax.distributed`) is called as SIGTERM lands, and Ctrl-C is passed on to
  it as SIGTERM.

  Either way `signalled` is the moment the signal landed on this host, so
  that the grace left is counted from there (`bertjax.tasks.pretrain_stop`),
  not from the step at which the loop or the hosts act on it.
  """

  def __init__(self, multi_process: bool):
    self.requested: str | None = None  # "SIGTERM", "Ctrl-C" or "SIGHUP"
    # When the first stop signal landed (time.monotonic()), for the grace left:
    # noted by a thread as it lands, since on several hosts the loop hears of a
    # SIGTERM only at the later step the hosts agree on.
    self.signalled: float | None = None
    self._multi_process = multi_process
    self._previous: dict[int, Any] = {}
    self._native: _NativeHandler | None = None
    self._watcher: _ArrivalWatcher | None = None
    self.training = False  # whether this run's first step is under way

  def begin_training(self) -> None:
    """Says the run's first step is under way: from now on a stop request
    stops the run at a step (saving it), not at once."""
    self.training = True

  def __enter__(self):
    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
      signals.append(signal.SIGHUP)
    if threading.current_thread() is not threading.main_thread():
      return self  # rely on JAX's sync point only
    if self._multi_process:
      # JAX's own handler, which hears SIGTERM for its sync point: called as
      # SIGTERM lands. Unknown (jax.distributed started elsewhere than
      # `bertjax.main`), SIGTERM is left to it, unnoted.
      self._native = _jax_sigterm
      if self._native is None:
        signals.remove(signal.SIGTERM)
    for signum in signals:
      self._previous[signum] = signal.signal(signum, self._handle)
    self._watcher = _ArrivalWatcher(self)
    return self

  def _arrived(self, signum: int) -> None:
    """A stop signal has just landed (called by the watcher thread)."""
    self.signalled = self.signalled or time.monotonic()
    if signum == signal.SIGTERM and self._native is not None:
      self._native.call(signum)  # JAX's sync point hears of it as before, at once

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
    if self.requested is None:  # (on several hosts, also a Ctrl-C passed on to JAX)
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
      signal.signal(signum, signal.SIG_DFL if previous is None else previous)
      if signum == signal.SIGTERM and self._native is not None:
        self._native.install()  # JAX's own again (Python's view of it is stale)
    if self._watcher is not None:
      self._watcher.close()


class _ArrivalWatcher:
  """A thread that hears each stop signal as it lands: Python's handlers
  write its number to a pipe (`signal.set_wakeup_fd`) before the main thread
  runs them, and the thread passes it to `stop._arrived` at once."""

  def __init__(self, stop: StopRequests):
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self._thread = threading.Thread(target=self._watch, args=(stop,), daemon=True,
                                    name="stop signal watcher")
    self._thread.start()

  def _watch(self, stop: StopRequests) -> None:
    while data := os.read(self._read, 64):
      for signum in data:
        if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
          stop._arrived(signum)  # pylint: disable=protected-access

  def close(self) -> None:
    signal.set_wakeup_fd(self._previous_fd)
    os.close(self._write)  # the thread reads the end of the pipe, and ends
    self._thread.join(timeout=5)
    os.close(self._read)


class _SigAction(ctypes.Structure):
  """The C library's `struct sigaction` (Linux, glibc and musl)."""
  _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * (128 // 8)),
              ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


_SA_SIGINFO = 4


class _NativeHandler:
  """A signal's handler installed by native code (JAX's preemption notifier
  sets a flag on SIGTERM, which a thread of its own polls), which Python's
  `signal` module neither sees nor can restore: kept, called and put back
  through the C library."""

  def __init__(self, signum: int, action: _SigAction):
    self._signum, self._action = signum, action

  def call(self, signum: int) -> None:
    if self._action.flags & _SA_SIGINFO:
      ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
          self._action.handler)(signum, None, None)
    else:
      ctypes.CFUNCTYPE(None, ctypes.c_int)(self._action.handler)(signum)

  def install(self) -> None:
    _libc().sigaction(self._signum, ctypes.byref(self._action), None)


# JAX's own SIGTERM handler, as `jax.distributed` installed it (`installing_jax_sigterm`).
_jax_sigterm: _NativeHandler | None = None


@contextlib.contextmanager
def installing_jax_sigterm() -> Iterator[None]:
  """Keeps the SIGTERM handler that native code installs inside the block:
  wrap `jax.distributed.initialize` in it.

  JAX's preemption notifier installs its handler through the C library, which
  Python's `signal` module does not see: any `signal.signal(SIGTERM, ...)`
  later (holding signals around a critical section, a worker pool's start)
  replaces it for good. What the C library says before and after the block
  tells JAX's handler from Python's own, which `StopRequests` then calls.
  """
  global _jax_sigterm
  libc, before, after = _libc(), _SigAction(), _SigAction()
  known = libc.sigaction(signal.SIGTERM, None, ctypes.byref(before)) == 0
  yield
  if (known and libc.sigaction(signal.SIGTERM, None, ctypes.byref(after)) == 0
      and after.handler != before.handler
      and after.handler not in (None, int(signal.SIG_DFL), int(signal.SIG_IGN))):
    _jax_sigterm = _NativeHandler(signal.SIGTERM, after)


def _libc() -> ctypes.CDLL:
  libc = ctypes.CDLL(None, use_errno=True)
  libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
  return libc
