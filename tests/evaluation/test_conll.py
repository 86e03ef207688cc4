"""CoNLL entity scoring against seqeval's default (conlleval-compatible) mode."""

import numpy as np
import pytest
import seqeval.metrics

from bertjax.evaluation import conll


def test_iob1_and_iob2_entities():
  # IOB1 (the CoNLL-2003 files): I- opens an entity; B- only splits two of a type.
  assert conll.entities(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == [
      ("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]
  # A type change closes an entity even without B-.
  assert conll.entities(["B-ORG", "I-ORG", "I-MISC"]) == [("ORG", 0, 1), ("MISC", 2, 2)]
  assert conll.entities(["S-PER", "B-LOC", "E-LOC", "O"]) == [("PER", 0, 0), ("LOC", 1, 2)]


def test_scores_by_hand():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-MISC"]]
  result = conll.evaluate(gold, predicted)
  overall = result["overall"]
  assert (overall.gold, overall.predicted, overall.correct) == (3, 4, 2)
  assert overall.f1 == pytest.approx(2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3))
  assert result["LOC"].recall == 0.0 and result["ORG"].precision == 0.5
  with pytest.raises(ValueError, match="sentence 0: 2 gold tags, 1 predicted"):
    conll.evaluate([["O", "O"]], [["O"]])


@pytest.mark.parametrize("scheme", ["iob", "iobes"])
def test_random_sequences_agree_with_seqeval(scheme):
  rng = np.random.default_rng(0)
  prefixes = ["B", "I"] + (["E", "S"] if scheme == "iobes" else [])
  tags = ["O"] + [f"{p}-{t}" for p in prefixes for t in ("PER", "LOC", "MISC")]
  gold = [list(rng.choice(tags, rng.integers(1, 15))) for _ in range(300)]
  predicted = [[t if rng.random() < 0.7 else str(rng.choice(tags)) for t in sentence]
               for sentence in gold]
  result = conll.evaluate(gold, predicted)["overall"]
  assert result.precision == pytest.approx(seqeval.metrics.precision_score(gold, predicted))
  assert result.recall == pytest.approx(seqeval.metrics.recall_score(gold, predicted))
  assert result.f1 == pytest.approx(seqeval.metrics.f1_score(gold, predicted))
