"""SQuAD scoring against values worked out by hand from the official scripts' rules."""

import json

import pytest

from bertjax.evaluation import squad
from bertjax.tools import evaluate_squad


def _data(questions, version):
  """SQuAD JSON with one paragraph holding `questions` [(id, [gold answer texts])]."""
  qas = [{"id": qid, "question": "q?", "answers": [{"text": t, "answer_start": 0}
                                                   for t in golds]}
         for qid, golds in questions]
  return {"version": version, "data": [{"title": "t", "paragraphs": [
      {"context": "c", "qas": qas}]}]}


def test_normalisation_drops_case_punctuation_articles_and_spaces():
  assert squad.normalize_answer("  The  Eiffel-Tower, an\tIcon! ") == "eiffeltower icon"
  assert squad.normalize_answer("theatre") == "theatre"  # whole words only
  assert squad.normalize_answer("A") == ""


def test_v1_divides_by_every_question_and_scores_missing_as_zero(capsys):
  data = _data([("q1", ["the Eiffel Tower", "Eiffel Tower in Paris"]), ("q2", ["1889"]),
                ("q3", ["x"])], "1.1")
  result = squad.evaluate_v1(data["data"], {"q1": "Eiffel tower!", "q2": "in 1889"})
  assert result == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 2 / 3) / 3})
  assert list(result) == ["exact_match", "f1"]
  assert "Unanswered question q3 will receive score 0." in capsys.readouterr().err


def test_v1_empty_prediction_scores_zero_f1():
  assert squad.token_f1("", "", empty_matches_empty=False) == 0.0
  assert squad.token_f1("", "", empty_matches_empty=True) == 1.0
  assert squad.token_f1("the", "a") == 1.0  # both normalise to nothing


# q5's only gold answers normalise to nothing: the v2.0 script treats it as
# unanswerable when scoring but still counts it under HasAns.
V2_QUESTIONS = [("q1", ["Paris"]), ("q2", ["blue whale"]), ("q3", []), ("q4", []),
                ("q5", [".", "a"])]
V2_PREDICTIONS = {"q1": "Paris", "q2": "the whale", "q3": "", "q4": "London", "q5": ""}
V2_NO_ANSWER = {"q1": 0.1, "q5": 0.2, "q2": 0.6, "q4": 0.7, "q3": 0.9}


def test_v2_scores_thresholds_and_best_thresholds():
  data = _data(V2_QUESTIONS, "v2.0")["data"]
  result = squad.evaluate_v2(data, V2_PREDICTIONS, V2_NO_ANSWER)
  expected = {
      "exact": 60.0, "f1": 100 * (3 + 2 / 3) / 5, "total": 5,
      "HasAns_exact": 200 / 3, "HasAns_f1": 100 * (2 + 2 / 3) / 3, "HasAns_total": 3,
      "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
      # Running score from 2 (both NoAns right): q1 +1 -> 3 at 0.1, q5 +1 -> 4 at
      # 0.2, q2 +0 (exact) or +2/3 (F1) at 0.6, q4 -1, q3 +0.
      "best_exact": 80.0, "best_exact_thresh": 0.2,
      "best_f1": 100 * (4 + 2 / 3) / 5, "best_f1_thresh": 0.6}
  assert result == pytest.approx(expected)
  assert list(result) == list(expected)  # the official key order

  thresholded = squad.evaluate_v2(data, V2_PREDICTIONS, V2_NO_ANSWER, threshold=0.5)
  # q2 (0.6), q4 (0.7) and q3 (0.9) become "no answer": 0, 1, 1.
  assert thresholded["exact"] == thresholded["f1"] == 80.0


def test_v2_without_probabilities_reports_no_best_threshold():
  result = squad.evaluate_v2(_data(V2_QUESTIONS, "v2.0")["data"], V2_PREDICTIONS)
  assert "best_f1" not in result and result["exact"] == 60.0


def test_best_threshold_keeps_the_first_of_equal_scores():
  # Every answer wrong: switching any question off "no answer" never helps.
  answerable = {"a": True, "b": False}
  score, threshold = squad.best_threshold({"a": "x", "b": "y"}, {"a": 0, "b": 0},
                                          {"a": 0.3, "b": 0.4}, answerable)
  assert (score, threshold) == (50.0, 0.0)


def test_v2_missing_predictions_are_an_error():
  with pytest.raises(ValueError, match="1 of 5 questions have no prediction"):
    squad.evaluate_v2(_data(V2_QUESTIONS, "v2.0")["data"],
                      {k: v for k, v in V2_PREDICTIONS.items() if k != "q2"})


def _write(tmp_path, name, value):
  path = tmp_path / name
  path.write_text(json.dumps(value))
  return str(path)


def test_command_line_prints_the_official_json(tmp_path, capsys):
  data = _write(tmp_path, "dev.json", _data(V2_QUESTIONS, "v2.0"))
  predictions = _write(tmp_path, "predictions.json", V2_PREDICTIONS)
  odds = _write(tmp_path, "null_odds.json", V2_NO_ANSWER)
  evaluate_squad.main([data, predictions, "--na-prob-file", odds])
  printed = json.loads(capsys.readouterr().out)
  assert printed == pytest.approx(squad.evaluate_v2(_data(V2_QUESTIONS, "v2.0")["data"],
                                                    V2_PREDICTIONS, V2_NO_ANSWER))
  out_file = str(tmp_path / "eval.json")
  evaluate_squad.main([data, predictions, "-n", odds, "-t", "0.5", "-o", out_file])
  assert json.load(open(out_file))["exact"] == 80.0

  v1 = _write(tmp_path, "dev1.json", _data([("q1", ["Paris"])], "1.1"))
  evaluate_squad.main([v1, _write(tmp_path, "p1.json", {"q1": "paris"})])
  assert capsys.readouterr().out.strip() == '{"exact_match": 100.0, "f1": 100.0}'
  evaluate_squad.main([v1, str(tmp_path / "p1.json"), "-o", out_file])  # v1.1's too
  assert json.load(open(out_file)) == {"exact_match": 100.0, "f1": 100.0}
  assert capsys.readouterr().out == ""


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not valid JSON"),
    ('{"version": "1.1"}', 'no top-level "data" list'),
    ('{"version": "1.1", "data": [{"paragraphs": [{"qas": [{"id": "q"}]}]}]}',
     "malformed SQuAD data"),
])
def test_command_line_names_the_bad_file(tmp_path, content, message, capsys):
  data = tmp_path / "bad.json"
  data.write_text(content)
  predictions = _write(tmp_path, "p.json", {"q": "x"})
  with pytest.raises(SystemExit) as error:
    evaluate_squad.main([str(data), predictions])
  assert error.value.code == 2
  line = capsys.readouterr().err
  assert line.startswith("error: ") and line.count("\n") == 1, line
  assert message in line and "bad.json" in line
