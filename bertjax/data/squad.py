"""SQuAD v1.1 and v2.0: examples from the official JSON, and the original
`run_squad.py`'s features (question as segment A, passage windows as B).

Passages are split on whitespace into words, each word into the pieces it has
in the passage read as running text (`Tokenizer.encode_words`: a byte-level
BPE marks the words after a space, as it does in pre-training). A passage
longer than fits beside the question is cut into windows of at most
`max_seq_length - len(question) - 3` pieces, each starting `doc_stride` pieces
after the last; a piece is scored in the window where it has the most context
on both sides. Training answers are mapped from characters to words to pieces
and tightened to the pieces of the answer text; a window that does not hold the
whole answer, and an unanswerable question, point at [CLS] (position 0).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any, Iterator, Sequence

import numpy as np

from bertjax import errors
from bertjax.data import tfds_io
from bertjax.data.skips import SkipReport
from bertjax.data.tokenizers import Tokenizer
from bertjax.files import read_json



@dataclasses.dataclass
class Example:
  """One question on one passage.

  Attributes:
    qas_id: The question's id.
    question_text: The question.
    doc_tokens: The passage split on whitespace.
    answers: Every gold answer text (for evaluation).
    orig_answer_text: The first answer (for training); "" if none.
    start_position: Index in `doc_tokens` of its first word (-1 if none).
    end_position: Index of its last word (-1 if none).
    is_impossible: SQuAD v2.0's unanswerable question.
    answer_in_word: Whether the answer starts inside its first word (after
      other characters of it, not after a space).
  """

  qas_id: str
  question_text: str
  doc_tokens: list[str]
  answers: list[str]
  orig_answer_text: str = ""
  start_position: int = -1
  end_position: int = -1
  is_impossible: bool = False
  answer_in_word: bool = False


@dataclasses.dataclass
class Feature:
  """One window of one example, as the model sees it.

  Attributes:
    example_index: Index of its example in the list features were built from.
    tokens: The pieces ([CLS] question [SEP] window [SEP]).
    token_to_orig_map: Position in `tokens` -> index in the example's doc_tokens.
    token_is_max_context: Position -> whether this window is the piece's best.
    input_ids, segment_ids: int lists of length `len(tokens)`.
    start_position, end_position: Training targets (0 for no answer here).
  """

  example_index: int
  tokens: list[str]
  token_to_orig_map: dict[int, int]
  token_is_max_context: dict[int, bool]
  input_ids: list[int]
  segment_ids: list[int]
  start_position: int = 0
  end_position: int = 0


def _is_whitespace(c: str) -> bool:
  return c in " \t\r\n" or ord(c) == 0x202F


def split_passage(text: str) -> tuple[list[str], list[int]]:
  """(words, the word index of every character), splitting on whitespace."""
  words: list[str] = []
  char_to_word: list[int] = []
  previous_is_space = True
  for c in text:
    if _is_whitespace(c):
      previous_is_space = True
    else:
      if previous_is_space:
        words.append(c)
      else:
        words[-1] += c
      previous_is_space = False
    char_to_word.append(len(words) - 1)
  return words, char_to_word


def read_examples(source: str | dict[str, Any], is_training: bool,
                  report: SkipReport | None = None, name: str | None = None) -> list[Example]:
  """The examples of SQuAD data: a JSON file (v1.1 or v2.0) or its parsed dict.

  Training needs one answer per answerable question whose offsets point at its
  text; questions whose answer cannot be found there, or is blank, are skipped
  and counted, as the original did. Evaluation keeps every question with all
  its answers.

  Args:
    source: A path, or the data as a dict (`{"data": [...]}`).
    is_training: Whether to locate the training answers.
    report: Collects skipped questions (a fresh one is logged otherwise).
    name: What to call a dict source in messages.

  Raises:
    ValueError: naming the file, the article, paragraph and question (with the
      article's title and the question's id) of a record without the fields
      SQuAD has or with a field of the wrong type (a null context, a question
      that is not text, an `answer_start` that is not an integer).
  """
  if isinstance(source, dict):
    data, path = source, name or "<SQuAD data>"
  else:
    data, path = read_json(source), source
  own_report = report is None
  report = report or SkipReport()
  examples = []
  for context, questions in iter_paragraphs(data, path):
    words, char_to_word = split_passage(context)
    for question in questions:
      example = Example(question.qas_id, question.text, words,
                        [answer["text"] for answer in question.answers],
                        is_impossible=question.is_impossible)
      if is_training and not question.is_impossible:
        located = _locate_answer(question, context, words, char_to_word, path)
        if isinstance(located, str):
          report.skip(_place(path, question.where, question.note), located)
          continue
        (example.orig_answer_text, example.start_position, example.end_position,
         example.answer_in_word) = located
      examples.append(example)
  if own_report:
    report.log(path, len(examples), "questions")
  return examples


@dataclasses.dataclass
class Question:
  """One record of a paragraph's "qas", its fields checked.

  Attributes:
    where: Its place in the file (`data[a].paragraphs[p].qas[q]`).
    note: Its article's title and its id, to show before `where`.
    qas_id: The question's id.
    text: The question.
    answers: The answer records, each with a string "text".
    is_impossible: SQuAD v2.0's unanswerable question.
  """

  where: str
  note: str
  qas_id: str
  text: str
  answers: list[dict[str, Any]]
  is_impossible: bool


def iter_paragraphs(data: Any, path: str) -> Iterator[tuple[str, list[Question]]]:
  """(context, questions) of each paragraph of SQuAD data, every field
  the readers use checked for presence and type.

  Args:
    data: The parsed JSON (`{"data": [...]}`).
    path: The file, for messages.

  Raises:
    ValueError: naming the file and the place of the first malformed record.
  """
  articles = data.get("data") if isinstance(data, dict) else None
  if not isinstance(articles, list):
    raise errors.UsageError(f'{path}: no top-level "data" list of articles; give a SQuAD v1.1 or '
                            "v2.0 JSON file")
  for a, article in enumerate(articles):
    title = article.get("title") if isinstance(article, dict) else None
    article_note = f"article {title!r}" if isinstance(title, str) else ""
    for p, paragraph in enumerate(
        _field(article, "paragraphs", list, path, f"data[{a}]", article_note)):
      where = f"data[{a}].paragraphs[{p}]"
      context = _field(paragraph, "context", str, path, where, article_note)
      questions = []
      for q, qa in enumerate(_field(paragraph, "qas", list, path, where, article_note)):
        qwhere = f"{where}.qas[{q}]"
        qas_id = _field(qa, "id", (str, int), path, qwhere, article_note)
        note = ", ".join(filter(None, (article_note, f"question {str(qas_id)!r}")))
        text = _field(qa, "question", str, path, qwhere, note)
        answers = _field(qa, "answers", list, path, qwhere, note)
        for i, answer in enumerate(answers):
          _field(answer, "text", str, path, f"{qwhere}.answers[{i}]", note)
        is_impossible = qa.get("is_impossible", False)
        if not isinstance(is_impossible, bool):
          raise errors.UsageError(f"{_place(path, qwhere, note)}: 'is_impossible' is "
                                  f"{_shown(is_impossible)}, not true or false; write it as a JSON "
                                  "boolean")
        questions.append(Question(qwhere, note, str(qas_id), text, answers, is_impossible))
      yield context, questions


def _locate_answer(question: Question, context: str, words: Sequence[str],
                   char_to_word: Sequence[int], path: str) -> tuple[str, int, int, bool] | str:
  """(answer text, first word, last word, whether it starts inside its first
  word) of a question's first answer, or why it cannot be trained on."""
  if not question.answers:
    return "no answer to train on (and not marked is_impossible)"
  answer = question.answers[0]
  text = answer["text"]
  start = _field(answer, "answer_start", int, path, f"{question.where}.answers[0]",
                 question.note)
  if not text.strip():
    return "blank answer text"
  if not 0 <= start < len(context):
    return "answer_start outside the context"
  end_char = start + len(text) - 1
  if end_char >= len(char_to_word):
    return "answer runs past the context"
  first, last = char_to_word[start], char_to_word[end_char]
  actual = " ".join(words[first:last + 1])
  if actual.find(" ".join(text.split())) == -1:
    return "answer text not found at its answer_start"
  # Where its first non-space character follows another character of its word.
  start += len(text) - len(text.lstrip())
  return text, first, last, start > 0 and not _is_whitespace(context[start - 1])


