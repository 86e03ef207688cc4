"""SQuAD scoring with the official v1.1 and v2.0 evaluation scripts' semantics.

Both scripts score a prediction against each gold answer after normalising
(lower case, no punctuation, no articles "a"/"an"/"the", single spaces) and keep
the best exact match and token F1. Their differences are kept here on purpose,
so the figures are the ones the leaderboard and papers report:

- v1.1 divides by every question in the data; a question without a prediction
  scores 0 (with a message on stderr).
- v2.0 reports questions without a prediction (a message on stdout) and then
  fails, as the script does (here with a clear error, there a KeyError). Gold answers that normalise to nothing are
  dropped; a question left without gold answers is unanswerable and only the
  empty string is right for it. F1 of two empty token lists is 1, of one empty
  list 0. With a no-answer probability per question, a question whose
  probability exceeds the threshold counts as answered "no answer", and
  `best_exact`/`best_f1` with their thresholds give the score at the best
  threshold, searched over the probabilities in increasing order.
"""

from __future__ import annotations

import collections
import re
import string
import sys
from typing import Any, Mapping, Sequence, TextIO

from bertjax import errors

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)

# SQuAD JSON: {"version": ..., "data": [{"paragraphs": [{"context": ...,
#   "qas": [{"id": ..., "question": ..., "answers": [{"text": ...}], ...}]}]}]}
Dataset = Sequence[Mapping[str, Any]]  # the "data" list


def normalize_answer(text: str) -> str:
  """Lower case, punctuation and articles removed, whitespace collapsed."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def answer_tokens(text: str) -> list[str]:
  return normalize_answer(text).split() if text else []


def exact_match(gold: str, prediction: str) -> int:
  return int(normalize_answer(gold) == normalize_answer(prediction))


def token_f1(gold: str, prediction: str, empty_matches_empty: bool = True) -> float:
  """The bag-of-tokens F1 of two answers.

  Args:
    gold: A gold answer.
    prediction: The predicted answer.
    empty_matches_empty: v2.0's rule: if either side normalises to no token,
      F1 is 1 when both do and 0 otherwise. v1.1 (False) scores 0 then.
  """
  gold_tokens, predicted_tokens = answer_tokens(gold), answer_tokens(prediction)
  if empty_matches_empty and (not gold_tokens or not predicted_tokens):
    return float(gold_tokens == predicted_tokens)
  common = collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(predicted_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def _questions(dataset: Dataset):
  for article in dataset:
    for paragraph in article["paragraphs"]:
      yield from paragraph["qas"]


def evaluate_v1(dataset: Dataset, predictions: Mapping[str, str],
                log: TextIO | None = None) -> dict[str, float]:
  """`evaluate-v1.1.py`: {"exact_match": ..., "f1": ...} in percent.

  Unanswered questions are reported on `log` (default stderr, as the script).
  """
  log = log or sys.stderr
  total = exact = f1 = 0.0
  for question in _questions(dataset):
    total += 1
    if question["id"] not in predictions:
      print(f"Unanswered question {question['id']} will receive score 0.", file=log)
      continue
    prediction = predictions[question["id"]]
    golds = [answer["text"] for answer in question["answers"]]
    if not golds:
      raise errors.UsageError(f"question {question['id']} has no gold answer: SQuAD v2.0 data is "
                              "scored with the v2.0 rules")
    exact += max(exact_match(gold, prediction) for gold in golds)
    f1 += max(token_f1(gold, prediction, empty_matches_empty=False) for gold in golds)
  return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def has_answer(dataset: Dataset) -> dict[str, bool]:
  """Question id -> whether the data gives it an answer (v2.0's `answers` list)."""
  return {question["id"]: bool(question["answers"]) for question in _questions(dataset)}


def raw_scores(dataset: Dataset, predictions: Mapping[str, str],
               log: TextIO | None = None) -> tuple[dict[str, int], dict[str, float]]:
  """v2.0's per-question (exact, F1) before any no-answer threshold; missing
  predictions are reported on `log` (default stdout, as the script)."""
  log = log or sys.stdout
  exact, f1 = {}, {}
  for question in _questions(dataset):
    qid = question["id"]
    golds = [a["text"] for a in question["answers"] if normalize_answer(a["text"])] or [""]
    if qid not in predictions:
      print(f"Missing prediction for {qid}", file=log)
      continue
    prediction = predictions[qid]
    exact[qid] = max(exact_match(gold, prediction) for gold in golds)
    f1[qid] = max(token_f1(gold, prediction) for gold in golds)
  return exact, f1


def apply_no_answer_threshold(scores: Mapping[str, float], no_answer_probs: Mapping[str, float],
                              answerable: Mapping[str, bool],
                              threshold: float) -> dict[str, float]:
  """Scores after predicting "no answer" where the probability exceeds `threshold`."""
  return {qid: (float(not answerable[qid]) if no_answer_probs[qid] > threshold else score)
          for qid, score in scores.items()}


def _summary(exact: Mapping[str, float], f1: Mapping[str, float],
             qids: Sequence[str] | None = None) -> dict[str, float]:
  qids = list(exact) if not qids else qids
  total = len(qids)
  return {"exact": 100.0 * sum(exact[q] for q in qids) / total,
          "f1": 100.0 * sum(f1[q] for q in qids) / total, "total": total}


def best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float],
                   no_answer_probs: Mapping[str, float],
                   answerable: Mapping[str, bool]) -> tuple[float, float]:
  """(best score in percent, its threshold), as v2.0's `find_best_thresh`.

  Starting from "no answer" everywhere (every unanswerable question right),
  questions are switched to their predicted answer in increasing order of
  no-answer probability; the threshold is the probability of the last question
  switched at the best running score (ties keep the lower threshold).
  """
  running = best = sum(1 for qid in answerable if not answerable[qid])
  threshold = 0.0
  for qid in sorted(no_answer_probs, key=lambda q: no_answer_probs[q]):
    if qid not in scores:
      continue
    if answerable[qid]:
      running += scores[qid]
    elif predictions[qid]:
      running -= 1
    if running > best:
      best, threshold = running, no_answer_probs[qid]
  return 100.0 * best / len(scores), threshold


