"""Progress of the offline data tools, as people read it: done of total, rate, time left.

A bar on a terminal; on anything else (a log file, a pipe) a plain line every
30 seconds and a last one at the end, without carriage returns. Where the total
is known (the bytes of the input files, the records of a TFDS split) the line
gives the percentage and the time left; `count` adds running totals beside it
(tokens, sentences).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class _Lines:
  """A stream for tqdm that writes each refresh as its own line."""

  def __init__(self, stream: TextIO):
    self._stream = stream

  def write(self, text: str) -> None:
    text = text.replace("\r", "").rstrip()
    if text:
      self._stream.write(text + "\n")

  def flush(self) -> None:
    self._stream.flush()


def _units(unit: str) -> dict[str, str | int]:
  if unit == "bytes":
    return {"unit": "B", "unit_divisor": 1024}
  return {"unit": f" {unit}", "unit_divisor": 1000}


class Progress:
  """A progress display of one stage; does nothing when not `enabled`.

  Args:
    description: The stage ("building", "reading (1/2)").
    enabled: False keeps it quiet (tests, libraries).
    total: The work to do, in `unit`s, if known.
    unit: "bytes" (shown as kB, MB, ...) or a noun such as "documents".
  """

  def __init__(self, description: str, enabled: bool = True, total: int | None = None,
               unit: str = "bytes"):
    self._description, self._enabled = description, enabled
    self._total, self._unit = total, unit
    self._counts: dict[str, int] = {}
    self._bar = None
    if total is not None:
      self._show()

  def _show(self) -> Any:
    """The bar, made when first needed (once the total is known, if it is set
    later), so a log gets no line without it."""
    if self._bar is None and self._enabled:
      from tqdm import tqdm

      stream = sys.stderr
      terminal = stream.isatty()
      self._bar = tqdm(total=self._total, desc=self._description, unit_scale=True,
                       **_units(self._unit), file=stream if terminal else _Lines(stream),
                       mininterval=0.5 if terminal else 30, ascii=not terminal,
                       dynamic_ncols=terminal)
    return self._bar

  def set_total(self, total: int | None, unit: str = "bytes") -> None:
    """Sets the amount of work, once known, and its unit."""
    self._total, self._unit = total, unit
    if self._bar is None:
      self._show()
      return
    for name, value in _units(unit).items():
      setattr(self._bar, name, value)
    self._bar.total = total
    self._bar.refresh()

  def advance(self, amount: int) -> None:
    """Adds work done, in the unit of the total."""
    if amount and self._show() is not None:
      self._bar.update(amount)

  def count(self, name: str, amount: int) -> None:
    """Adds to a running total shown beside the bar (e.g. "tokens")."""
    if not amount or self._show() is None:
      return
    self._counts[name] = self._counts.get(name, 0) + amount
    self._bar.set_postfix_str(", ".join(f"{value:,} {key}"
                                        for key, value in self._counts.items()), refresh=False)

  def close(self) -> None:
    """Shows the last state (if enabled) and ends the display."""
    if self._show() is not None:
      self._bar.close()
    self._enabled, self._bar = False, None

  def __enter__(self) -> Progress:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
