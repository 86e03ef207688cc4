"""Entity-level precision, recall and F1 with the CoNLL evaluation script's rules.

`conlleval` reads tags `B-X`, `I-X`, `E-X`, `S-X` and `O` and decides where an
entity starts and ends from each tag and the one before it, so it scores both
the IOB1 tags of the CoNLL-2003 files and IOB2/IOBES. An `I-X` after `O` or
after another type opens an entity; a type change closes one. An entity is
correct when its first token, last token and type all match the gold one.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from bertjax import errors

Entity = tuple[str, int, int]  # (type, first token, last token) within a sentence list


def _split(tag: str) -> tuple[str, str]:
  """("B", "PER") from "B-PER"; ("O", "") from "O"."""
  if tag == "O" or not tag:
    return "O", ""
  prefix, _, kind = tag.partition("-")
  if not kind:  # a bare type, as conlleval's -r mode
    return "I", prefix
  return prefix, kind


def _ends(previous: str, previous_type: str, tag: str, kind: str) -> bool:
  if previous in ("E", "S"):
    return True
  if previous in ("B", "I") and tag in ("B", "S", "O"):
    return True
  return previous != "O" and previous_type != kind


def _starts(previous: str, previous_type: str, tag: str, kind: str) -> bool:
  if tag in ("B", "S"):
    return True
  if previous in ("E", "S", "O") and tag in ("E", "I"):
    return True
  return tag != "O" and previous_type != kind


def entities(tags: Sequence[str]) -> list[Entity]:
  """The entities of one sentence's tags."""
  found, start = [], None
  previous, previous_type = "O", ""
  for i, raw in enumerate(list(tags) + ["O"]):  # "O" closes the last entity
    tag, kind = _split(raw)
    if start is not None and _ends(previous, previous_type, tag, kind):
      found.append((previous_type, start, i - 1))
      start = None
    if _starts(previous, previous_type, tag, kind):
      start = i
    previous, previous_type = tag, kind
  return found


@dataclasses.dataclass
class Scores:
  precision: float
  recall: float
  f1: float
  gold: int
  predicted: int
  correct: int


def _scores(gold: int, predicted: int, correct: int) -> Scores:
  precision = correct / predicted if predicted else 0.0
  recall = correct / gold if gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return Scores(precision, recall, f1, gold, predicted, correct)


def evaluate(gold_sentences: Iterable[Sequence[str]],
             predicted_sentences: Iterable[Sequence[str]]) -> dict[str, Scores]:
  """Scores overall (key "overall") and per entity type.

  Args:
    gold_sentences: Each sentence's gold tags.
    predicted_sentences: The predicted tags, sentence for sentence.

  Raises:
    ValueError: if a sentence's lengths differ.
  """
  gold_entities, predicted_entities = set(), set()
  for index, (gold, predicted) in enumerate(zip(gold_sentences, predicted_sentences,
                                                strict=True)):
    if len(gold) != len(predicted):
      raise errors.UsageError(
          f"sentence {index}: {len(gold)} gold tags, {len(predicted)} predicted")
    gold_entities.update((index, *e) for e in entities(gold))
    predicted_entities.update((index, *e) for e in entities(predicted))
  correct = gold_entities & predicted_entities
  result = {"overall": _scores(len(gold_entities), len(predicted_entities), len(correct))}
  for kind in sorted({e[1] for e in gold_entities | predicted_entities}):
    count = lambda items: sum(1 for e in items if e[1] == kind)
    result[kind] = _scores(count(gold_entities), count(predicted_entities), count(correct))
  return result
