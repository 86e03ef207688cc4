"""SQuAD v1.1 and v2.0 fine-tuning and prediction: the paper's section 4.2-4.3.

  python -m bertjax.main --config=configs/squad.py:v1.1 --workdir=/tmp/squad \
      --config.init_checkpoint=uncased_L-12_H-768_A-12 \
      --config.data.train_file=train-v1.1.json --config.data.predict_file=dev-v1.1.json

A start vector and an end vector score every passage piece; the answer is the
best span with end >= start, at most `max_answer_length` pieces, inside one
window where its start has the most context, mapped back onto the original
passage text (`get_final_text`). SQuAD v2.0 also scores "no answer" as the span
at [CLS], s_null = S.C + E.C (the lowest over the question's windows), and
answers null when s_null exceeds the best span's score by more than a
threshold tau. Tau is chosen on the dev set to maximise F1 (the official
script's `best_f1_thresh`), written to `results.json` and beside the model
(`model/squad.json`), and used for test predictions.

Writes `predictions.json`, `nbest_predictions.json` and (v2.0)
`null_odds.json` for the dev file, the same with a `test_` prefix for
`data.test_file`, `results.json`, and the fine-tuned model in `model/`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

from absl import logging
import jax
import ml_collections
import numpy as np

from bertjax import errors, files, metrics, runs
from bertjax.data import squad as squad_data
from bertjax.evaluation import squad as squad_eval
from bertjax.pretrained import Pretrained, add_span_bilstm, save_pretrained
from bertjax.tasks import finetune

THRESHOLD_FILE = "squad.json"
_NO_SPAN_SCORE_DIFF = 1e30  # a question whose windows offer no valid span


def _strip_spaces(text: str) -> tuple[str, dict[int, int]]:
  """Text without spaces, and each kept character's index in `text`."""
  kept, positions = [], {}
  for index, char in enumerate(text):
    if char == " ":
      continue
    positions[len(kept)] = index
    kept.append(char)
  return "".join(kept), positions


def get_final_text(predicted: str, original: str, tokenizer) -> str:
  """The span of `original` (passage words as written) that `predicted` (the
  de-tokenised pieces, normalised) covers, character for character.

  As the original: normalise `original` the way the tokenizer does, find the
  prediction in it, and map its ends back through the non-space characters;
  if anything does not line up, the whole of `original`.
  """
  normalized = " ".join(tokenizer.basic_tokenize(original))
  start = normalized.find(predicted)
  if start == -1:
    return original
  end = start + len(predicted) - 1
  original_chars, original_map = _strip_spaces(original)
  normalized_chars, normalized_map = _strip_spaces(normalized)
  if len(original_chars) != len(normalized_chars):
    return original
  to_stripped = {index: stripped for stripped, index in normalized_map.items()}
  if start not in to_stripped or end not in to_stripped:
    return original
  first = original_map.get(to_stripped[start])
  last = original_map.get(to_stripped[end])
  if first is None or last is None:
    return original
  return original[first:last + 1]


def _best_indexes(logits: np.ndarray, n_best_size: int) -> list[int]:
  return [int(i) for i in np.argsort(-logits, kind="stable")[:n_best_size]]


def _softmax(scores: Sequence[float]) -> list[float]:
  top = max(scores)
  exps = [math.exp(s - top) for s in scores]
  total = sum(exps)
  return [e / total for e in exps]