def _place(path: str, where: str, note: str) -> str:
  """`path: note at where` (`train.json: article 'Normans', question '56dd' at
  data[0].paragraphs[0].qas[1]`), without the parts that are empty."""
  place = f"{note} at {where}" if note else where
  return f"{path}: {place}" if path else place


def _shown(value: Any) -> str:
  """A value as the JSON file writes it, cut to 40 characters."""
  shown = json.dumps(value, ensure_ascii=False, default=repr)
  return shown if len(shown) <= 40 else shown[:37] + "..."


_JSON_TYPES = {str: "a string", int: "an integer", list: "a list", dict: "an object"}


def _field(record: Any, key: str, kind: type | tuple[type, ...], path: str, where: str,
           note: str = "") -> Any:
  """`record[key]`, which must be of type `kind`."""
  place = _place(path, where, note)
  if not isinstance(record, dict):
    raise errors.UsageError(f"{place}: expected an object with {key!r}, got {_shown(record)}; "
                            "fix or remove the record")
  if key not in record:
    raise errors.UsageError(f"{place}: missing {key!r}")
  value = record[key]
  kinds = kind if isinstance(kind, tuple) else (kind,)
  if isinstance(value, bool) or not isinstance(value, kinds):
    raise errors.UsageError(
        f"{place}: {key!r} is {_shown(value)}, not "
        f"{' or '.join(_JSON_TYPES[k] for k in kinds)}; fix or remove the record")
  return value


