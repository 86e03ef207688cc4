"""SQuAD examples and features: answers found, windows, and spans that map
back to the exact answer text."""

import json
import os

import numpy as np
import pytest

from bertjax.data import squad
from bertjax.data.tokenizers import JsonTokenizer, WordPieceTokenizer
from bertjax.tasks.squad import get_final_text
from tests import reference


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  reference.write_vocab(str(path))
  return WordPieceTokenizer(str(path))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
  """A byte-level BPE (ModernBERT's kind of tokenizer), its directory beside it."""
  directory = tmp_path_factory.mktemp("bpe")
  reference.write_bpe_tokenizer(directory)
  return JsonTokenizer(str(directory / "tokenizer.json"))


CONTEXT = ("The quick brown fox (jumping-resumed) jumped over the lazy dog. Hello, World! "
           "Café résumé tests: the  naive tokenizer jumps\tover NAIVE dogs.")


def _squad_file(path, questions, context=CONTEXT, version="1.1"):
  """A SQuAD JSON file with one paragraph and questions [(id, answer text or None)]."""
  qas = []
  for qid, answer in questions:
    record = {"id": qid, "question": "Where is the fox?", "answers": []}
    if answer is None:
      record["is_impossible"] = True
    else:
      record["answers"] = [{"text": answer, "answer_start": context.index(answer)}]
    qas.append(record)
  path.write_text(json.dumps({"version": version, "data": [
      {"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
  return str(path)


# Whole words, parts of words, and answers with whitespace around or inside
# them (" naive" follows a second space, " jumped" a word; "resumed) " ends in one).
ANSWERS = ["The quick", "quick brown fox", "jumping", "resumed", "lazy dog", "Hello", "World!",
           "Café résumé", "naive tokenizer", "NAIVE dogs", "jumped over the lazy dog",
           "fox (jumping-resumed)", " naive", " jumped", "resumed) ", "jumps\tover"]


def test_passage_words_and_character_map():
  words, char_to_word = squad.split_passage("ab  c\td")
  assert words == ["ab", "c", "d"]
  assert char_to_word == [0, 0, 0, 0, 1, 1, 2]


# One window, and windows overlapping by more and by less; the byte-level BPE
# (a 300-token vocabulary) cuts the text into more pieces, so its rows are longer.
@pytest.mark.parametrize("kind,max_seq_length,doc_stride", [
    ("tokenizer", 64, 128), ("tokenizer", 24, 5), ("tokenizer", 20, 3),
    ("bpe", 128, 128), ("bpe", 40, 5), ("bpe", 32, 3)])
def test_training_spans_map_back_to_the_exact_answer(tmp_path, request, kind, max_seq_length,
                                                     doc_stride):
  """Each answer's span is tightened to the answer's own pieces (`jumping` in
  `(jumping-resumed)`), with a byte-level BPE too, whose pieces depend on
  whether the answer follows a space."""
  tokenizer = request.getfixturevalue(kind)
  path = _squad_file(tmp_path / "train.json", [(f"q{i}", a) for i, a in enumerate(ANSWERS)])
  examples = squad.read_examples(path, is_training=True)
  assert len(examples) == len(ANSWERS)
  # The answers whose first character follows another of its word (not a space).
  assert [e.orig_answer_text for e in examples if e.answer_in_word] == [
      "jumping", "resumed", "resumed) "]
  features = squad.convert_examples_to_features(examples, tokenizer, max_seq_length,
                                                doc_stride, max_query_length=8,
                                                is_training=True)
  found = set()
  for feature in features:
    assert len(feature.input_ids) <= max_seq_length
    assert feature.input_ids == tokenizer.convert_tokens_to_ids(feature.tokens)
    if feature.start_position == 0:
      continue
    example = examples[feature.example_index]
    start, end = feature.start_position, feature.end_position
    predicted = tokenizer.pieces_to_text(feature.tokens[start:end + 1])
    words = example.doc_tokens[feature.token_to_orig_map[start]:
                               feature.token_to_orig_map[end] + 1]
    assert get_final_text(predicted, " ".join(words), tokenizer) == " ".join(
        example.orig_answer_text.split())
    if not example.answer_in_word:  # the span starts with its first word's first piece
      assert feature.token_to_orig_map.get(start - 1) != feature.token_to_orig_map[start]
    found.add(example.qas_id)
  # Every answer is whole inside at least one window.
  assert found == {f"q{i}" for i in range(len(ANSWERS))}


def test_a_byte_level_bpe_reads_the_passage_as_running_text(tmp_path, bpe):
  """The row a byte-level BPE gives a question and its passage is transformers'
  encoding of the pair, the passage's whitespace made single spaces: the
  passage's words after the first carry the mark of a preceding space, as in
  pre-training text (their pieces alone would not)."""
  transformers = pytest.importorskip("transformers")
  path = _squad_file(tmp_path / "dev.json", [("q", "lazy dog")])
  examples = squad.read_examples(path, is_training=False)
  features = squad.convert_examples_to_features(examples, bpe, 512, 128, 64, False)
  assert len(features) == 1
  theirs = transformers.AutoTokenizer.from_pretrained(os.path.dirname(bpe.path))
  expected = theirs("Where is the fox?", " ".join(CONTEXT.split()))["input_ids"]
  assert features[0].input_ids == expected


def test_windows_cover_the_passage_and_each_piece_has_one_best_window(tmp_path, tokenizer):
  path = _squad_file(tmp_path / "dev.json", [("q", "lazy dog")])
  examples = squad.read_examples(path, is_training=False)
  features = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=24,
                                                doc_stride=5, max_query_length=8,
                                                is_training=False)
  assert len(features) > 3
  passage_pieces = sum(len(p) for p in tokenizer.encode_pieces(examples[0].doc_tokens))
  best = {}  # piece index in the passage -> windows where it is at its best
  for window, feature in enumerate(features):
    question_end = feature.tokens.index("[SEP]")
    positions = sorted(feature.token_to_orig_map)
    assert positions[0] == question_end + 1 and feature.tokens[-1] == "[SEP]"
    assert feature.segment_ids == [0] * (question_end + 1) + [1] * (len(feature.tokens)
                                                                    - question_end - 1)
    offset = window * 5  # windows start doc_stride pieces apart
    for position in positions:
      if feature.token_is_max_context[position]:
        best.setdefault(offset + position - positions[0], []).append(window)
  assert sorted(best) == list(range(passage_pieces))
  assert all(len(windows) == 1 for windows in best.values())


def test_v2_unanswerable_questions_point_at_cls(tmp_path, tokenizer):
  path = _squad_file(tmp_path / "v2.json", [("a", "lazy dog"), ("b", None)], version="v2.0")
  examples = squad.read_examples(path, is_training=True)
  assert [e.is_impossible for e in examples] == [False, True]
  features = squad.convert_examples_to_features(examples, tokenizer, 64, 128, 8, True)
  arrays = squad.feature_arrays(features, 64, tokenizer.pad_id)
  assert arrays["start_positions"][1] == arrays["end_positions"][1] == 0
  assert arrays["start_positions"][0] > 0
  assert arrays["input_ids"].shape == (2, 64) and arrays["attention_mask"][0].sum() == len(
      features[0].tokens)


LAZY = CONTEXT.index("lazy dog")


def test_answers_that_do_not_match_their_offsets_are_counted_and_skipped(tmp_path, caplog):
  data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": [
      {"id": "good", "question": "?", "answers": [{"text": "lazy dog", "answer_start": LAZY}]},
      {"id": "moved", "question": "?", "answers": [{"text": "lazy dog", "answer_start": 3}]},
      {"id": "past", "question": "?", "answers": [{"text": "dogs.", "answer_start": 999}]},
      {"id": "none", "question": "?", "answers": []},
  ]}]}]}
  path = tmp_path / "train.json"
  path.write_text(json.dumps(data))
  with caplog.at_level("WARNING"):
    examples = squad.read_examples(str(path), is_training=True)
  assert [e.qas_id for e in examples] == ["good"]
  assert "kept 1 questions, skipped 3" in caplog.text
  assert "answer text not found at its answer_start" in caplog.text
  assert "data[0].paragraphs[0].qas[1]" in caplog.text
  # Evaluation keeps every question.
  assert len(squad.read_examples(str(path), is_training=False)) == 4


