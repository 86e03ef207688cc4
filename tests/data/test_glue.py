"""GLUE readers on files in the layouts of GLUE's download script."""

import logging

import numpy as np
import pytest

from bertjax.data import glue
from tests import tfds_builders


def _write(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_every_task_reads_its_train_dev_and_test_layout(tmp_path):
  rows = {  # task -> (train/dev lines, test lines)
      "cola": (["gj04\t1\t\tThe sailors rode the breeze clear of the rocks.",
                "gj04\t0\t*\tThe more we study verbs, the crazier they get get."],
               ["index\tsentence", "0\tBill whistled past the house."]),
      "sst2": (["sentence\tlabel", "it 's a charming and often affecting journey . \t1"],
               ["index\tsentence", "0\tuneasy mishmash of styles and genres ."]),
      "mrpc": (["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , Amrozi ."],
               ["index\t#1 ID\t#2 ID\t#1 String\t#2 String",
                "0\t1089874\t1089925\tPCCW 's chief .\tCurrent Chief Operating Officer ."]),
      "stsb": (["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                "sentence2\tscore",
                "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off."
                "\tAn air plane is taking off.\t5.000"],
               ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                "sentence2", "0\tmain-news\theadlines\t2016\t0001\tnone\tnone\tA man.\tA dog."]),
      "qqp": (["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
               "133273\t213221\t213222\tHow is the life?\tHow is life?\t0"],
              ["id\tquestion1\tquestion2", "0\tWhy am I?\tWho am I?"]),
      "qnli": (["index\tquestion\tsentence\tlabel",
                "0\tWhat came into force?\tThe law came into force.\tentailment"],
               ["index\tquestion\tsentence", "0\tWhat?\tThat."]),
      "rte": (["index\tsentence1\tsentence2\tlabel",
               "0\tDana Reeve died.\tChristopher Reeve had an accident.\tnot_entailment"],
              ["index\tsentence1\tsentence2", "0\tMexico.\tMexico City."]),
      "wnli": (["index\tsentence1\tsentence2\tlabel", "0\tI stuck a pin.\tThe pin had a hole.\t0"],
               ["index\tsentence1\tsentence2", "0\tThe dog.\tThe cat."]),
  }
  expected = {  # task -> (text_a, text_b, label) of the first train row
      "cola": ("The sailors rode the breeze clear of the rocks.", None, "1"),
      "sst2": ("it 's a charming and often affecting journey . ", None, "1"),
      "mrpc": ("Amrozi accused his brother .", "Referring to him , Amrozi .", "1"),
      "stsb": ("A plane is taking off.", "An air plane is taking off.", 5.0),
      "qqp": ("How is the life?", "How is life?", "0"),
      "qnli": ("What came into force?", "The law came into force.", "entailment"),
      "rte": ("Dana Reeve died.", "Christopher Reeve had an accident.", "not_entailment"),
      "wnli": ("I stuck a pin.", "The pin had a hole.", "0"),
  }
  for task, (labelled, test) in rows.items():
    directory = tmp_path / task
    directory.mkdir()
    for name in ("train.tsv", "dev.tsv"):
      _write(directory / name, labelled)
    _write(directory / "test.tsv", test)
    spec = glue.task_spec(task)
    train = glue.read_tsv(spec, str(directory), "train")
    assert (train[0].text_a, train[0].text_b, train[0].label) == expected[task], task
    test_examples = glue.read_tsv(spec, str(directory), "test")
    assert test_examples[0].label is None and test_examples[0].index == 0, task
    assert test_examples[0].text_a and (test_examples[0].text_b is None) == (
        expected[task][1] is None), task


def test_mnli_splits_and_the_diagnostic_set(tmp_path):
  header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
            "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")
  parses = "\t".join(["( x )"] * 4)
  _write(tmp_path / "train.tsv", [header + "\tlabel1\tgold_label",
                                  f"0\t1\t1e\tgov\t{parses}\tConceptually cream.\t"
                                  "Product and geography.\tneutral\tneutral"])
  dev = [header + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
         f"0\t1\t1e\tgov\t{parses}\tThe new rights.\tEveryone loves.\tneutral\tentailment\t"
         "neutral\tneutral\tneutral\tneutral"]
  _write(tmp_path / "dev_matched.tsv", dev)
  _write(tmp_path / "dev_mismatched.tsv", dev)
  _write(tmp_path / "test_matched.tsv", [header, f"7\t1\t1e\tgov\t{parses}\tA.\tB."])
  _write(tmp_path / "diagnostic.tsv", ["index\tsentence1\tsentence2",
                                       "0\tThe cat sat.\tThe cat did not sit."])
  spec = glue.task_spec("mnli")
  assert glue.read_tsv(spec, str(tmp_path), "train")[0].label == "neutral"
  assert glue.read_tsv(spec, str(tmp_path), "dev_mismatched")[0].text_b == "Everyone loves."
  test = glue.read_tsv(spec, str(tmp_path), "test")[0]
  assert (test.index, test.text_a, test.label) == (7, "A.", None)
  ax = glue.read_tsv(spec, str(tmp_path), "ax")[0]
  assert (ax.text_a, ax.text_b) == ("The cat sat.", "The cat did not sit.")
  assert spec.submission == {"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv",
                             "ax": "AX.tsv"}