def _improve_answer_span(doc_pieces: Sequence[int], start: int, end: int,
                         answer_pieces: Sequence[int]) -> tuple[int, int]:
  """The tightest span within [start, end] whose pieces are the answer's own
  ("(1895-1943)." holds "1895" as pieces of a longer word)."""
  answer = list(answer_pieces)
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if list(doc_pieces[new_start:new_end + 1]) == answer:
        return new_start, new_end
  return start, end


def _is_max_context(windows: Sequence[tuple[int, int]], window_index: int,
                    position: int) -> bool:
  """Whether `position` has the most context (min of left and right, plus a
  small bonus for longer windows) in window `window_index`."""
  best_score, best_index = None, None
  for index, (start, length) in enumerate(windows):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_index = score, index
  return best_index == window_index


def convert_examples_to_features(examples: Sequence[Example], tokenizer: Tokenizer,
                                 max_seq_length: int, doc_stride: int, max_query_length: int,
                                 is_training: bool) -> list[Feature]:
  """Every window of every example (see the module docstring)."""
  if max_seq_length - max_query_length - 3 < 1:
    raise errors.UsageError(f"max_seq_length={max_seq_length} leaves no room for the passage "
                            f"after max_query_length={max_query_length}")
  if doc_stride < 1:
    raise errors.UsageError(f"doc_stride must be positive, got {doc_stride}")
  features = []
  passage_cache: dict[int, tuple[list[int], list[int], list[int]]] = {}
  for example_index, example in enumerate(examples):
    query = tokenizer.encode_pieces([example.question_text])[0][:max_query_length]
    # Examples of one paragraph share their word list: tokenise it once.
    key = id(example.doc_tokens)
    if key not in passage_cache:
      word_pieces = tokenizer.encode_words(example.doc_tokens) if example.doc_tokens else []
      piece_to_word, word_to_piece, doc_pieces = [], [], []
      for word_index, pieces in enumerate(word_pieces):
        word_to_piece.append(len(doc_pieces))
        piece_to_word += [word_index] * len(pieces)
        doc_pieces += pieces
      passage_cache = {key: (doc_pieces, piece_to_word, word_to_piece)}
    doc_pieces, piece_to_word, word_to_piece = passage_cache[key]

    piece_start = piece_end = None
    if is_training and not example.is_impossible:
      piece_start = word_to_piece[example.start_position]
      piece_end = (word_to_piece[example.end_position + 1] - 1
                   if example.end_position < len(example.doc_tokens) - 1
                   else len(doc_pieces) - 1)
      piece_start, piece_end = _improve_answer_span(
          doc_pieces, piece_start, piece_end,
          # As the passage's words are: whitespace made single spaces.
          tokenizer.encode_words([" ".join(example.orig_answer_text.split())], text_start=(
              example.start_position == 0 or example.answer_in_word))[0])

    max_window = max_seq_length - len(query) - 3
    windows: list[tuple[int, int]] = []
    start = 0
    while start < len(doc_pieces) or not windows:
      length = min(len(doc_pieces) - start, max_window)
      windows.append((start, length))
      if start + length >= len(doc_pieces):
        break
      start += min(length, doc_stride)

    cls_tokens = [tokenizer.special_tokens["cls"]]
    sep = tokenizer.special_tokens["sep"]
    query_tokens = tokenizer.convert_ids_to_tokens(query)
    for window_index, (start, length) in enumerate(windows):
      tokens = cls_tokens + query_tokens + [sep]
      ids = [tokenizer.cls_id, *query, tokenizer.sep_id]
      segments = [0] * len(ids)
      to_orig, max_context = {}, {}
      for offset in range(length):
        piece = start + offset
        to_orig[len(tokens)] = piece_to_word[piece]
        max_context[len(tokens)] = _is_max_context(windows, window_index, piece)
        tokens.append(tokenizer.id_to_token(doc_pieces[piece]))
        ids.append(doc_pieces[piece])
      tokens.append(sep)
      ids.append(tokenizer.sep_id)
      segments += [1] * (length + 1)
      feature = Feature(example_index, tokens, to_orig, max_context, ids, segments)
      if is_training and not example.is_impossible:
        if start <= piece_start and piece_end <= start + length - 1:
          offset = len(query) + 2 - start
          feature.start_position, feature.end_position = piece_start + offset, piece_end + offset
      features.append(feature)
  return features


