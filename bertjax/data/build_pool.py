"""Runs a data build's tasks (one shard each) in worker processes: one core
each, progress reported to the parent's bar, and on an error or Ctrl-C the
workers stopped and their staging files removed."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import queue
import signal
import threading
import traceback
from typing import Any, Callable, Iterator

from bertjax import files, usage, worker_signals
from bertjax.data.progress import Progress


def _worker_init(progress) -> None:
  """Sets up a worker process: one core, progress reports to the parent, and
  a terminal's signals left to the parent (Ctrl-C and SIGHUP go to the whole
  process group)."""
  global _PROGRESS
  _PROGRESS = progress
  # One core per worker: the Rust tokenizer would otherwise spread over all.
  os.environ["RAYON_NUM_THREADS"] = "1"
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  # The parent handles them: it stops the pool (with SIGTERM, which stays
  # deadly) and removes the staging files the workers leave (`run_tasks`).
  worker_signals.ignore_in_worker(keep_sigterm=True)


_PROGRESS = None  # a worker's queue to the parent


def _in_worker(args):
  function, task = args
  return function(task, _PROGRESS)


def run_tasks(tasks: list[dict[str, Any]], num_workers: int, bar: Progress, directory: str,
              function: Callable[[dict[str, Any], Any], Any]) -> list[Any]:
  """Runs `function(task, progress)` over the tasks,
  which write into `directory`; returns their results. A task reports progress
  as (work done, {name: count}).

  On an error or Ctrl-C the workers are stopped and the staging files they
  leave in `directory` removed; finished shards stay.
  """
  sink = _ListQueue(bar)
  if not tasks:
    return []
  if num_workers <= 1:
    return [function(task, sink) for task in tasks]
  context = multiprocessing.get_context("spawn")
  with _stopped_once():
    return _run_in_pool(context, tasks, num_workers, sink, directory, function)


def _run_in_pool(context, tasks: list[dict[str, Any]], num_workers: int, sink: "_ListQueue",
                 directory: str, function: Callable[[dict[str, Any], Any], Any]) -> list[Any]:
  """`run_tasks` with worker processes."""
  pool = progress = pending = None
  finished = False
  try:
    # A pool half made would be left behind; its workers (and the threads
    # that replace them) start with the terminal's signals blocked.
    with usage.signals_held(), worker_signals.blocked_for_children():
      worker_signals.start_resource_tracker()
      progress = context.Queue()
      pool = context.Pool(min(num_workers, len(tasks)), initializer=_worker_init,
                          initargs=(progress,))
    pending = pool.map_async(_in_worker, [(function, task) for task in tasks])
    while not pending.ready() or not progress.empty():
      try:
        sink.put(progress.get(timeout=0.2))
      except queue.Empty:
        pass
    results = pending.get()  # re-raises a worker's error
    finished = True
    return results
  except BaseException as error:
    traceback.clear_frames(error.__traceback__)  # the frames below hold the pool and queue
    raise
  finally:
    # The pool and queue are released here, with their semaphores (an exit that
    # a Ctrl-C cuts short would leave those for the resource tracker to report),
    # and the staging files of stopped workers are removed: a second Ctrl-C
    # waits for that.
    with usage.signals_held():
      if pool is not None:
        pool.terminate()
        pool.join()
      if progress is not None:
        progress.close()
      if not finished:
        files.remove_stale_staging(directory)  # the workers are stopped: theirs are stale
      del pool, progress, pending
      multiprocessing.active_children()  # forgets the stopped workers
      gc.collect()  # the pool's reference cycles


@contextlib.contextmanager
def _stopped_once() -> Iterator[None]:
  """The first Ctrl-C (SIGTERM, SIGHUP) ends the build as it ends any command;
  those after it are absorbed while the build stops. An impatient second
  Ctrl-C then cannot cut the workers' stopping short (it would land before
  the clean-up holds the signals, `usage.signals_held`, as easily as in it)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous: dict[int, Any] = {}
  stopped = []

  def once(signum, frame):
    if not stopped:
      stopped.append(signum)
      previous[signum](signum, frame)  # raises, as the command's handler does

  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if callable(signal.getsignal(signum)):  # not ignored (nohup's SIGHUP), not the default
      previous[signum] = signal.signal(signum, once)
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


class _ListQueue:
  """The progress queue of an in-process build: straight to the bar."""

  def __init__(self, bar: Progress):
    self._bar = bar

  def put(self, item: tuple[int, dict[str, int]]) -> None:
    done, counts = item
    self._bar.advance(done)
    for name, count in counts.items():
      self._bar.count(name, count)
