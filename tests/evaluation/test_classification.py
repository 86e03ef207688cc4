"""GLUE metrics against scipy and scikit-learn."""

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from bertjax.evaluation import classification


@pytest.mark.parametrize("seed", range(5))
def test_metrics_agree_with_scipy_and_sklearn(seed):
  rng = np.random.default_rng(seed)
  labels, predictions = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
  predictions[:80] = labels[:80]  # correlated
  assert classification.accuracy(labels, predictions) == pytest.approx(
      sk.accuracy_score(labels, predictions))
  assert classification.matthews_corrcoef(labels, predictions) == pytest.approx(
      sk.matthews_corrcoef(labels, predictions))
  binary_labels, binary_predictions = labels % 2, predictions % 2
  assert classification.f1_binary(binary_labels, binary_predictions) == pytest.approx(
      sk.f1_score(binary_labels, binary_predictions))
  assert classification.matthews_corrcoef(binary_labels, binary_predictions) == pytest.approx(
      sk.matthews_corrcoef(binary_labels, binary_predictions))
  scores = np.round(rng.uniform(0, 5, 200), 1)  # STS-B-like, with ties
  noisy = scores + rng.normal(0, 1, 200)
  noisy[:20] = np.round(noisy[:20])
  assert classification.pearson(scores, noisy) == pytest.approx(
      stats.pearsonr(scores, noisy)[0])
  assert classification.spearman(scores, noisy) == pytest.approx(
      stats.spearmanr(scores, noisy)[0])


def test_degenerate_cases_match_sklearn():
  constant = np.zeros(10, int)
  varied = np.arange(10) % 2
  assert classification.matthews_corrcoef(constant, varied) == sk.matthews_corrcoef(
      constant, varied) == 0.0
  assert classification.f1_binary(constant, constant) == 0.0


def test_glue_task_metrics_in_percent():
  result = classification.glue_metrics("mrpc", [1, 0, 1, 1], [1, 0, 0, 1])
  assert list(result) == ["f1", "accuracy"]
  assert result["accuracy"] == 75.0 and result["f1"] == pytest.approx(80.0)
  with pytest.raises(ValueError, match="unknown GLUE task 'mnli_m'"):
    classification.glue_metrics("mnli_m", [0], [0])


def test_the_commonest_class_and_its_share_are_the_majority_baseline():
  labels = np.array([2, 0, 2, 1, 2, 0, 1, 2])
  guess, share = classification.commonest(labels)
  assert (guess, share) == (2, 50.0)
  # Its share is what always guessing it scores (scikit-learn's accuracy).
  assert share == 100.0 * sk.accuracy_score(labels, np.full(len(labels), guess))
  assert classification.commonest([1, 0, 0, 1]) == (0, 50.0)  # a tie: the lowest id
  with pytest.raises(ValueError, match="no labels"):
    classification.commonest([])
