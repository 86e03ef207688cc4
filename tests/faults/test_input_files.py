"""Hostile input files: each is refused with a message naming the file and the
place in it, or skipped and counted in the reader's summary; none is read as
data.

SQuAD JSON and GLUE STS-B scores.
"""

import json

import pytest

from bertjax.data import glue, squad
from bertjax.data.skips import SkipReport
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
  message = str(error.value)
  assert data in message and "qas[1]" in message and "bad" in message and "'text'" in message


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
