"""GLUE's metrics, with their standard definitions (as `scipy` and
`scikit-learn` compute them), and which task reports which.

The paper's Table 1 reports F1 for QQP and MRPC, Spearman correlation for
STS-B, Matthews correlation for CoLA and accuracy elsewhere; the GLUE server
reports accuracy beside F1 and Pearson beside Spearman, and so does this.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from bertjax import errors


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1_binary(labels: np.ndarray, predictions: np.ndarray, positive: int = 1) -> float:
  """F1 of the positive class (0 when nothing is predicted or present positive)."""
  labels, predictions = np.asarray(labels) == positive, np.asarray(predictions) == positive
  true_positives = np.sum(labels & predictions)
  denominator = np.sum(labels) + np.sum(predictions)
  return float(2 * true_positives / denominator) if denominator else 0.0


def matthews_corrcoef(labels: np.ndarray, predictions: np.ndarray) -> float:
  """Matthews correlation of two labelings (the multiclass form; 0 when undefined)."""
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  classes = np.union1d(labels, predictions)
  confusion = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(confusion, (np.searchsorted(classes, labels),
                        np.searchsorted(classes, predictions)), 1)
  true_counts, predicted_counts = confusion.sum(1), confusion.sum(0)
  samples, correct = confusion.sum(), np.trace(confusion)
  numerator = correct * samples - true_counts @ predicted_counts
  denominator = np.sqrt((samples ** 2 - predicted_counts @ predicted_counts)
                        * (samples ** 2 - true_counts @ true_counts))
  return float(numerator / denominator) if denominator else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
  return float(np.sum(x * y) / denominator) if denominator else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
  """1-based ranks, ties sharing their average rank."""
  values = np.asarray(values, np.float64)
  order = np.argsort(values, kind="stable")
  sorted_values = values[order]
  starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
  ends = np.r_[starts[1:], len(values)]
  ranks = np.empty(len(values), np.float64)
  for start, end in zip(starts, ends):
    ranks[order[start:end]] = (start + end + 1) / 2
  return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  return pearson(_ranks(x), _ranks(y))


def commonest(labels: np.ndarray) -> tuple[int, float]:
  """The commonest class of `labels` (the lowest id of a tie) and its share in
  percent: the accuracy of always guessing it, the baseline a classifier
  must beat."""
  classes, counts = np.unique(np.asarray(labels), return_counts=True)
  if not len(classes):
    raise errors.UsageError("no labels to find the commonest class of")
  best = int(np.argmax(counts))  # the first of the largest counts: the lowest id
  return int(classes[best]), 100.0 * float(counts[best]) / float(counts.sum())


MetricFn = Callable[[np.ndarray, np.ndarray], float]

# GLUE task -> (metric name -> function of (labels, predictions)). The first
# metric is the one the paper reports and model selection uses.
GLUE_METRICS: dict[str, dict[str, MetricFn]] = {
    "cola": {"matthews_corr": matthews_corrcoef},
    "sst2": {"accuracy": accuracy},
    "mrpc": {"f1": f1_binary, "accuracy": accuracy},
    "qqp": {"f1": f1_binary, "accuracy": accuracy},
    "stsb": {"spearman": spearman, "pearson": pearson},
    "mnli": {"accuracy": accuracy},
    "qnli": {"accuracy": accuracy},
    "rte": {"accuracy": accuracy},
    "wnli": {"accuracy": accuracy},
    "ax": {"matthews_corr": matthews_corrcoef},  # the diagnostic set, scored on the server
    "stdlib_topics": {"accuracy": accuracy},  # the demo's task (bertjax.data.stdlib_topics)
}


def glue_metrics(task: str, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
  """Every metric of a GLUE task, in percent as the GLUE leaderboard shows them."""
  if task not in GLUE_METRICS:
    raise errors.UsageError(f"unknown GLUE task {task!r}; known: {', '.join(GLUE_METRICS)}")
  return {name: 100.0 * fn(labels, predictions) for name, fn in GLUE_METRICS[task].items()}