def postprocess(examples: Sequence[squad_data.Example], features: Sequence[squad_data.Feature],
                start_logits: np.ndarray, end_logits: np.ndarray, tokenizer, *,
                n_best_size: int, max_answer_length: int, version_2: bool,
                null_threshold: float = 0.0) -> dict[str, Any]:
  """Answers from the windows' logits, as the original `write_predictions`.

  Returns:
    {"predictions": id -> text, "nbest": id -> [{text, probability,
    start_logit, end_logit}], and for v2.0 "null_odds": id -> s_null minus
    the best span's score, "best_non_null": id -> the best non-empty answer}.
  """
  predictions, nbest_json, null_odds, best_non_null = {}, {}, {}, {}
  for example_index, feature_indices in squad_data.features_by_example(features):
    example = examples[example_index]
    prelim = []  # (feature index, start, end, start logit, end logit)
    score_null, null_entry = math.inf, None
    for index in feature_indices:
      feature = features[index]
      starts, ends = start_logits[index], end_logits[index]
      if version_2:
        feature_null = float(starts[0] + ends[0])
        if feature_null < score_null:
          score_null, null_entry = feature_null, (index, 0, 0, float(starts[0]), float(ends[0]))
      for start in _best_indexes(starts, n_best_size):
        for end in _best_indexes(ends, n_best_size):
          if (start >= len(feature.tokens) or end >= len(feature.tokens)
              or start not in feature.token_to_orig_map or end not in feature.token_to_orig_map
              or not feature.token_is_max_context.get(start, False) or end < start
              or end - start + 1 > max_answer_length):
            continue
          prelim.append((index, start, end, float(starts[start]), float(ends[end])))
    if version_2 and null_entry is not None:
      prelim.append(null_entry)
    prelim.sort(key=lambda p: p[3] + p[4], reverse=True)

    nbest, seen = [], set()
    for index, start, end, start_logit, end_logit in prelim:
      if len(nbest) >= n_best_size:
        break
      if start > 0:
        feature = features[index]
        predicted = tokenizer.pieces_to_text(feature.tokens[start:end + 1])
        words = example.doc_tokens[feature.token_to_orig_map[start]:
                                   feature.token_to_orig_map[end] + 1]
        text = get_final_text(predicted, " ".join(words), tokenizer)
      else:
        text = ""
      if text in seen:
        continue
      seen.add(text)
      nbest.append((text, start_logit, end_logit))
    if version_2 and "" not in seen and null_entry is not None:
      nbest.append(("", null_entry[3], null_entry[4]))
    if not nbest:
      nbest.append(("empty", 0.0, 0.0))

    probabilities = _softmax([s + e for _, s, e in nbest])
    nbest_json[example.qas_id] = [
        {"text": text, "probability": p, "start_logit": s, "end_logit": e}
        for (text, s, e), p in zip(nbest, probabilities)]
    if not version_2:
      predictions[example.qas_id] = nbest[0][0]
      continue
    non_null = next((entry for entry in nbest if entry[0]), None)
    if non_null is None:
      diff, answer = _NO_SPAN_SCORE_DIFF, ""
    else:
      diff, answer = score_null - non_null[1] - non_null[2], non_null[0]
    null_odds[example.qas_id] = diff
    best_non_null[example.qas_id] = answer
    predictions[example.qas_id] = "" if diff > null_threshold else answer
  result = {"predictions": predictions, "nbest": nbest_json}
  if version_2:
    result.update(null_odds=null_odds, best_non_null=best_non_null)
  return result


def null_threshold_for(dataset: squad_eval.Dataset, decoded: dict[str, Any]) -> float:
  """The tau that maximises dev F1: the official `best_f1_thresh` over the
  best non-null answers with their null odds."""
  answers = decoded["best_non_null"]
  _, f1 = squad_eval.raw_scores(dataset, answers)
  _, threshold = squad_eval.best_threshold(answers, f1, decoded["null_odds"],
                                           squad_eval.has_answer(dataset))
  return threshold


def with_threshold(decoded: dict[str, Any], threshold: float) -> dict[str, str]:
  return {qid: "" if decoded["null_odds"][qid] > threshold else answer
          for qid, answer in decoded["best_non_null"].items()}


def load_data(config: ml_collections.ConfigDict, name: str) -> dict[str, Any]:
  """SQuAD JSON of a data file (`data.source="json"`), or of a TFDS split
  (`"tfds"`: `name` is the split of `data.tfds_name`, e.g. "validation")."""
  if config.data.source == "json":
    data = files.read_json(name)
    for _ in squad_data.iter_paragraphs(data, name):  # the first malformed record, located
      pass
    return data
  if config.data.source == "tfds":
    tfds_name = config.data.tfds_name or f"squad/{config.data.version}"
    return squad_data.from_tfds(tfds_name, name, config.data.dir or None)
  raise errors.UsageError(
      f"config.data.source must be 'json' or 'tfds', got {config.data.source!r}")


def _write_json(path: str, value: Any) -> None:
  files.write_text(path, json.dumps(value, indent=2))


