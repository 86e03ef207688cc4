"""SWAG: the official CSV files (`train.csv`, `val.csv`, `test.csv` of
rowanz/swagaf) as four-way multiple choice.

As in the paper, each choice is a sequence pair: sentence A is the given
sentence (`sent1`), sentence B the start of the next one (`sent2`) followed by
the candidate ending. Rows that lack a column or have a label outside 0-3 are
skipped, counted, and reported with their file and line.
"""

from __future__ import annotations

import csv
import dataclasses
import sys

import numpy as np

from bertjax import errors, files
from bertjax.data import textfiles
from bertjax.data.skips import SkipReport

NUM_CHOICES = 4
_ENDINGS = [f"ending{i}" for i in range(NUM_CHOICES)]


@dataclasses.dataclass(frozen=True)
class Example:
  index: int          # data row number in the file, 0-based (the prediction file's id)
  context: str        # sent1
  start: str          # sent2, the first words of the continuation
  endings: tuple[str, ...]
  label: int | None   # the right ending, None in the test file


def read_csv(path: str, report: SkipReport | None = None) -> list[Example]:
  """The examples of one SWAG CSV file (with or without the label column)."""
  csv.field_size_limit(sys.maxsize)
  own_report = report is None
  report = report or SkipReport()
  try:
    with files.open_text(path, newline="") as f:
      reader = csv.DictReader(f)
      missing = [c for c in ["sent1", "sent2", *_ENDINGS] if c not in (reader.fieldnames or [])]
      if missing:
        raise errors.UsageError(f"{path}: not a SWAG file, the header lacks {missing}")
      labelled = "label" in reader.fieldnames
      examples = []
      for row_number, row in enumerate(reader):
        where = f"{path}:{reader.line_num}"
        if any(row.get(c) is None for c in ["sent1", "sent2", *_ENDINGS]):
          report.skip(where, "fewer columns than the header")
          continue
        label = None
        if labelled:
          raw = (row.get("label") or "").strip()
          if raw not in {str(i) for i in range(NUM_CHOICES)}:
            report.skip(where, f"a label outside 0-{NUM_CHOICES - 1}")
            continue
          label = int(raw)
        examples.append(Example(row_number, row["sent1"], row["sent2"],
                                tuple(row[c] for c in _ENDINGS), label))
  except FileNotFoundError:
    raise errors.MissingFileError(f"{path} not found") from None
  except UnicodeDecodeError as e:
    raise errors.UsageError(textfiles.not_utf8(path, e)) from None
  if own_report:
    report.log(path, len(examples))
  if not examples:
    raise errors.UsageError(f"{path}: no usable rows")
  return examples


def featurize(examples: list[Example], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
  """Inputs [examples, 4, max_seq_length], labels (0 where unknown) and weights."""
  contexts = [e.context for e in examples for _ in range(NUM_CHOICES)]
  continuations = [f"{e.start} {ending}".strip() for e in examples for ending in e.endings]
  flat = tokenizer.encode_batch(contexts, continuations, max_length=max_seq_length,
                                padding="max_length")
  features = {name: value.reshape(len(examples), NUM_CHOICES, max_seq_length)
              for name, value in flat.items()}
  features["labels"] = np.array([e.label or 0 for e in examples], np.int32)
  features["weights"] = np.ones(len(examples), np.float32)
  return features
