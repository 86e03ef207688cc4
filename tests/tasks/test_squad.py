"""SQuAD decoding on constructed logits, and fine-tuning end to end on small
learnable SQuAD files (v1.1 and v2.0) from a Hugging Face checkpoint."""

import json
import os
import re

import numpy as np
import pytest

from bertjax.data import squad as squad_data
from bertjax.data.tokenizers import WordPieceTokenizer
from bertjax.tasks import squad
from tests import reference
from tests.tasks.finetuning import tiny_config

FILLER = "the quick brown fox jump over lazy world test".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  reference.write_vocab(str(path))
  return WordPieceTokenizer(str(path))


def _one_example(tmp_path, context, answer="lazy dog", version="1.1"):
  data = {"version": version, "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
      {"id": "q", "question": "where", "answers": [
          {"text": answer, "answer_start": context.index(answer)}]}]}]}]}
  path = tmp_path / "dev.json"
  path.write_text(json.dumps(data))
  return squad_data.read_examples(str(path), is_training=False)


def _logits_for(features, window, tokens_wanted, tokenizer):
  """Logits that favour the span of `tokens_wanted` in one window."""
  starts = np.zeros((len(features), 24), np.float32)
  ends = np.zeros((len(features), 24), np.float32)
  feature = features[window]
  for i in range(len(feature.tokens) - len(tokens_wanted)):
    if feature.tokens[i:i + len(tokens_wanted)] == tokens_wanted:
      starts[window, i], ends[window, i + len(tokens_wanted) - 1] = 5.0, 4.0
      return starts, ends
  raise AssertionError("span not in window")


def test_decoding_picks_the_best_valid_span_and_maps_it_back(tmp_path, tokenizer):
  context = "The Quick brown fox jumped over the Lazy Dog, said the world test."
  examples = _one_example(tmp_path, context, "Lazy Dog")
  features = squad_data.convert_examples_to_features(examples, tokenizer, 24, 6, 8, False)
  window = next(i for i, f in enumerate(features)
                if "lazy" in f.tokens and f.token_is_max_context[f.tokens.index("lazy")])
  starts, ends = _logits_for(features, window, ["lazy", "dog"], tokenizer)
  # An invalid span scores higher: end before start, and one in the question.
  starts[window, 1] = ends[window, 1] = 50.0
  decoded = squad.postprocess(examples, features, starts, ends, tokenizer, n_best_size=5,
                              max_answer_length=30, version_2=False)
  assert decoded["predictions"] == {"q": "Lazy Dog"}  # original case and punctuation kept
  nbest = decoded["nbest"]["q"]
  assert nbest[0]["text"] == "Lazy Dog" and len({e["text"] for e in nbest}) == len(nbest)
  assert sum(e["probability"] for e in nbest) == pytest.approx(1.0)
  # max_answer_length rules out the two-piece answer.
  short = squad.postprocess(examples, features, starts, ends, tokenizer, n_best_size=5,
                            max_answer_length=1, version_2=False)
  assert short["predictions"]["q"] != "Lazy Dog"


def test_v2_null_odds_and_threshold(tmp_path, tokenizer):
  context = "The quick brown fox jumped over the lazy dog, said the world test to the fox."
  examples = _one_example(tmp_path, context, version="v2.0")
  features = squad_data.convert_examples_to_features(examples, tokenizer, 24, 6, 8, False)
  assert len(features) > 1
  window = next(i for i, f in enumerate(features)
                if "lazy" in f.tokens and f.token_is_max_context[f.tokens.index("lazy")])
  starts, ends = _logits_for(features, window, ["lazy", "dog"], tokenizer)  # span score 9
  starts[:, 0], ends[:, 0] = 3.0, 2.0   # s_null 5 in every window...
  starts[window, 0] = 4.0               # ...the lowest counts: 5
  decoded = squad.postprocess(examples, features, starts, ends, tokenizer, n_best_size=5,
                              max_answer_length=30, version_2=True, null_threshold=0.0)
  assert decoded["null_odds"]["q"] == pytest.approx(5.0 - 9.0)
  assert decoded["predictions"]["q"] == "lazy dog"
  assert "" in [e["text"] for e in decoded["nbest"]["q"]]
  strict = squad.postprocess(examples, features, starts, ends, tokenizer, n_best_size=5,
                             max_answer_length=30, version_2=True, null_threshold=-5.0)
  assert strict["predictions"]["q"] == "" and strict["best_non_null"]["q"] == "lazy dog"


def write_squad(path, count, seed, version):
  """Passages of filler words; the answer is the word "hello" (absent in 30%
  of v2.0's questions, which are then unanswerable)."""
  rng = np.random.default_rng(seed)
  qas_by_paragraph = []
  for i in range(count):
    words = list(rng.choice(FILLER, rng.integers(8, 30)))
    answerable = version == "1.1" or rng.random() < 0.7
    if answerable:
      words.insert(int(rng.integers(0, len(words) + 1)), "hello")
    context = " ".join(words)
    qa = {"id": f"q{i}", "question": "where is hello ?", "answers": []}
    if answerable:
      qa["answers"] = [{"text": "hello", "answer_start": context.index("hello")}]
    else:
      qa["is_impossible"] = True
    qas_by_paragraph.append({"context": context, "qas": [qa]})
  data = {"version": version, "data": [{"title": "t", "paragraphs": qas_by_paragraph}]}
  path.write_text(json.dumps(data))
  return str(path)


