"""GLUE: the official TSV files (or TFDS `glue/*`) as labelled text pairs.

Each task reads its train, dev and test files in the layout of GLUE's
`download_glue_data.py` (the files the original BERT code reads), with the
original's columns and label sets; AX, the diagnostic set, is test-only and is
predicted with the MNLI model. Rows that do not fit the layout (too few
columns, a label outside the set, a score that is not a number, not finite
or outside STS-B's 0 to 5) are skipped, counted by reason and reported with
the file and line of the first few; nothing is dropped silently. TSV fields
are taken verbatim (`csv`'s QUOTE_NONE), as the original reader does.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import sys
from typing import Any, Sequence

from bertjax import errors, files
from bertjax.data import textfiles, tfds_io
from bertjax.data.skips import SkipReport


@dataclasses.dataclass(frozen=True)
class Example:
  """One labelled text (pair).

  Attributes:
    guid: "<split>-<index>"; `index` is the submission file's row id.
    text_a: First segment.
    text_b: Second segment or None.
    label: Label string (class tasks), float (STS-B) or None (test data).
    index: The row id for the submission file.
  """

  guid: str
  text_a: str
  text_b: str | None
  label: str | float | None
  index: int


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """How a GLUE task's files are laid out.

  Attributes:
    name: bertjax's task name.
    labels: Label strings in id order; None for regression (STS-B).
    files: split -> file name in the task directory.
    header: Whether train/dev files have a header row (test files always do).
    columns: (text_a, text_b or None, label) column indices of train/dev rows;
      negative counts from the end.
    test_columns: (text_a, text_b or None) of test rows.
    tfds_name: The TFDS dataset, and its text features.
    submission: The file name of the GLUE server's predictions.
    score_range: The (lowest, highest) score of a regression task.
  """

  name: str
  labels: tuple[str, ...] | None
  files: dict[str, str]
  header: bool
  columns: tuple[int, int | None, int]
  test_columns: tuple[int, int | None]
  tfds_name: str
  tfds_features: tuple[str, str | None]
  submission: dict[str, str]
  score_range: tuple[float, float] | None = None

  @property
  def is_regression(self) -> bool:
    return self.labels is None


_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")
_ENTAILMENT = ("entailment", "not_entailment")
_STANDARD = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("cola", _BINARY, _STANDARD, header=False, columns=(3, None, 1),
             test_columns=(1, None), tfds_name="glue/cola", tfds_features=("sentence", None),
             submission={"test": "CoLA.tsv"}),
    TaskSpec("sst2", _BINARY, _STANDARD, header=True, columns=(0, None, 1),
             test_columns=(1, None), tfds_name="glue/sst2", tfds_features=("sentence", None),
             submission={"test": "SST-2.tsv"}),
    TaskSpec("mrpc", _BINARY, _STANDARD, header=True, columns=(3, 4, 0),
             test_columns=(3, 4), tfds_name="glue/mrpc",
             tfds_features=("sentence1", "sentence2"), submission={"test": "MRPC.tsv"}),
    TaskSpec("stsb", None, _STANDARD, header=True, columns=(7, 8, -1),
             test_columns=(7, 8), tfds_name="glue/stsb",
             tfds_features=("sentence1", "sentence2"), submission={"test": "STS-B.tsv"},
             score_range=(0.0, 5.0)),
    TaskSpec("qqp", _BINARY, _STANDARD, header=True, columns=(3, 4, 5),
             test_columns=(1, 2), tfds_name="glue/qqp",
             tfds_features=("question1", "question2"), submission={"test": "QQP.tsv"}),
    TaskSpec("mnli", _NLI, {"train": "train.tsv", "dev": "dev_matched.tsv",
                            "dev_mismatched": "dev_mismatched.tsv",
                            "test": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv",
                            "ax": "diagnostic.tsv"},
             header=True, columns=(8, 9, -1), test_columns=(8, 9), tfds_name="glue/mnli",
             tfds_features=("premise", "hypothesis"),
             submission={"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv",
                         "ax": "AX.tsv"}),
    TaskSpec("qnli", _ENTAILMENT, _STANDARD, header=True, columns=(1, 2, -1),
             test_columns=(1, 2), tfds_name="glue/qnli",
             tfds_features=("question", "sentence"), submission={"test": "QNLI.tsv"}),
    TaskSpec("rte", _ENTAILMENT, _STANDARD, header=True, columns=(1, 2, -1),
             test_columns=(1, 2), tfds_name="glue/rte",
             tfds_features=("sentence1", "sentence2"), submission={"test": "RTE.tsv"}),
    TaskSpec("wnli", _BINARY, _STANDARD, header=True, columns=(1, 2, -1),
             test_columns=(1, 2), tfds_name="glue/wnli",
             tfds_features=("sentence1", "sentence2"), submission={"test": "WNLI.tsv"}),
)}
# The diagnostic set's columns (index, sentence1, sentence2), read by the MNLI task.
_AX_COLUMNS = (1, 2)
# TFDS split names of bertjax's splits.
_TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test",
                "dev_mismatched": "validation_mismatched", "test_mismatched": "test_mismatched"}
_TFDS_MNLI_SPLITS = {"dev": "validation_matched", "test": "test_matched"}


def task_spec(name: str) -> TaskSpec:
  if name not in TASKS:
    raise errors.UsageError(f"unknown GLUE task {name!r}; known: {', '.join(TASKS)}")
  return TASKS[name]


def split_directory(spec: TaskSpec, task_dir: str, split: str) -> str | None:
  """The directory holding a split's file, or None if there is none.

  GLUE's download script puts the diagnostic set (AX) beside the task
  directories (`glue_data/diagnostic/diagnostic.tsv`), not in `MNLI/`: it is
  looked for in the task directory first, then there.
  """
  candidates = [task_dir]
  if split == "ax":
    candidates.append(os.path.join(os.path.dirname(os.path.normpath(task_dir)), "diagnostic"))
  for directory in candidates:
    if files.isfile(os.path.join(directory, spec.files[split])):
      return directory
  return None


def _read_tsv(path: str) -> list[list[str]]:
  csv.field_size_limit(sys.maxsize)
  try:
    with files.open_text(path, newline="") as f:
      return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  except FileNotFoundError:
    raise errors.MissingFileError(f"{path} not found (a GLUE task directory as written by "
                                  "download_glue_data.py?)") from None
  except UnicodeDecodeError as e:
    raise errors.UsageError(textfiles.not_utf8(path, e)) from None


def _row_index(row: Sequence[str], line: int, has_index_column: bool) -> int:
  if has_index_column:
    try:
      return int(row[0])
    except ValueError:
      pass
  return line


def read_tsv(spec: TaskSpec, task_dir: str, split: str,
             report: SkipReport | None = None) -> list[Example]:
  """The examples of one split of a GLUE task directory.

  Args:
    spec: The task.
    task_dir: Directory holding the task's TSV files.
    split: "train", "dev", "test" (MNLI also "dev_mismatched",
      "test_mismatched" and "ax").
    report: Collects skipped rows (a fresh one is logged otherwise).
  """
  if split not in spec.files:
    raise errors.UsageError(f"{spec.name} has no split {split!r}; it has {', '.join(spec.files)}")
  path = os.path.join(task_dir, spec.files[split])
  rows = _read_tsv(path)
  own_report = report is None
  report = report or SkipReport()
  labelled = not (split.startswith("test") or split == "ax")
  if labelled:
    header = spec.header
    text_a, text_b, label_column = spec.columns
  else:
    header = True
    text_a, text_b = _AX_COLUMNS if split == "ax" else spec.test_columns
    label_column = None
  examples = []
  for line, row in enumerate(rows[1:] if header else rows, start=2 if header else 1):
    where = f"{path}:{line}"
    needed = max(c if c >= 0 else -c - 1 for c in (text_a, text_b, label_column)
                 if c is not None) + 1
    blank = not row or (len(row) == 1 and not row[0].strip())
    if not labelled and (blank or len(row) < needed):
      # The GLUE server wants a prediction for every test row.
      raise errors.UsageError(f"{where}: a test row with {len(row)} of the {needed} columns; the "
                              "submission needs every row, so fix the file")
    if blank:
      report.skip(where, "empty line")
      continue
    if len(row) < needed:
      report.skip(where, f"fewer than {needed} columns")
      continue
    label: str | float | None = None
    if label_column is not None:
      raw = row[label_column].strip()
      if spec.is_regression:
        try:
          label = float(raw)
        except ValueError:
          report.skip(where, "a score that is not a number")
          continue
        # float() reads "nan" and "inf"; either would make the loss NaN.
        if not math.isfinite(label):
          report.skip(where, "a score that is not finite")
          continue
        low, high = spec.score_range or (-math.inf, math.inf)
        if not low <= label <= high:
          report.skip(where, f"a score outside {low:g} to {high:g}")
          continue
      elif raw not in spec.labels:
        report.skip(where, "a label outside " + "/".join(spec.labels))
        continue
      else:
        label = raw
    index = _row_index(row, len(examples), has_index_column=not labelled)
    examples.append(Example(f"{split}-{index}", row[text_a],
                            None if text_b is None else row[text_b], label, index))
  if own_report:
    report.log(path, len(examples))
  if not examples:
    raise errors.UsageError(f"{path}: no usable rows")
  return examples


def read_tfds(spec: TaskSpec, split: str, data_dir: str | None = None,
              name: str | None = None) -> list[Example]:
  """The examples of a split of TFDS `glue/<task>` (prepared beforehand as
  array_record; read with `tfds.data_source`, without TensorFlow).

  Args:
    spec: The task.
    split: bertjax's split name ("train", "dev", "test", MNLI's others, "ax").
    data_dir: The TFDS data directory (None: TFDS's default).
    name: Another TFDS dataset with the same features (default: the task's).
  """
  if name is None:
    name = "glue/ax" if split == "ax" else spec.tfds_name
  splits = {**_TFDS_SPLITS, **(_TFDS_MNLI_SPLITS if spec.name == "mnli" else {})}
  tfds_split = "test" if split == "ax" else splits.get(split)
  if tfds_split is None:
    raise errors.UsageError(f"{spec.name} has no split {split!r} in TFDS")
  source = tfds_io.open_source(name, tfds_split, data_dir)
  return examples_from_tfds(spec, split, source)


def examples_from_tfds(spec: TaskSpec, split: str, source: Any) -> list[Example]:
  """Examples from a TFDS GLUE data source (test labels are -1: none).

  TFDS labels are class ids; the TSV label strings are "0"/"1" for the binary
  tasks (the same ids) and the class names for the NLI tasks.
  """
  feature_a, feature_b = spec.tfds_features
  names = None
  if spec.labels is not None and spec.labels != _BINARY:
    names = source.dataset_info.features["label"].names
  examples = []
  for position in range(len(source)):
    record = source[position]
    label: str | float | None = None
    raw = record.get("label")
    if raw is not None and float(raw) != -1.0:
      if spec.is_regression:
        label = float(raw)
      else:
        label = names[int(raw)] if names is not None else str(int(raw))
    index = int(record.get("idx", position))
    decode = lambda value: value.decode("utf-8") if isinstance(value, bytes) else str(value)
    examples.append(Example(f"{split}-{index}", decode(record[feature_a]),
                            None if feature_b is None else decode(record[feature_b]),
                            label, index))
  return examples


def label_ids(spec: TaskSpec) -> dict[str, int]:
  return {label: i for i, label in enumerate(spec.labels or ())}
