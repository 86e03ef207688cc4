"""CoNLL-2003 NER: the shared task's column files and BERT's token features.

A file (`eng.train`, `eng.testa`, `eng.testb`, or `train.txt`/`valid.txt`/
`test.txt` of the common copies) has a word per line with its columns
(`word POS chunk NER`), blank lines between sentences and `-DOCSTART-` lines
between documents. The last column is the tag, in IOB1 as distributed or IOB2.

Features follow the paper (section 5.3): a cased WordPiece model, the label on
the first piece of each word (the other pieces carry weight 0; the words read
as running text, `Tokenizer.encode_words`: of their document with context, of
their sentence without), and "the
maximal document context provided by the data": the sentence is placed among
the pieces of its neighbours in the same document, which are not scored. A
sentence longer than fits is split into several features, each word scored in
exactly one.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterator, Sequence

import numpy as np

from bertjax import errors, files
from bertjax.data import textfiles, tfds_io
from bertjax.data.skips import SkipReport

logger = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"
# A line is a word and its tags: a longer one is no word. It is skipped, read
# past a chunk at a time, so a line of any length costs bounded memory.
MAX_LINE_CHARS = 10_000
_SCAN_CHARS = 1 << 20


@dataclasses.dataclass
class Sentence:
  words: list[str]
  tags: list[str] | None  # None where the file has no tag column
  document: int            # index of its document in the file
  line: int                # line of its first word, 1-based


def read_conll(path: str, report: SkipReport | None = None) -> list[Sentence]:
  """Every sentence of a CoNLL-2003 file, with its document index."""
  own_report = report is None
  report = report or SkipReport()
  sentences: list[Sentence] = []
  words: list[str] = []
  tags: list[str] = []
  document, start_line, has_tags = 0, 0, None

  def flush():
    if words:
      sentences.append(Sentence(list(words), list(tags) if has_tags else None, document,
                                start_line))
      words.clear()
      tags.clear()

  try:
    with files.open_text(path) as f:  # a byte-order mark is not a word
      for number, line in enumerate(_lines(f), start=1):
        if line is None:
          report.skip(f"{path}:{number}", f"a line over {MAX_LINE_CHARS} characters")
          continue
        columns = line.split()
        if not columns:
          flush()
          continue
        if columns[0] == DOCSTART:
          flush()
          if sentences and sentences[-1].document == document:
            document += 1
          continue
        if has_tags is None:
          has_tags = len(columns) > 1
        if has_tags and len(columns) < 2:
          report.skip(f"{path}:{number}", "a word without a tag")
          continue
        if not words:
          start_line = number
        words.append(columns[0])
        if has_tags:
          tags.append(columns[-1])
      flush()
  except FileNotFoundError:
    raise errors.MissingFileError(f"{path} not found") from None
  except UnicodeDecodeError as e:
    raise errors.UsageError(textfiles.not_utf8(path, e)) from None
  if own_report:
    report.log(path, sum(len(s.words) for s in sentences), "words")
  if not sentences:
    raise errors.UsageError(f"{path}: no sentences")
  return sentences


def _lines(f) -> Iterator[str | None]:
  """The lines of text file `f`, None for each over `MAX_LINE_CHARS`."""
  while line := f.readline(MAX_LINE_CHARS + 1):
    if len(line) <= MAX_LINE_CHARS or line.endswith("\n"):
      yield line
      continue
    while line and not line.endswith("\n"):
      line = f.readline(_SCAN_CHARS)
    yield None


def read_tfds(name: str, split: str, data_dir: str | None = None) -> list[Sentence]:
  """The sentences of a TFDS split with CoNLL-2003's features (`conll2003`:
  `tokens` and `ner` tags). TFDS keeps no document boundaries, so each
  sentence is its own document (no context from its neighbours)."""
  source = tfds_io.open_source(name, split, data_dir)
  names = source.dataset_info.features["ner"].feature.names
  decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
  sentences = []
  for position in range(len(source)):
    record = source[position]
    words = [decode(w) for w in record["tokens"]]
    if words:
      sentences.append(Sentence(words, [names[int(t)] for t in record["ner"]], position, 0))
  if not sentences:
    raise errors.UsageError(f"TFDS {name}:{split} has no sentences")
  logger.warning("TFDS %s has no document boundaries: its sentences get no document "
                  "context (the paper's NER figures used it; the CoNLL files have it)", name)
  return sentences


def label_list(sentences: Sequence[Sentence]) -> list[str]:
  """The tags of a (training) file: "O" first, then entity tags sorted."""
  tags = {tag for s in sentences for tag in (s.tags or [])}
  return ["O"] * ("O" in tags) + sorted(tags - {"O"})


def check_tags(sentences: Sequence[Sentence], labels: Sequence[str], path: str) -> None:
  """A clear error for a tag outside the model's label set."""
  known = set(labels)
  for sentence in sentences:
    for offset, tag in enumerate(sentence.tags or []):
      if tag not in known:
        raise errors.UsageError(f"{path}:{sentence.line + offset}: tag {tag!r} is not one of the "
                                f"model's labels {list(labels)}")