def _config(version, checkpoint, **files):
  from bertjax.configs import squad as squad_config

  return tiny_config(squad_config.get_config(version), checkpoint, 32,
                     **{"doc_stride": 16, "max_query_length": 8},
                     **{f"data.{name}": value for name, value in files.items()})


def test_squad_v1_fine_tunes_and_scores_like_the_official_script(tiny_hf_checkpoint, tmp_path,
                                                                   absl_caplog):
  from bertjax.evaluation import squad as squad_eval

  train = write_squad(tmp_path / "train.json", 400, 0, "1.1")
  dev = write_squad(tmp_path / "dev.json", 100, 1, "1.1")
  workdir = str(tmp_path / "run")
  with absl_caplog.at_level("INFO"):
    results = squad.run(_config("v1.1", tiny_hf_checkpoint, train_file=train,
                                predict_file=dev), workdir)
  assert results["dev"]["exact_match"] > 90.0, results
  # run_squad.py's step count: questions, not the windows of the longer
  # passages (int(400 / 32 * 6) = 75).
  questions, windows, steps = map(int, re.search(
      r"(\d+) training questions, (\d+) windows, (\d+) steps", absl_caplog.text).groups())
  assert (questions, steps) == (400, 75) and windows > 450
  logged = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert max(row["step"] for row in logged if "step" in row) == 75
  predictions = json.load(open(os.path.join(workdir, "predictions.json")))
  assert len(predictions) == 100
  dataset = json.load(open(dev))["data"]
  assert squad_eval.evaluate_v1(dataset, predictions) == results["dev"]
  nbest = json.load(open(os.path.join(workdir, "nbest_predictions.json")))
  assert nbest["q0"][0]["text"] == predictions["q0"]


def test_squad_with_a_span_bilstm(tiny_hf_checkpoint, tmp_path):
  """Table 5's "+ BiLSTM" row: a randomly initialised BiLSTM under the span
  layer, fine-tuned with the rest, saved with the model and used when it
  predicts again."""
  import bertjax

  train = write_squad(tmp_path / "train.json", 400, 0, "1.1")
  dev = write_squad(tmp_path / "dev.json", 100, 1, "1.1")
  workdir = str(tmp_path / "run")
  config = _config("v1.1", tiny_hf_checkpoint, train_file=train, predict_file=dev)
  config.model.span_bilstm = True
  results = squad.run(config, workdir)
  assert results["dev"]["exact_match"] > 90.0, results
  tuned = bertjax.load_pretrained(os.path.join(workdir, "model"))
  assert tuned.config.span_bilstm and "span_bilstm" in tuned.params
  again = squad.run(_config("v1.1", os.path.join(workdir, "model"), predict_file=dev),
                    str(tmp_path / "again"))
  assert again["dev"] == results["dev"]
  with pytest.raises(ValueError, match="has no BiLSTM"):
    bertjax.export_hf(tuned, str(tmp_path / "hf"))


def test_squad_v2_tunes_stores_and_reuses_the_null_threshold(tiny_hf_checkpoint, tmp_path, capsys):
  from bertjax.tools import evaluate_squad

  train = write_squad(tmp_path / "train.json", 500, 0, "v2.0")
  dev = write_squad(tmp_path / "dev.json", 100, 1, "v2.0")
  test = write_squad(tmp_path / "test.json", 60, 2, "v2.0")
  workdir = str(tmp_path / "run")
  results = squad.run(_config("v2.0", tiny_hf_checkpoint, train_file=train, predict_file=dev,
                              test_file=test), workdir)
  assert results["dev"]["f1"] > 85.0, results
  assert results["dev"]["HasAns_total"] + results["dev"]["NoAns_total"] == 100
  threshold = results["null_score_diff_threshold"]
  stored = json.load(open(os.path.join(workdir, "model", "squad.json")))
  assert stored["null_score_diff_threshold"] == threshold
  # The written predictions apply tau to the written null odds.
  predictions = json.load(open(os.path.join(workdir, "predictions.json")))
  odds = json.load(open(os.path.join(workdir, "null_odds.json")))
  assert all((predictions[q] == "") == (odds[q] > threshold) for q in predictions)
  assert 0 < sum(p == "" for p in predictions.values()) < 100
  # The official tool on the written files prints what results.json holds.
  evaluate_squad.main([dev, os.path.join(workdir, "predictions.json"), "--na-prob-file",
                       os.path.join(workdir, "null_odds.json")])
  assert json.loads(capsys.readouterr().out) == pytest.approx(
      results["dev_official_with_null_odds"])

  # Predicting with the fine-tuned model alone brings its threshold along.
  again = str(tmp_path / "again")
  squad.run(_config("v2.0", os.path.join(workdir, "model"), test_file=test), again)
  assert json.load(open(os.path.join(again, "test_predictions.json"))) == json.load(
      open(os.path.join(workdir, "test_predictions.json")))