@pytest.mark.parametrize("content,message", [
    ("[1, 2]", "expected a JSON object"),
    ('{"data": [{"paragraphs": [{"qas": []}]}]}', r"data\[0\].paragraphs\[0\]: missing 'context'"),
    ('{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "q"}]}]}]}',
     r"qas\[0\]: missing 'question'"),
    ("{oops", "not valid JSON"),
])
def test_malformed_files_name_the_place(tmp_path, content, message):
  path = tmp_path / "bad.json"
  path.write_text(content)
  with pytest.raises(ValueError, match=message):
    squad.read_examples(str(path), is_training=False)


def test_final_text_projects_onto_the_original_characters(tokenizer):
  assert get_final_text("cafe resume", "Café résumé", tokenizer) == "Café résumé"
  assert get_final_text("jumping", "(jumping-resumed).", tokenizer) == "jumping"
  assert get_final_text("world", "World!", tokenizer) == "World"
  assert get_final_text("nowhere", "World!", tokenizer) == "World!"  # not found: all of it


def test_feature_arrays_are_padded(tokenizer, tmp_path):
  path = _squad_file(tmp_path / "d.json", [("q", "Hello")])
  examples = squad.read_examples(path, is_training=False)
  features = squad.convert_examples_to_features(examples, tokenizer, 128, 128, 64, False)
  arrays = squad.feature_arrays(features, 128, tokenizer.pad_id)
  assert np.all(arrays["input_ids"][0, len(features[0].tokens):] == tokenizer.pad_id)


