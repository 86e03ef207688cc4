"""SWAG's CSV reader and its four-way features."""

import numpy as np
import pytest

from bertjax.data import swag
from bertjax.data.tokenizers import WordPieceTokenizer
from tests import reference

HEADER = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"


def test_reads_labelled_and_test_files_and_counts_bad_rows(tmp_path, caplog):
  path = tmp_path / "val.csv"
  path.write_text(HEADER + ",label\n"
                  'lsmdc0001,1,"Someone, a man.",Someone,"a man, he","gold","sits.",walks.,'
                  "runs.,jumps.,2\n"
                  "lsmdc0002,2,x,A,b,gold,c,d,e,f,7\n"
                  "lsmdc0003,3,x,A,b,gold,c,d\n"
                  "lsmdc0004,4,x,The dog,it,gold,e0,e1,e2,e3,0\n")
  with caplog.at_level("WARNING"):
    examples = swag.read_csv(str(path))
  assert [(e.context, e.start, e.endings[0], e.label) for e in examples] == [
      ("Someone", "a man, he", "sits.", 2), ("The dog", "it", "e0", 0)]
  assert "kept 2 rows, skipped 2" in caplog.text
  assert f"{path}:3: a label outside 0-3" in caplog.text
  test = tmp_path / "test.csv"
  test.write_text(HEADER + "\nv,1,x,A,b,gold,c,d,e,f\n")
  assert swag.read_csv(str(test))[0].label is None
  (tmp_path / "other.csv").write_text("a,b\n1,2\n")
  with pytest.raises(ValueError, match="other.csv: not a SWAG file"):
    swag.read_csv(str(tmp_path / "other.csv"))


def test_features_pair_the_context_with_each_ending(tmp_path):
  vocab = tmp_path / "vocab.txt"
  reference.write_vocab(str(vocab))
  tokenizer = WordPieceTokenizer(str(vocab))
  example = swag.Example(0, "the fox", "it", ("jump", "over", "lazy dog", "world"), 2)
  features = swag.featurize([example], tokenizer, 12)
  assert features["input_ids"].shape == (1, 4, 12) and features["labels"].tolist() == [2]
  for choice, ending in enumerate(example.endings):
    expected = tokenizer.encode("the fox", f"it {ending}")
    row = features["input_ids"][0, choice]
    assert row[:len(expected)].tolist() == expected
    assert features["token_type_ids"][0, choice, :len(expected)].sum() == len(
        tokenizer.encode_pieces([f"it {ending}"])[0]) + 1
  assert np.all(features["attention_mask"].sum(-1) > 0)
