"""Stream stages that take their input a window at a time: shuffle and pack.

A window stage reads `window_size` elements, turns them into a list (a
permutation of them, or packed rows) and yields that list before reading the
next window. Its checkpoint state is the parent's state at the window's start,
the window's index and the position in its output, so a restore re-reads one
window and continues exactly, with the same output: `transform` must depend
only on the window and its index.
"""

from __future__ import annotations

from typing import Any, Callable

import grain
import numpy as np

from bertjax import errors


class WindowStage(grain.IterDataset):
  """Applies `transform(window, window_index) -> outputs` to consecutive windows."""

  def __init__(self, parent: grain.IterDataset, window_size: int,
               transform: Callable[[list[Any], int], list[Any]]):
    super().__init__(parent)
    if window_size < 1:
      raise errors.UsageError(f"window_size must be >= 1, got {window_size}")
    self.window_size, self.transform = window_size, transform

  def __iter__(self) -> grain.DatasetIterator:
    return _WindowIterator(self._parent.__iter__(), self.window_size, self.transform)


class _WindowIterator(grain.DatasetIterator):

  def __init__(self, parent: grain.DatasetIterator, window_size: int,
               transform: Callable[[list[Any], int], list[Any]]):
    super().__init__(parent)
    self._size, self._transform = window_size, transform
    self._window_index, self._position = 0, 0
    self._outputs: list = []
    self._filled = False  # whether `_outputs` came from the window at `_window_state`
    self._window_state = parent.get_state()

  def _fill(self) -> None:
    self._window_state = self._parent.get_state()
    window = []
    for _ in range(self._size):
      try:
        window.append(next(self._parent))
      except StopIteration:
        break
    self._outputs = self._transform(window, self._window_index) if window else []
    self._filled = bool(window)

  def __next__(self):
    while self._position >= len(self._outputs):
      if self._filled:
        self._window_index += 1
      self._fill()
      self._position = 0
      if not self._filled:
        raise StopIteration
    output = self._outputs[self._position]
    self._position += 1
    return output

  def get_state(self) -> dict:
    return {"window_state": self._window_state, "window_index": self._window_index,
            "position": self._position, "filled": self._filled}

  def set_state(self, state: dict) -> None:
    self._parent.set_state(state["window_state"])
    self._window_index, self._outputs = state["window_index"], []
    self._position, self._filled = state["position"], False
    if state["filled"]:
      self._fill()
    else:
      self._window_state = state["window_state"]


class WindowShuffle(WindowStage):
  """Shuffles consecutive windows of elements (instances of nearby documents).

  Like grain's window shuffle, with one numpy permutation per window instead of
  a hash per element.
  """

  def __init__(self, parent: grain.IterDataset, window_size: int, seed: int):
    self.seed = seed
    super().__init__(parent, window_size, self._permute)

  def _permute(self, window: list[Any], window_index: int) -> list[Any]:
    order = np.random.default_rng([self.seed, window_index]).permutation(len(window))
    return [window[i] for i in order]
