"""The last stage of the pre-training input: global batches on the mesh, from
the loader's process-local batches, prefetched by a thread."""

from __future__ import annotations

import gc
import multiprocessing
import queue
import threading
from typing import Any, Iterator

import grain

from bertjax import worker_signals


class DeviceIterator:
  """Global batches on the mesh, assembled from process-local data, prefetched.

  A background thread turns the numpy batches of this process into global
  `jax.Array`s (`jax.make_array_from_process_local_data`) ahead of use, from
  the first `next()` on: a `set_state` before it (a resumed run) makes no
  batch of the position it leaves (a shuffle window's instances, read again).
  `get_state()` is the loader's state after the last batch handed out, not
  after the prefetched ones, so a checkpoint resumes at the next batch.
  `close()` ends it with the loader's worker processes, however the run ends.
  """

  def __init__(self, iterator: grain.DatasetIterator, sharding, prefetch: int = 2):
    self._iterator: grain.DatasetIterator | None = iterator
    self._sharding, self._prefetch = sharding, prefetch
    self._state = iterator.get_state()
    self._thread: threading.Thread | None = None
    self._end: BaseException | None = None

  def _start(self) -> None:
    self._queue: queue.Queue = queue.Queue(maxsize=self._prefetch)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._fill, daemon=True)
    self._thread.start()

  def _fill(self) -> None:
    import jax

    # The loader's worker processes start in this thread (or in threads it
    # starts): they inherit the terminal's signals blocked, from their start.
    worker_signals.block_in_this_thread()
    try:
      for batch in self._iterator:
        arrays = {name: jax.make_array_from_process_local_data(self._sharding, value)
                  for name, value in batch.items()}
        item = (arrays, self._iterator.get_state())
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
        if self._stop.is_set():
          return
    except Exception as e:  # handed to the consumer
      self._queue.put(e)
      return
    if not self._stop.is_set():
      self._queue.put(StopIteration())

  def __iter__(self) -> Iterator[dict[str, Any]]:
    return self

  def __next__(self) -> dict[str, Any]:
    if self._end is not None:
      raise self._end
    if self._thread is None:
      self._start()
    item = self._queue.get()
    if isinstance(item, BaseException):
      self._end = item  # the end of the data, or the loader's error, every time after
      raise item
    arrays, self._state = item
    return arrays

  def get_state(self) -> dict[str, Any]:
    return self._state

  def set_state(self, state: dict[str, Any]) -> None:
    """Resumes at `state`; the batches after it are made from the next `next()` on."""
    if self._iterator is None:
      raise RuntimeError("DeviceIterator is closed")
    self._stop_prefetch()
    self._iterator.set_state(state)
    self._state = state
    self._end = None

  def _stop_prefetch(self) -> None:
    if self._thread is not None:
      self._stop.set()
      while self._thread.is_alive():
        try:
          self._queue.get(timeout=0.1)
        except queue.Empty:
          pass
        self._thread.join(timeout=0.1)
      self._thread = None

  def close(self) -> None:
    """Stops the prefetch thread and the loader, for good. The loader's worker
    processes are stopped and waited for, and the semaphores of their queues
    (in /dev/shm) freed now: a run that a second Ctrl-C ends exits without
    Python's clean-up."""
    self._stop_prefetch()
    self._end = RuntimeError("DeviceIterator is closed")
    iterator, self._iterator = self._iterator, None
    if not hasattr(iterator, "close"):
      return
    workers = bool(multiprocessing.active_children())  # (the loader's, in a run)
    iterator.close()
    del iterator
    if workers:
      gc.collect()  # the pipeline's reference cycles hold the queues
