"""Hostile input files: each is refused with a message naming the file and the
place in it, or skipped and counted in the reader's summary; none is read as
data.

SQuAD JSON, GLUE STS-B scores, safetensors headers and the shard names of a
`model.safetensors.index.json`.
"""

import json
import struct

import numpy as np
import pytest

from bertjax.data import glue, squad
from bertjax.data.skips import SkipReport
from bertjax.interop import hf
from bertjax.tools import evaluate_squad

CONTEXT = "The Normans were the people who gave their name to Normandy, a region in France."
START = CONTEXT.index("Normandy")


def _squad(tmp_path, qa=None, paragraph=None, data=None, name="train.json"):
  """A SQuAD file with one article ("Normans") of one paragraph: a good
  question, then `qa` (a question with id "bad"), fields of `paragraph`
  replaced; or `data` as the whole file."""
  if data is None:
    good = {"id": "good", "question": "What region?",
            "answers": [{"text": "Normandy", "answer_start": START}]}
    body = {"context": CONTEXT, "qas": [good] + ([qa] if qa else [])}
    body.update(paragraph or {})
    data = {"version": "1.1", "data": [{"title": "Normans", "paragraphs": [body]}]}
  path = tmp_path / name
  path.write_text(json.dumps(data))
  return str(path)


def _located_error(path, is_training, *places):
  with pytest.raises(ValueError) as error:
    squad.read_examples(path, is_training=is_training)
  message = str(error.value)
  assert "\n" not in message
  for place in (path, *places):
    assert place in message, (place, message)
  return message


@pytest.mark.parametrize("is_training", [True, False])
def test_squad_null_context_names_the_paragraph(tmp_path, is_training):
  path = _squad(tmp_path, paragraph={"context": None})
  message = _located_error(path, is_training, "data[0].paragraphs[0]", "Normans", "'context'")
  assert "null" in message


@pytest.mark.parametrize("question", [42, None, ["What", "region?"]])
@pytest.mark.parametrize("is_training", [True, False])
def test_squad_question_that_is_not_text_names_the_question(tmp_path, question, is_training):
  path = _squad(tmp_path, qa={"id": "bad", "question": question,
                              "answers": [{"text": "France", "answer_start": 73}]})
  _located_error(path, is_training, "data[0].paragraphs[0].qas[1]", "Normans", "bad",
                 "'question'")


@pytest.mark.parametrize("data", [{"version": "1.1"}, {"version": "1.1", "data": None},
                                  {"data": {"title": "Normans"}}])
def test_squad_without_a_data_list_names_the_file(tmp_path, data):
  path = _squad(tmp_path, data=data)
  _located_error(path, True, '"data"')


@pytest.mark.parametrize("start", ["73", 73.0, True])
def test_squad_answer_start_that_is_not_an_integer_names_the_question(tmp_path, start):
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": "France", "answer_start": start}]})
  message = _located_error(path, True, "qas[1]", "Normans", "bad", "answer_start")
  assert repr(start) in message or json.dumps(start) in message


@pytest.mark.parametrize("text", ["   ", "\t\n", ""])
def test_squad_blank_answer_is_skipped_and_counted(tmp_path, text):
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": text, "answer_start": 3}]})
  report = SkipReport()
  examples = squad.read_examples(path, is_training=True, report=report)
  assert [e.qas_id for e in examples] == ["good"]
  assert report.total == 1
  (reason,) = report.counts
  assert "blank" in reason
  assert "qas[1]" in report.examples[0] and "bad" in report.examples[0]


def test_squad_answer_text_that_is_not_a_string_names_the_question(tmp_path):
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": 5, "answer_start": 73}]})
  _located_error(path, False, "qas[1]", "bad", "'text'")


def test_squad_is_impossible_that_is_not_a_boolean_names_the_question(tmp_path):
  # bool("false") is True: read as it stood, the question became unanswerable.
  path = _squad(tmp_path, qa={"id": "bad", "question": "Which country?", "is_impossible": "false",
                              "answers": [{"text": "France", "answer_start": 73}]})
  _located_error(path, True, "qas[1]", "bad", "is_impossible")


def test_evaluate_squad_names_the_malformed_question(tmp_path, capsys):
  data = _squad(tmp_path, qa={"id": "bad", "question": "Which country?",
                              "answers": [{"text": 5, "answer_start": 73}]}, name="dev.json")
  predictions = tmp_path / "predictions.json"
  predictions.write_text(json.dumps({"good": "Normandy", "bad": "France"}))
  with pytest.raises(SystemExit) as error:
    evaluate_squad.main([data, str(predictions)])
  assert error.value.code == 2
  message = capsys.readouterr().err
  assert message.startswith("error: ") and data in message and "qas[1]" in message
  assert "bad" in message and "'text'" in message