class _Predictor:
  """Features of a file, the model's logits, and the decoded answers."""

  def __init__(self, config: ml_collections.ConfigDict, tokenizer, tuner: finetune.FineTuner):
    self.config, self.tokenizer, self.tuner = config, tokenizer, tuner

  def __call__(self, name: str, data: dict[str, Any],
               threshold: float) -> tuple[list[squad_data.Example], dict]:
    config = self.config
    examples = squad_data.read_examples(data, is_training=False, name=name)
    features = squad_data.convert_examples_to_features(
        examples, self.tokenizer, config.max_seq_length, config.doc_stride,
        config.max_query_length, is_training=False)
    arrays = squad_data.feature_arrays(features, config.max_seq_length, self.tokenizer.pad_id)
    outputs = self.tuner.predict(arrays, os.path.basename(name))
    decoded = postprocess(examples, features, outputs["start_logits"], outputs["end_logits"],
                          self.tokenizer, n_best_size=config.n_best_size,
                          max_answer_length=config.max_answer_length,
                          version_2=config.data.version == "v2.0",
                          null_threshold=threshold)
    return examples, decoded


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes on `data.train_file` (if given), predicts and scores the dev
  file, predicts `data.test_file` (if given)."""
  if config.data.version not in ("v1.1", "v2.0"):
    raise errors.UsageError(f"config.data.version must be 'v1.1' or 'v2.0', got "
                            f"{config.data.version!r}")
  version_2 = config.data.version == "v2.0"
  bundle = finetune.load_model(config, "question_answering")
  if config.model.span_bilstm:
    bundle = add_span_bilstm(bundle, config.seed)
  tokenizer = bundle.tokenizer
  threshold = config.null_score_diff_threshold
  stored = os.path.join(config.init_checkpoint, THRESHOLD_FILE)
  if threshold is None and version_2 and files.exists(stored):
    threshold = files.read_json(stored)["null_score_diff_threshold"]
    logging.info("Null threshold %.4f from %s", threshold, stored)
  tune = version_2 and config.null_score_diff_threshold is None and bool(
      config.data.train_file or config.tune_null_threshold)
  threshold = 0.0 if threshold is None else threshold

  # Every file is read (and checked) before training, not after it.
  to_predict = {prefix: load_data(config, name) for prefix, name in (
      ("", config.data.predict_file), ("test_", config.data.test_file)) if name}
  recipe = finetune.Recipe.from_config(config)
  train_arrays, total_steps = None, 1
  if config.data.train_file:
    examples = squad_data.read_examples(load_data(config, config.data.train_file),
                                        is_training=True, name=config.data.train_file)
    features = squad_data.convert_examples_to_features(
        examples, tokenizer, config.max_seq_length, config.doc_stride, config.max_query_length,
        is_training=True)
    train_arrays = squad_data.feature_arrays(features, config.max_seq_length, tokenizer.pad_id)
    # run_squad.py counts questions, not windows: with long contexts split into
    # several windows, "3 epochs" trains on fewer than 3 passes over the windows.
    total_steps = finetune.run_steps(len(examples), "training questions", recipe)
    logging.info("%d training questions, %d windows, %d steps of %d", len(examples),
                 len(features), total_steps, recipe.batch_size)
  writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0, config=config)
  tuner = finetune.FineTuner(bundle, "span", recipe, total_steps, config, writer)
  runs.save_config(config, workdir)  # the settings are checked, the model loaded
  if train_arrays is not None:
    for epoch in range(int(np.ceil(recipe.epochs))):
      tuner.train_epoch(train_arrays, epoch)
  writer.close()

  predict = _Predictor(config, tokenizer, tuner)
  results: dict[str, Any] = {"version": config.data.version}
  outputs: dict[str, Any] = {}
  if config.data.predict_file:
    data = to_predict[""]
    dataset = data["data"]
    _, decoded = predict(config.data.predict_file, data, threshold)
    if version_2:
      if tune:
        threshold = null_threshold_for(dataset, decoded)
        decoded["predictions"] = with_threshold(decoded, threshold)
        results["null_score_diff_threshold_tuned"] = True
      # The predictions as written (tau applied), then what the official
      # script prints for predictions.json with --na-prob-file null_odds.json.
      results["dev"] = squad_eval.evaluate_v2(dataset, decoded["predictions"])
      results["dev_official_with_null_odds"] = squad_eval.evaluate_v2(
          dataset, decoded["predictions"], decoded["null_odds"])
      results["null_score_diff_threshold"] = threshold
    else:
      results["dev"] = squad_eval.evaluate_v1(dataset, decoded["predictions"])
    logging.info("dev: %s", json.dumps(results["dev"]))
    outputs[""] = decoded
  if config.data.test_file:
    _, outputs["test_"] = predict(config.data.test_file, to_predict["test_"], threshold)
  params = tuner.params() if config.data.train_file else None

  if jax.process_index() == 0:
    for prefix, decoded in outputs.items():
      _write_json(os.path.join(workdir, f"{prefix}predictions.json"), decoded["predictions"])
      _write_json(os.path.join(workdir, f"{prefix}nbest_predictions.json"), decoded["nbest"])
      if version_2:
        _write_json(os.path.join(workdir, f"{prefix}null_odds.json"), decoded["null_odds"])
    if params is not None:
      model_dir = os.path.join(workdir, "model")
      save_pretrained(Pretrained(bundle.config, params, tokenizer, "question_answering"),
                      model_dir, overwrite=True)
      if version_2 and (results.get("null_score_diff_threshold_tuned")
                        or config.null_score_diff_threshold is not None):
        _write_json(os.path.join(model_dir, THRESHOLD_FILE),
                    {"null_score_diff_threshold": threshold})
    # Written last: a run with results.json finished whole (the sweep reads it).
    _write_json(os.path.join(workdir, "results.json"), results)
  runs.say_fine_tuning_is_done(workdir, results)
  return results