def evaluate_v2(dataset: Dataset, predictions: Mapping[str, str],
                no_answer_probs: Mapping[str, float] | None = None,
                threshold: float = 1.0, log: TextIO | None = None) -> dict[str, float]:
  """`evaluate-v2.0.py`: the same keys in the same order.

  Args:
    dataset: The data's "data" list.
    predictions: Question id -> answer text ("" for no answer).
    no_answer_probs: Question id -> probability of no answer (`--na-prob-file`).
      Without it every probability is 0 and no best threshold is reported.
    threshold: `--na-prob-thresh`.
    log: Where the missing-prediction messages go (stdout, as the script).
  """
  probs_given = no_answer_probs is not None
  if no_answer_probs is None:
    no_answer_probs = {qid: 0.0 for qid in predictions}
  answerable = has_answer(dataset)
  exact_raw, f1_raw = raw_scores(dataset, predictions, log)
  missing = len(answerable) - len(exact_raw)
  if missing:  # the official script fails on these too (a KeyError)
    raise errors.UsageError(f"{missing} of {len(answerable)} questions have no prediction; v2.0 "
                            "scoring needs one for every question (\"\" for no answer)")
  unscored = [qid for qid in exact_raw if qid not in no_answer_probs]
  if unscored:
    raise errors.UsageError(f"{len(unscored)} questions have no no-answer probability, e.g. "
                            f"{unscored[0]!r}")
  exact = apply_no_answer_threshold(exact_raw, no_answer_probs, answerable, threshold)
  f1 = apply_no_answer_threshold(f1_raw, no_answer_probs, answerable, threshold)
  result = _summary(exact, f1)
  for prefix, wanted in (("HasAns", True), ("NoAns", False)):
    qids = [qid for qid, value in answerable.items() if value == wanted]
    if qids:
      result.update({f"{prefix}_{k}": v for k, v in _summary(exact, f1, qids).items()})
  if probs_given:
    result["best_exact"], result["best_exact_thresh"] = best_threshold(
        predictions, exact_raw, no_answer_probs, answerable)
    result["best_f1"], result["best_f1_thresh"] = best_threshold(
        predictions, f1_raw, no_answer_probs, answerable)
  return result
