"""Worker processes leave a terminal's signals to the command that started them.

A terminal sends Ctrl-C (SIGINT) and, when it closes, SIGHUP to its whole
foreground process group: the command and every process it started; and
`kill -TERM -PGID` (or a supervisor that stops a process group) sends SIGTERM
the same way. The command handles each (a training run saves its step) and
stops its workers itself. A worker that took the signal too would die on its
own: a KeyboardInterrupt traceback each, what it had in flight (shared-memory
segments, semaphores) left behind, and a run's loader failing where the run
should have saved and stopped.

Workers start with those signals blocked: a new process inherits the blocked
signals of the thread that starts it (a new thread, those of its starter) and
keeps them across `exec`, so a worker is deaf to them from its first
instruction, through Python's start-up and imports, before a line of its own
code runs; its initialiser then ignores them (`ignore_in_worker`).
Multiprocessing's resource tracker, which every worker reports its segments
and semaphores to and which unlinks those a dead process left, is started
blocked too (`start_resource_tracker`): it ignores SIGINT and SIGTERM itself,
but SIGHUP killed it, leaving everything registered with it in /dev/shm until
a reboot, and the tracker started in its place printed a KeyError for each
name unregistered afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Iterator

# What a terminal, or a stop of a whole process group, sends every process of it.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


@contextlib.contextmanager
def blocked_for_children() -> Iterator[None]:
  """Blocks the terminal's signals in the calling thread for the block:
  processes and threads started in it inherit them blocked.

  The process itself still takes every signal: the kernel hands one to a
  thread that does not block it (Python's handlers run in the main thread
  whichever it is), and one that every thread blocks waits until the block
  ends. Nothing is lost.
  """
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def block_in_this_thread() -> None:
  """Blocks the terminal's signals in the calling thread for good: for a
  background thread that starts worker processes (or threads that start them)
  whenever it needs them. Python runs its signal handlers in the main thread
  only, so such a thread loses nothing by it."""
  signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)


def start_resource_tracker() -> None:
  """Starts multiprocessing's resource tracker, unless it runs already, with
  the terminal's signals blocked: it ignores SIGINT and SIGTERM itself, and
  SIGHUP stays blocked in it. Call it before a command's first worker process
  or semaphore, which would start it otherwise, deadly to SIGHUP (a tracker
  that runs already is left as it is)."""
  from multiprocessing import resource_tracker

  with blocked_for_children():
    # (It unblocks SIGINT and SIGTERM in this thread after its start; the
    # block's end sets the mask back as it was.)
    resource_tracker.ensure_running()


def ignore_in_worker(keep_sigterm: bool = False) -> None:
  """A worker process's initialiser: ignores the terminal's signals (those
  that came while it started are dropped) and unblocks them; its parent stops
  it.

  Args:
    keep_sigterm: Leaves SIGTERM deadly, for a pool that stops its workers
      with it (`multiprocessing.Pool.terminate`): one that came while the
      worker started ends it now.
  """
  for signum in TERMINAL_SIGNALS:
    deadly = signum == signal.SIGTERM and keep_sigterm
    signal.signal(signum, signal.SIG_DFL if deadly else signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINAL_SIGNALS)


def exit_with_parent(poll_s: float = 1.0) -> None:
  """Ends this worker process within `poll_s` of its parent's end, for
  workers that would otherwise run on (grain's poll their queues with
  timeouts, never seeing the parent gone): a parent killed outright
  (`kill -9`, the kernel out of memory), or one that a second Ctrl-C ends
  while it stops them, leaves none behind."""
  parent = os.getppid()

  def watch() -> None:
    while os.getppid() == parent:
      time.sleep(poll_s)
    os._exit(0)  # pylint: disable=protected-access

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