def test_bad_rows_are_counted_and_reported_with_their_line(tmp_path, caplog):
  _write(tmp_path / "train.tsv", [
      "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
      "1\t1\t2\tGood?\tGood.\t1",
      "2\t3\t4\tA question with a line break",   # QQP's known broken rows
      "3\t5\t6\tLabel?\tWrong.\t2",
      "",
      "4\t7\t8\tFine?\tFine.\t0"])
  with caplog.at_level(logging.WARNING):
    examples = glue.read_tsv(glue.task_spec("qqp"), str(tmp_path), "train")
  assert [e.label for e in examples] == ["1", "0"]
  message = caplog.text
  assert "kept 2 rows, skipped 3" in message
  assert "1 fewer than 6 columns" in message and "1 a label outside 0/1" in message
  assert "1 empty line" in message
  assert f"{tmp_path}/train.tsv:3" in message


def test_unparsable_score_and_missing_files(tmp_path, caplog):
  _write(tmp_path / "train.tsv", ["h", "0\tg\tf\ty\to\ts\ts\tA.\tB.\tfive"])
  with pytest.raises(ValueError, match="train.tsv: no usable rows"):
    glue.read_tsv(glue.task_spec("stsb"), str(tmp_path), "train")
  assert "a score that is not a number" in caplog.text
  with pytest.raises(FileNotFoundError, match="dev.tsv not found"):
    glue.read_tsv(glue.task_spec("stsb"), str(tmp_path), "dev")
  with pytest.raises(ValueError, match="unknown GLUE task 'sts'"):
    glue.task_spec("sts")
  with pytest.raises(ValueError, match="rte has no split 'ax'"):
    glue.read_tsv(glue.task_spec("rte"), str(tmp_path), "ax")


def test_tfds_glue_labels_become_the_tsv_label_strings(tmp_path):
  import tensorflow_datasets as tfds

  tfds_builders.prepare("FakeMnli", {
      "premise": tfds.features.Text(), "hypothesis": tfds.features.Text(),
      "label": tfds.features.ClassLabel(names=["entailment", "neutral", "contradiction"]),
      "idx": tfds.features.Scalar(dtype=np.int32)}, {
      "train": [{"premise": f"p{i}", "hypothesis": f"h{i}", "label": i % 3, "idx": i}
                for i in range(6)],
      "test_matched": [{"premise": "p", "hypothesis": "h", "label": -1, "idx": 41}]},
      str(tmp_path))
  spec = glue.task_spec("mnli")
  train = glue.read_tfds(spec, "train", str(tmp_path), name="fake_mnli")
  by_premise = {e.text_a: (e.text_b, e.label, e.index) for e in train}  # TFDS reorders
  assert by_premise["p0"] == ("h0", "entailment", 0)
  assert by_premise["p1"] == ("h1", "neutral", 1)
  assert by_premise["p5"] == ("h5", "contradiction", 5)
  assert all(e.label in spec.labels for e in train)
  test = glue.read_tfds(spec, "test", str(tmp_path), name="fake_mnli")
  assert (test[0].label, test[0].index) == (None, 41)

  tfds_builders.prepare("FakeMrpc", {
      "sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(),
      "label": tfds.features.ClassLabel(names=["not_equivalent", "equivalent"]),
      "idx": tfds.features.Scalar(dtype=np.int32)}, {
      "validation": [{"sentence1": "a", "sentence2": "b", "label": 1, "idx": 0}]},
      str(tmp_path))
  dev = glue.read_tfds(glue.task_spec("mrpc"), "dev", str(tmp_path), name="fake_mrpc")
  assert dev[0].label == "1"  # the TSV's "1" (equivalent)


def test_diagnostic_set_beside_the_task_directories_and_whole_test_files(tmp_path):
  mnli = tmp_path / "MNLI"
  mnli.mkdir()
  (tmp_path / "diagnostic").mkdir()
  _write(tmp_path / "diagnostic" / "diagnostic.tsv",
         ["index\tsentence1\tsentence2", "0\tThe cat sat.\tThe cat did not sit."])
  spec = glue.task_spec("mnli")
  assert glue.split_directory(spec, str(mnli), "ax") == str(tmp_path / "diagnostic")
  assert glue.split_directory(spec, str(mnli), "test") is None
  # A test row that does not fit cannot be skipped: the server wants every row.
  _write(mnli / "test_matched.tsv", ["header", "0\tonly two columns"])
  with pytest.raises(ValueError, match=r"test_matched.tsv:2: a test row with 2 of the 10"):
    glue.read_tsv(spec, str(mnli), "test")