def test_tfds_squad_becomes_squad_json(tmp_path, tokenizer):
  import tensorflow_datasets as tfds

  from tests import tfds_builders

  context = "The quick brown fox jumped over the lazy dog."
  records = [
      {"id": "a", "title": "Fox", "context": context, "question": "Who jumped?",
       "answers": {"text": ["quick brown fox"], "answer_start": [4]}, "is_impossible": False},
      {"id": "b", "title": "Fox", "context": context, "question": "Who slept?",
       "answers": {"text": [], "answer_start": []}, "is_impossible": True},
      {"id": "c", "title": "Other", "context": "A world test.", "question": "What?",
       "answers": {"text": ["world test"], "answer_start": [2]}, "is_impossible": False}]
  tfds_builders.prepare("FakeSquad", {
      "id": tfds.features.Text(), "title": tfds.features.Text(),
      "context": tfds.features.Text(), "question": tfds.features.Text(),
      "is_impossible": tfds.features.Scalar(dtype=np.bool_),
      "answers": tfds.features.Sequence({"text": tfds.features.Text(),
                                         "answer_start": tfds.features.Scalar(dtype=np.int32)})},
      {"train": records}, str(tmp_path))
  data = squad.from_tfds("fake_squad", "train", str(tmp_path))
  paragraphs = {p["context"]: p for article in data["data"] for p in article["paragraphs"]}
  assert sorted(q["id"] for q in paragraphs[context]["qas"]) == ["a", "b"]
  examples = {e.qas_id: e for e in squad.read_examples(data, is_training=True)}
  assert examples["a"].orig_answer_text == "quick brown fox" and examples["b"].is_impossible
  assert " ".join(examples["c"].doc_tokens[examples["c"].start_position:
                                           examples["c"].end_position + 1]) == "world test."
