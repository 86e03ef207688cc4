"""Training instances from tokenised documents, for the paper's three objectives.

- `mlm_nsp` (the paper): `create_instances_from_document` follows the original
  generator step by step: a target length (shorter with `short_seq_prob`),
  segment A from consecutive sentences, B the true continuation half of the
  time and otherwise a span of a random other document (A's unused sentences go
  back to the pool), pairs truncated at a random end, `[CLS] A [SEP] B [SEP]`.
- `mlm_pairs` (the paper's "No NSP", as it reads: "trained using the masked
  LM but without the NSP task"): the `mlm_nsp` pairs, half of them with a
  random B, and no next-sentence loss.
- `mlm` ("No NSP", packed): `PackedSequences` packs contiguous sentences up to
  the length, crossing documents with a `[SEP]` between them: `[CLS] ... [SEP]`
  (no random segments; RoBERTa's FULL-SENTENCES input).
- `ltr` ("LTR & No NSP"): the `mlm_pairs` pairs, `[CLS] A [SEP] B [SEP]` with
  A's and B's segment embeddings ("our input representation", section 5.1);
  the targets are the next tokens.

Randomness comes from a `numpy.random.Generator` per document (seeded by the
dataset seed, epoch and document), so an instance never depends on what came
before it and a restored loader recreates exactly the same instances.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Sequence

import grain
import numpy as np

from bertjax import errors

OBJECTIVES = ("mlm_nsp", "mlm_pairs", "mlm", "ltr")
# Instances from the next-sentence generator; the others pack contiguous text.
PAIR_OBJECTIVES = ("mlm_nsp", "mlm_pairs", "ltr")

Sentences = list[np.ndarray]  # one int32 array of token ids per sentence


def check_pair_documents(data_dir: str, objective: str, documents: int, split: str) -> None:
  """Refuses sentence pairs (`PAIR_OBJECTIVES`) from fewer than two documents:
  a "random next" B segment comes from another document, and with one there
  is none, so B would be A's own text labelled random.

  Args:
    documents: The documents of `split` that pairs are made from (their
      random B segments drawn from them too).

  Raises:
    UsageError: naming the data, the count and the ways out.
  """
  if objective in PAIR_OBJECTIVES and documents < 2:
    raise errors.UsageError(
        f"{data_dir}: {documents} document{'' if documents == 1 else 's'}"
        f"{'' if split == 'all' else f' in the {split} split'}, and the {objective} objective "
        "pairs a segment with a random one from another "
        "document: it needs two or more; a corpus of one document a line read one sentence "
        "a line is one document (rebuild it with prepare_pretraining_data "
        "--file_format=documents --overwrite), or use the mlm objective (no pairs)")


class DocumentRef(NamedTuple):
  """A document as the pipeline streams it."""

  stream_index: int  # place in the shuffled, repeated stream: unique across epochs
  index: int         # index among all documents of the dataset
  sentences: Sentences


@dataclasses.dataclass(frozen=True)
class Instance:
  """One sequence: `[CLS] A [SEP] (B [SEP])` token ids and what to learn.

  Attributes:
    token_ids: int32 [length], special tokens included.
    num_first: Tokens of `[CLS] A [SEP]` (token type 0); the rest are type 1.
    next_sentence_label: 0 if B follows A, 1 if B is random, -1 without NSP.
    key: A 64-bit id that seeds the instance's mask.
  """

  token_ids: np.ndarray
  num_first: int
  next_sentence_label: int
  key: int


_MASK64 = (1 << 64) - 1


def instance_key(*parts: int) -> int:
  """A 64-bit key mixing integers (splitmix64 steps): seeds an instance's mask.

  Instances pass their document's stream index (unique across epochs) and
  their place in the document, so keys differ between instances and epochs.
  """
  key = 0x9E3779B97F4A7C15
  for part in parts:
    key = (key ^ (part & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
    key = (key ^ (key >> 31)) * 0x94D049BB133111EB & _MASK64
    key ^= key >> 29
  return key


def truncate_pair_at_random_ends(first: list[int], second: list[int], max_tokens: int,
                  rng: np.random.Generator) -> tuple[list[int], list[int]]:
  """Trims the longer list one token at a time, from a random end each time.

  Returns the trimmed (first, second).
  """
  excess = len(first) + len(second) - max_tokens
  if excess <= 0:
    return first, second
  coins = rng.random(excess) < 0.5  # True: remove from the front
  cuts = [[0, 0], [0, 0]]  # (front, back) removals of first and second
  lengths = [len(first), len(second)]
  for coin in coins.tolist():
    longer = 0 if lengths[0] > lengths[1] else 1
    cuts[longer][0 if coin else 1] += 1
    lengths[longer] -= 1
  return (first[cuts[0][0]:len(first) - cuts[0][1]],
          second[cuts[1][0]:len(second) - cuts[1][1]])


def create_instances_from_document(
    sentences: Sentences, document_index: int, candidates: Sequence[int],
    random_document: Callable[[int], Sentences], max_seq_length: int,
    short_seq_prob: float, cls_id: int, sep_id: int, rng: np.random.Generator,
    stream_index: int = 0) -> list[Instance]:
  """The original generator's instances (with next-sentence labels) of one document.

  Args:
    sentences: The document's sentences.
    document_index: Its index among all documents.
    candidates: The documents random B segments come from (by index): those of
      the document's own split, so no held-out document reaches training.
    random_document: Sentences of a document by index.
    max_seq_length: Longest instance, special tokens included.
    short_seq_prob: Probability of a shorter target length for this document.
    cls_id, sep_id: Special token ids.
    rng: This document's random stream.
    stream_index: The document's place in the (shuffled, repeated) stream, unique
      across epochs: keys the instances' masks.
  """
  max_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
  target_length = max_tokens
  if rng.random() < short_seq_prob:
    target_length = int(rng.integers(2, max_tokens, endpoint=True))

  instances = []
  chunk: list[np.ndarray] = []
  chunk_length = 0
  i = 0
  while i < len(sentences):
    chunk.append(sentences[i])
    chunk_length += len(sentences[i])
    if i == len(sentences) - 1 or chunk_length >= target_length:
      a_end = 1 if len(chunk) < 2 else int(rng.integers(1, len(chunk) - 1, endpoint=True))
      first = [t for s in chunk[:a_end] for t in s.tolist()]
      second: list[int] = []
      if len(chunk) == 1 or rng.random() < 0.5:
        is_random_next = True
        target_second = target_length - len(first)
        other = document_index
        for _ in range(10):
          other = int(candidates[int(rng.integers(0, len(candidates)))])
          if other != document_index:
            break
        other_sentences = random_document(other)
        start = int(rng.integers(0, len(other_sentences)))
        for sentence in other_sentences[start:]:
          second.extend(sentence.tolist())
          if len(second) >= target_second:
            break
        i -= len(chunk) - a_end  # A's unused sentences go back to the pool.
      else:
        is_random_next = False
        second = [t for s in chunk[a_end:] for t in s.tolist()]
      first, second = truncate_pair_at_random_ends(first, second, max_tokens, rng)
      if first and second:
        tokens = np.array([cls_id, *first, sep_id, *second, sep_id], np.int32)
        instances.append(Instance(tokens, len(first) + 2, int(is_random_next),
                                  instance_key(stream_index, len(instances))))
      chunk, chunk_length = [], 0
    i += 1
  return instances


class PackedSequences(grain.IterDataset):
  """Packs a stream of documents into `[CLS] ... [SEP]` sequences (no NSP).

  Contiguous sentences fill each sequence up to its target length (shorter with
  `short_seq_prob`), running on into the next document after a `[SEP]`
  (`cross_documents`; otherwise a document's last sequence ends with it, for
  rows that pack sequences of several documents apart, `bertjax.data.packing`);
  a sentence longer than the target is cut into target-length pieces. With
  `truncate_documents` (ModernBERT's rule) a document gives one sequence, its
  first tokens up to the target, the last sentence cut to fit, and the rest
  of it is left out. The parent yields `DocumentRef`s; their stream index
  (unique per document and epoch) seeds the target lengths and keys the masks.
  """

  def __init__(self, parent: grain.IterDataset, max_seq_length: int,
               short_seq_prob: float, cls_id: int, sep_id: int, seed: int,
               cross_documents: bool = True, truncate_documents: bool = False):
    super().__init__(parent)
    self.max_tokens = max_seq_length - 2
    self.short_seq_prob = short_seq_prob
    self.cls_id, self.sep_id, self.seed = cls_id, sep_id, seed
    self.cross_documents = cross_documents and not truncate_documents
    self.truncate_documents = truncate_documents

  def __iter__(self) -> grain.DatasetIterator:
    return _PackingIterator(self._parent.__iter__(), self)


class _PackingIterator(grain.DatasetIterator):
  """The packer's cursor: (document, sentence, token offset), checkpointable.

  Its state is the parent's state before the current document plus the cursor
  in it, so restoring re-reads one document and continues exactly.
  """

  def __init__(self, parent: grain.DatasetIterator, packer: PackedSequences):
    super().__init__(parent)
    self._packer = packer
    self._document_state = parent.get_state()  # before `self._document` was read
    self._document: DocumentRef | None = None
    self._sentence = 0
    self._offset = 0

  def _advance_document(self) -> bool:
    self._document_state = self._parent.get_state()
    try:
      self._document = next(self._parent)
    except StopIteration:
      self._document = None
      return False
    self._sentence = self._offset = 0
    return True

  def _at_document_end(self) -> bool:
    return self._document is None or self._sentence >= len(self._document.sentences)

  def __next__(self) -> Instance:
    packer = self._packer
    if self._at_document_end() and not self._advance_document():
      raise StopIteration
    stream_index = self._document.stream_index
    key = instance_key(stream_index, self._sentence, self._offset)
    rng = np.random.default_rng([packer.seed, stream_index, self._sentence, self._offset])
    target = packer.max_tokens
    if rng.random() < packer.short_seq_prob:
      target = int(rng.integers(2, packer.max_tokens, endpoint=True))
    tokens: list[int] = []
    while len(tokens) < target:
      if self._at_document_end():
        if not packer.cross_documents or not self._advance_document():
          break
        tokens.append(packer.sep_id)  # a document boundary inside the sequence
        continue
      sentence = self._document.sentences[self._sentence]
      rest = len(sentence) - self._offset
      room = target - len(tokens)
      if rest <= room:
        tokens.extend(sentence[self._offset:].tolist())
        self._sentence, self._offset = self._sentence + 1, 0
      elif not tokens or packer.truncate_documents:  # cut the sentence to fit
        tokens.extend(sentence[self._offset:self._offset + room].tolist())
        self._offset += room
      else:
        break  # the sentence starts the next sequence
    if packer.truncate_documents:  # the rest of the document is left out
      self._sentence, self._offset = len(self._document.sentences), 0
    while tokens and tokens[-1] == packer.sep_id:
      tokens.pop()
    ids = np.array([packer.cls_id, *tokens, packer.sep_id], np.int32)
    return Instance(ids, len(ids), -1, key)

  def get_state(self) -> dict:
    return {"document_state": self._document_state, "has_document": self._document is not None,
            "sentence": self._sentence, "offset": self._offset}

  def set_state(self, state: dict) -> None:
    self._parent.set_state(state["document_state"])
    self._document_state = state["document_state"]
    self._document = None
    if state["has_document"]:
      self._document = next(self._parent)
    self._sentence, self._offset = state["sentence"], state["offset"]