@dataclasses.dataclass
class Features:
  """Model inputs and, per feature, which (sentence, word) each scored piece is."""

  arrays: dict[str, np.ndarray]
  # For each feature row: [(sentence index, word index, position in the row)].
  scored: list[list[tuple[int, int, int]]]


def featurize(sentences: Sequence[Sentence], tokenizer, labels: Sequence[str],
              max_seq_length: int, document_context: bool = True) -> Features:
  """BERT's NER features (see the module docstring)."""
  if max_seq_length < 3:
    raise errors.UsageError(f"max_seq_length={max_seq_length} leaves no room for a word")
  label_ids = {label: i for i, label in enumerate(labels)}
  # The words as running text: of the document with context (a sentence's first
  # word follows the last one's), else of the sentence alone.
  starts = [not document_context or i == 0 or sentences[i - 1].document != s.document
            for i, s in enumerate(sentences)]
  word_pieces = [tokenizer.encode_words(s.words, text_start=start) if s.words else []
                 for s, start in zip(sentences, starts)]
  # A word that becomes no piece (a lone control character) still gets a
  # position: [UNK], so that every word is scored.
  word_pieces = [[pieces or [tokenizer.unk_id] for pieces in sentence]
                 for sentence in word_pieces]
  budget = max_seq_length - 2
  # Each document's pieces as one stream, with where every sentence starts in
  # it: the context of a row is the stream around the row's own words (the
  # rest of a long sentence, then the neighbouring sentences).
  stream_of: dict[int, list[int]] = {}
  sentence_start: list[int] = []
  for index, sentence in enumerate(sentences):
    key = sentence.document if document_context else -1 - index
    stream = stream_of.setdefault(key, [])
    sentence_start.append(len(stream))
    stream += [p for pieces in word_pieces[index] for p in pieces]
  rows: list[tuple[list[int], list[int], list[int], list[tuple[int, int, int]]]] = []
  for index, sentence in enumerate(sentences):
    pieces_of = word_pieces[index]
    stream = stream_of[sentence.document if document_context else -1 - index]
    word, position = 0, sentence_start[index]  # position: in the stream
    while word < len(pieces_of):
      # The sentence's own pieces: as many whole words as fit.
      ids, piece_labels, weights, scored = [], [], [], []
      first = position
      while word < len(pieces_of) and (not ids or len(ids) + len(pieces_of[word]) <= budget):
        pieces = pieces_of[word][:budget - len(ids)] if not ids else pieces_of[word]
        scored.append((index, word, len(ids)))
        tag = sentence.tags[word] if sentence.tags else None
        piece_labels += [label_ids.get(tag, 0)] + [0] * (len(pieces) - 1)
        weights += [1 if sentence.tags else 0] + [0] * (len(pieces) - 1)
        ids += pieces
        position += len(pieces_of[word])
        word += 1
      left, right = _context(stream, first, first + len(ids), budget - len(ids))
      offset = 1 + len(left)
      scored = [(s, w, offset + p) for s, w, p in scored]
      row_ids = [tokenizer.cls_id, *left, *ids, *right, tokenizer.sep_id]
      row_labels = [0] * offset + piece_labels + [0] * (len(right) + 1)
      row_weights = [0] * offset + weights + [0] * (len(right) + 1)
      rows.append((row_ids, row_labels, row_weights, scored))

  count = len(rows)
  arrays = {"input_ids": np.full((count, max_seq_length), tokenizer.pad_id, np.int32),
            "attention_mask": np.zeros((count, max_seq_length), np.int32),
            "token_type_ids": np.zeros((count, max_seq_length), np.int32),
            "labels": np.zeros((count, max_seq_length), np.int32),
            "label_weights": np.zeros((count, max_seq_length), np.float32),
            "weights": np.ones(count, np.float32)}
  for row, (ids, row_labels, row_weights, _) in enumerate(rows):
    arrays["input_ids"][row, :len(ids)] = ids
    arrays["attention_mask"][row, :len(ids)] = 1
    arrays["labels"][row, :len(ids)] = row_labels
    arrays["label_weights"][row, :len(ids)] = row_weights
  return Features(arrays, [r[3] for r in rows])


def _context(stream: Sequence[int], start: int, end: int, room: int
             ) -> tuple[list[int], list[int]]:
  """Up to `room` pieces of `stream` around [start, end): split evenly left
  and right, the rest to one side when the other runs out."""
  before, after = start, len(stream) - end
  left = min(before, max(room // 2, room - after))
  right = min(after, room - left)
  return list(stream[start - left:start]), list(stream[end:end + right])


def word_predictions(features: Features, logits: np.ndarray, sentences: Sequence[Sentence],
                     labels: Sequence[str]) -> list[list[str]]:
  """Each sentence's predicted tags, from the first piece of every word."""
  predicted = [[""] * len(s.words) for s in sentences]
  for row, scored in enumerate(features.scored):
    for sentence, word, position in scored:
      predicted[sentence][word] = labels[int(logits[row, position].argmax())]
  return predicted