def feature_arrays(features: Sequence[Feature], max_seq_length: int,
                   pad_id: int) -> dict[str, np.ndarray]:
  """Model inputs [features, max_seq_length], span targets and weights."""
  count = len(features)
  input_ids = np.full((count, max_seq_length), pad_id, np.int32)
  token_type_ids = np.zeros((count, max_seq_length), np.int32)
  attention_mask = np.zeros((count, max_seq_length), np.int32)
  for row, feature in enumerate(features):
    length = len(feature.input_ids)
    input_ids[row, :length] = feature.input_ids
    token_type_ids[row, :length] = feature.segment_ids
    attention_mask[row, :length] = 1
  return {"input_ids": input_ids, "token_type_ids": token_type_ids,
          "attention_mask": attention_mask,
          "start_positions": np.array([f.start_position for f in features], np.int32),
          "end_positions": np.array([f.end_position for f in features], np.int32),
          "weights": np.ones(count, np.float32)}


def features_by_example(features: Sequence[Feature]) -> Iterator[tuple[int, list[int]]]:
  """(example index, the indices of its features), in example order."""
  grouped: dict[int, list[int]] = collections.defaultdict(list)
  for index, feature in enumerate(features):
    grouped[feature.example_index].append(index)
  yield from sorted(grouped.items())


def from_tfds(name: str, split: str, data_dir: str | None = None) -> dict[str, Any]:
  """A TFDS SQuAD split (`squad/v1.1`, `squad/v2.0`) as SQuAD JSON: questions
  grouped back into their paragraphs, in the order they first appear."""
  return squad_json_from_records(tfds_io.open_source(name, split, data_dir))


def squad_json_from_records(records) -> dict[str, Any]:
  """SQuAD JSON from TFDS-style records (one question each)."""
  decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
  paragraphs: dict[tuple[str, str], dict[str, Any]] = {}
  for position in range(len(records)):
    record = records[position]
    title, context = decode(record.get("title", "")), decode(record["context"])
    paragraph = paragraphs.setdefault((title, context), {"context": context, "qas": []})
    answers = record.get("answers") or {}
    texts, starts = answers.get("text", []), answers.get("answer_start", [])
    qa = {"id": decode(record["id"]), "question": decode(record["question"]),
          "answers": [{"text": decode(t), "answer_start": int(a)}
                      for t, a in zip(texts, starts)]}
    if "is_impossible" in record:
      qa["is_impossible"] = bool(record["is_impossible"])
    paragraph["qas"].append(qa)
  articles: dict[str, list[dict[str, Any]]] = {}
  for (title, _), paragraph in paragraphs.items():
    articles.setdefault(title, []).append(paragraph)
  return {"version": "tfds", "data": [{"title": t, "paragraphs": p}
                                      for t, p in articles.items()]}
