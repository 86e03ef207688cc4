"""Counting what a reader skips, by reason, with where the first few were."""

from __future__ import annotations

import collections
import dataclasses
import logging

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SkipReport:
  """Rows skipped while reading a file, by reason, with the first places."""

  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  examples: list[str] = dataclasses.field(default_factory=list)
  keep_examples: int = 5

  def skip(self, where: str, reason: str) -> None:
    self.counts[reason] += 1
    if len(self.examples) < self.keep_examples:
      self.examples.append(f"{where}: {reason}")

  @property
  def total(self) -> int:
    return sum(self.counts.values())

  def log(self, source: str, kept: int, unit: str = "rows") -> None:
    """A warning with the counts, if anything was skipped."""
    if self.counts:
      logger.warning("%s: kept %d %s, skipped %d (%s); first: %s", source, kept, unit,
                     self.total, ", ".join(f"{n} {reason}" for reason, n in self.counts.items()),
                     "; ".join(self.examples))