STSB_HEADER = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
               "sentence2\tscore")


def test_stsb_scores_that_are_not_finite_or_outside_0_to_5_are_skipped_and_counted(tmp_path):
  scores = ["3.2", "nan", "inf", "-inf", "NaN", "5.5", "-0.5", "5.000", "0"]
  lines = [STSB_HEADER] + [f"{i}\tmain\tMSRvid\t2012\t{i:04d}\tnone\tnone\tA man.\tA dog.\t{s}"
                           for i, s in enumerate(scores)]
  (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
  report = SkipReport(keep_examples=10)
  examples = glue.read_tsv(glue.task_spec("stsb"), str(tmp_path), "train", report=report)
  assert [e.label for e in examples] == [3.2, 5.0, 0.0]
  assert report.total == 6
  assert sorted(report.counts.values()) == [2, 4]
  path = tmp_path / "train.tsv"
  located = [example.split(": ")[0] for example in report.examples]
  assert located == [f"{path}:{line}" for line in (3, 4, 5, 6, 7, 8)]


def _safetensors(path, header, data=b""):
  raw = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
  return str(path)


SIXTEEN_BYTES = np.arange(4, dtype=np.float32).tobytes()


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]},  # (-2) * (-2) * 4 = 16
    {"dtype": "F32", "shape": [-4], "data_offsets": [16, 0]},  # -4 * 4 = 0 - 16
    {"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4], "data_offsets": [0.0, 16.0]},
    # Reaches back into the header: 16 bytes, but 8 of them are not the tensor's.
    {"dtype": "F32", "shape": [4], "data_offsets": [-8, 8]},
])
def test_malformed_safetensors_entry_names_file_and_tensor(tmp_path, entry):
  path = _safetensors(tmp_path / "model.safetensors", {"bert.pooler.dense.bias": entry},
                      SIXTEEN_BYTES)
  with pytest.raises(ValueError) as error:
    hf.read_safetensors(path)
  message = str(error.value)
  assert path in message and "bert.pooler.dense.bias" in message, message


def _sharded_directory(tmp_path, shard_name):
  """A model directory whose index names `shard_name`, with a readable
  safetensors file at the place that name points to."""
  model = tmp_path / "model"
  (model / "sub").mkdir(parents=True)
  outside = tmp_path / "outside.safetensors"
  _safetensors(outside, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
               SIXTEEN_BYTES)
  name = str(outside) if shard_name == "ABSOLUTE" else shard_name
  (model / hf.SAFETENSORS_INDEX_FILE).write_text(json.dumps(
      {"metadata": {}, "weight_map": {"w": name}}))
  return str(model), name


@pytest.mark.parametrize("shard_name", ["../outside.safetensors", "ABSOLUTE",
                                        "sub/../../outside.safetensors"])
def test_index_naming_a_shard_outside_the_model_directory_is_refused(tmp_path, shard_name):
  directory, name = _sharded_directory(tmp_path, shard_name)
  with pytest.raises(ValueError) as error:
    hf.read_weights(directory)
  message = str(error.value)
  assert hf.SAFETENSORS_INDEX_FILE in message and name in message, message


@pytest.mark.parametrize("saved_as", ["bom", "crlf", "bom+crlf"])
def test_a_vocabulary_saved_on_another_system_reads_as_the_original(tmp_path, saved_as):
  """A vocab.txt with a UTF-8 byte-order mark or CRLF line ends (a Windows
  editor's save) has the same tokens, so the same ids, as the original."""
  from bertjax.data.tokenizers import WordPieceTokenizer, read_vocab
  from tests import reference

  original = tmp_path / "vocab.txt"
  reference.write_vocab(str(original))
  text = original.read_text(encoding="utf-8")
  if "crlf" in saved_as:
    text = text.replace("\n", "\r\n")
  saved = tmp_path / f"{saved_as}.txt"
  saved.write_bytes(("\ufeff" if "bom" in saved_as else "").encode() + text.encode("utf-8"))
  assert read_vocab(str(saved)) == read_vocab(str(original))
  assert read_vocab(str(saved))[0] == "[PAD]"
  sentence = "the quick brown fox jumps over the lazy dog"
  assert (WordPieceTokenizer(str(saved)).encode(sentence)
          == WordPieceTokenizer(str(original)).encode(sentence))


def test_json_and_text_files_saved_with_a_byte_order_mark_read_as_without(tmp_path):
  """config.json, tokenizer and model settings edited in a Windows editor."""
  from bertjax import files

  path = tmp_path / "config.json"
  path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"hidden_size": 32}).encode())
  assert files.read_json(str(path)) == {"hidden_size": 32}
  assert files.read_text(str(path)) == json.dumps({"hidden_size": 32})
