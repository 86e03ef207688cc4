"""WordPiece, SentencePiece and `tokenizer.json` tokenizers behind one interface.

`WordPieceTokenizer` reads BERT's `vocab.txt` and runs the `tokenizers` library
configured like the reference BERT tokenizer: text cleaning (control characters
dropped, whitespace unified), CJK characters split, optional lower-casing and
accent stripping, punctuation split, greedy longest-match WordPiece with `[UNK]`
for words over 200 characters (the original `FullTokenizer`'s limit; Hugging
Face's is 100). `SentencePieceTokenizer` wraps a `sentencepiece` model.
`JsonTokenizer` runs a `tokenizers` library file as it stands (ModernBERT's
byte-level BPE). All read a special token written in the text ("a [MASK] b")
as that token, as transformers does (the original read `[`, `mask`, `]`), and
produce `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` with token types 0 for A and
1 for B, batch-encoded to padded numpy arrays.
"""

from __future__ import annotations

import abc
import os
import re
import shutil
from typing import Any, Sequence

import numpy as np

from bertjax import errors, files
from bertjax.data import textfiles

SPECIAL_TOKEN_ROLES = ("unk", "cls", "sep", "pad", "mask")


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
  """Lengths to keep of a pair so that together they fit `budget` tokens.

  The original BERT rule: remove one token at a time from the longer sequence
  (from B when they are equal), so the shorter one is kept whole when it can be.
  """
  if len_a + len_b <= budget:
    return len_a, len_b
  if min(len_a, len_b) <= budget // 2:
    return (len_a, budget - len_a) if len_a < len_b else (budget - len_b, len_b)
  return budget - budget // 2, budget // 2


class Tokenizer(abc.ABC):
  """Text -> pieces -> ids, with BERT's special tokens.

  Subclasses provide `tokenize`, `_pieces_to_ids_batch` and the special tokens;
  the pair layout, truncation and padding are shared.
  """

  def __init__(self, special_tokens: dict[str, str], vocab_size: int):
    self.special_tokens = dict(special_tokens)  # role ("cls", ...) -> token
    self.vocab_size = vocab_size
    self.special_ids = {role: self.token_to_id(token) for role, token in special_tokens.items()}

  @property
  def cls_id(self) -> int:
    return self.special_ids["cls"]

  @property
  def sep_id(self) -> int:
    return self.special_ids["sep"]

  @property
  def pad_id(self) -> int:
    return self.special_ids["pad"]

  @property
  def mask_id(self) -> int:
    return self.special_ids["mask"]

  @property
  def unk_id(self) -> int:
    return self.special_ids["unk"]

  @abc.abstractmethod
  def tokenize(self, text: str) -> list[str]:
    """Splits `text` into pieces (no [CLS]/[SEP])."""

  @abc.abstractmethod
  def token_to_id(self, token: str) -> int | None:
    """The id of a piece, or None if it is not in the vocabulary."""

  @abc.abstractmethod
  def id_to_token(self, token_id: int) -> str:
    """The piece of an id."""

  @abc.abstractmethod
  def encode_pieces(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text's pieces, without special tokens (batched)."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int]) -> str:
    """Text back from ids, special tokens dropped."""

  def encode_words(self, words: Sequence[str], *, text_start: bool = True) -> list[list[int]]:
    """Ids of each word's pieces, the words read as the running text
    `" ".join(words)`: as the text's start (`text_start`) or after a space.

    A "word" may hold spaces (an answer phrase). WordPiece and SentencePiece
    give a word the same pieces wherever it stands, so this is
    `encode_pieces(words)`; a byte-level BPE marks a word after a space
    ("Ġword"), which `JsonTokenizer` adds.
    """
    del text_start  # the pieces do not depend on what precedes the word
    return self.encode_pieces(words)

  def encode_sentences(self, documents: Sequence[Sequence[str]]) -> list[list[int]]:
    """Ids of the pieces of every sentence of `documents` (in order, one list
    a sentence), each document read as its running text, its sentences
    joined by a space: a sentence's pieces are those it has in the document.
    As `encode_words`, this is `encode_pieces` where the pieces do not depend
    on what precedes them (batched)."""
    return self.encode_pieces([s for document in documents for s in document])

  @abc.abstractmethod
  def save(self, directory: str) -> dict[str, Any]:
    """Writes the vocabulary files to `directory`; returns the settings to restore."""

  def basic_tokenize(self, text: str) -> list[str]:
    """The words of `text` as the model sees them before splitting into pieces
    (normalised; for SQuAD's mapping of answers back onto the original text)."""
    return (text.lower() if getattr(self, "do_lower_case", False) else text).split()

  def pieces_to_text(self, pieces: Sequence[str]) -> str:
    """The text of consecutive pieces, words separated by single spaces."""
    return " ".join("".join(pieces).replace("\u2581", " ").split())

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    return [self.unk_id if (i := self.token_to_id(t)) is None else i for t in tokens]

  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    return [self.id_to_token(int(i)) for i in ids]

  def encode(self, text: str, pair: str | None = None) -> list[int]:
    """`[CLS] text [SEP]` or `[CLS] text [SEP] pair [SEP]` ids, untruncated.

    An empty `pair` counts as none, as in the original code (`if text_b:`).
    """
    texts = [text, pair] if pair else [text]
    pieces = self.encode_pieces(texts)
    ids = [self.cls_id, *pieces[0], self.sep_id]
    if pair:
      ids += [*pieces[1], self.sep_id]
    return ids

  def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                   max_length: int = 512, padding: str = "longest",
                   pad_to_multiple_of: int | None = None,
                   truncation: bool = True) -> dict[str, np.ndarray]:
    """Encodes texts (or text pairs) into padded arrays.

    Args:
      texts: First segments.
      pairs: Second segments, one per text, or None for single segments; an
        empty second segment counts as none, as in `encode`.
      max_length: Most tokens per row, special tokens included.
      padding: "longest" (pad to the longest row) or "max_length".
      pad_to_multiple_of: Round the padded length up to a multiple of this (fewer
        distinct shapes, fewer compilations), never above `max_length`.
      truncation: Cut rows longer than `max_length` (pairs with the original
        BERT rule, see `truncate_pair`); if False, such rows are an error.

    Returns:
      int32 arrays [rows, length]: `input_ids`, `token_type_ids` (0 for the first
      segment, 1 for the second) and `attention_mask` (1 for real tokens).
    """
    texts, pairs = list(texts), None if pairs is None else list(pairs)
    if pairs is not None and len(pairs) != len(texts):
      raise errors.UsageError(f"{len(texts)} texts but {len(pairs)} text pairs")
    if padding not in ("longest", "max_length"):
      raise errors.UsageError(f"padding must be 'longest' or 'max_length', got {padding!r}")
    num_special = 2 if pairs is None else 3
    if max_length < num_special:
      raise errors.UsageError(f"max_length={max_length} leaves no room for the {num_special} "
                              "special tokens")
    first = self.encode_pieces(texts)
    second = self.encode_pieces(pairs) if pairs is not None else [[]] * len(texts)

    rows = []
    for index, (a, b) in enumerate(zip(first, second)):
      is_pair = bool(pairs and pairs[index])
      budget = max_length - (3 if is_pair else 2)
      if len(a) + len(b) > budget:
        if not truncation:
          raise errors.UsageError(f"Row {index} has {len(a) + len(b) + 2 + is_pair} tokens, more "
                                  f"than max_length={max_length}; pass truncation=True")
        keep_a, keep_b = truncate_pair(len(a), len(b), budget)
        a, b = a[:keep_a], b[:keep_b]
      ids = [self.cls_id, *a, self.sep_id]
      types = [0] * len(ids)
      if is_pair:
        ids += [*b, self.sep_id]
        types += [1] * (len(b) + 1)
      rows.append((ids, types))

    length = max_length if padding == "max_length" else max((len(r[0]) for r in rows),
                                                             default=num_special)
    if pad_to_multiple_of:
      length = min(max_length, -(-length // pad_to_multiple_of) * pad_to_multiple_of)
    input_ids = np.full((len(rows), length), self.pad_id, np.int32)
    token_type_ids = np.zeros((len(rows), length), np.int32)
    attention_mask = np.zeros((len(rows), length), np.int32)
    for row, (ids, types) in enumerate(rows):
      input_ids[row, :len(ids)] = ids
      token_type_ids[row, :len(types)] = types
      attention_mask[row, :len(ids)] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": attention_mask}


def read_vocab(path: str) -> list[str]:
  """The tokens of a `vocab.txt`, one per line; the line index is the id.

  A file saved on another system reads the same: a UTF-8 byte-order mark
  (Windows editors write one) is not part of the first token, and a line
  may end in CRLF."""
  try:
    with open(path, encoding="utf-8-sig") as f:
      tokens = [line[:-1] if line.endswith("\r") else line
                for line in f.read().split("\n")]
  except FileNotFoundError:
    raise errors.MissingFileError(f"Vocabulary file not found: {path}") from None
  except UnicodeDecodeError as e:
    with open(path, "rb") as f:
      data = f.read()
    if files.marked_encoding(data):
      raise errors.UsageError(textfiles.not_utf8(path, e)) from None
    line = data[:e.start].count(b"\n") + 1
    raise errors.UsageError(f"{path}, line {line}: not valid UTF-8 ({e.reason})") from None
  if tokens and tokens[-1] == "":
    tokens.pop()  # The newline that ends the last line.
  if not tokens:
    raise errors.UsageError(f"{path}: the vocabulary is empty")
  return tokens


class WordPieceTokenizer(Tokenizer):
  """BERT's WordPiece tokenizer over a `vocab.txt`.

  Args:
    vocab: Path of a `vocab.txt`, or the list of tokens (index = id).
    do_lower_case: Lower-case the text (the "uncased" models).
    strip_accents: Remove accents; None follows `do_lower_case`, as in the
      reference.
    tokenize_chinese_chars: Put spaces around CJK ideographs.
    max_input_chars_per_word: Longer words become [UNK] (the original: 200,
      Hugging Face: 100).
    special_tokens: Role -> token; defaults to BERT's [UNK] [CLS] [SEP] [PAD] [MASK].
    special_tokens_in_text: Read a special token written in the text as that
      token (transformers), rather than as plain text (the original; a Hugging
      Face directory asks for it with `split_special_tokens`). Pre-training
      corpora are read so too, as transformers' `run_mlm` reads them: a literal
      "[MASK]" in the raw text becomes the mask token.
  """

  def __init__(self, vocab: str | Sequence[str], *, do_lower_case: bool = True,
               strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
               max_input_chars_per_word: int = 200,
               special_tokens: dict[str, str] | None = None,
               special_tokens_in_text: bool = True):
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    self.tokens = read_vocab(vocab) if isinstance(vocab, str) else list(vocab)
    special_tokens = special_tokens or {
        "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]"}
    # Later duplicates win, as when the reference reads the file into a dict.
    self._ids = {token: index for index, token in enumerate(self.tokens)}
    missing = [t for t in special_tokens.values() if t not in self._ids]
    if missing:
      prefix = f"{vocab}: " if isinstance(vocab, str) else ""
      raise errors.UsageError(f"{prefix}special tokens {missing} are not in the vocabulary")
    self.do_lower_case = do_lower_case
    self.strip_accents = strip_accents
    self.tokenize_chinese_chars = tokenize_chinese_chars
    self.max_input_chars_per_word = max_input_chars_per_word
    self.special_tokens_in_text = special_tokens_in_text

    backend = tokenizers.Tokenizer(models.WordPiece(
        self._ids, unk_token=special_tokens["unk"],
        max_input_chars_per_word=max_input_chars_per_word))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
        strip_accents=strip_accents, lowercase=do_lower_case)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    # Special (decoding skips them); `encode_special_tokens` splits typed ones.
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                for t in special_tokens.values()])
    backend.encode_special_tokens = not special_tokens_in_text
    self._backend = backend
    super().__init__(special_tokens, vocab_size=len(self.tokens))

  def tokenize(self, text: str) -> list[str]:
    return self._backend.encode(text, add_special_tokens=False).tokens

  def basic_tokenize(self, text: str) -> list[str]:
    normalized = self._backend.normalizer.normalize_str(text)
    return [word for word, _ in self._backend.pre_tokenizer.pre_tokenize_str(normalized)]

  def pieces_to_text(self, pieces: Sequence[str]) -> str:
    text = " ".join(pieces).replace(" ##", "").replace("##", "")
    return " ".join(text.split())

  def token_to_id(self, token: str) -> int | None:
    return self._ids.get(token)

  def id_to_token(self, token_id: int) -> str:
    return self.tokens[token_id]

  def encode_pieces(self, texts: Sequence[str]) -> list[list[int]]:
    encodings = self._backend.encode_batch(list(texts), add_special_tokens=False)
    return [e.ids for e in encodings]

  def decode(self, ids: Sequence[int]) -> str:
    return self._backend.decode([int(i) for i in ids], skip_special_tokens=True)

  def save_tokenizer_json(self, path: str) -> None:
    """Writes this tokenizer as a `tokenizers` library file, with BERT's
    `[CLS] A [SEP] B [SEP]` post-processing (for transformers' fast tokenizers)."""
    import tokenizers
    from tokenizers import processors

    backend = tokenizers.Tokenizer.from_str(self._backend.to_str())
    backend.post_processor = processors.BertProcessing(
        (self.special_tokens["sep"], self.sep_id), (self.special_tokens["cls"], self.cls_id))
    backend.save(path)

  def save(self, directory: str) -> dict[str, Any]:
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("".join(t + "\n" for t in self.tokens))
    return {"type": "wordpiece", "vocab_file": "vocab.txt",
            "do_lower_case": self.do_lower_case, "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "special_tokens": self.special_tokens,
            "split_special_tokens": not self.special_tokens_in_text}


class SentencePieceTokenizer(Tokenizer):
  """A `sentencepiece` model with BERT's special tokens as pieces of it.

  Args:
    model_file: Path of the `.model` file; it must contain pieces for [CLS],
      [SEP] and [MASK] (train it with them as user-defined symbols), a padding
      piece and the unknown piece.
    do_lower_case: Lower-case the text before the model sees it.
    special_tokens: Role -> piece; by default [CLS] [SEP] [MASK], the model's
      unknown piece, and its padding piece (or "[PAD]").
  """

  def __init__(self, model_file: str, *, do_lower_case: bool = False,
               special_tokens: dict[str, str] | None = None):
    import sentencepiece

    if not os.path.isfile(model_file):
      raise errors.MissingFileError(f"SentencePiece model not found: {model_file}")
    self.model_file = model_file
    self.processor = sentencepiece.SentencePieceProcessor()
    try:
      self.processor.Load(model_file)
    except (OSError, RuntimeError) as e:
      raise errors.UsageError(f"{model_file}: not a valid SentencePiece model ({e})") from None
    self.do_lower_case = do_lower_case
    sp = self.processor
    if special_tokens is None:
      pad_id = sp.pad_id()
      special_tokens = {
          "unk": sp.id_to_piece(sp.unk_id()), "cls": "[CLS]", "sep": "[SEP]",
          "mask": "[MASK]",
          "pad": sp.id_to_piece(pad_id) if pad_id >= 0 else "[PAD]"}
    missing = [t for t in special_tokens.values() if self._piece_id(t) is None]
    if missing:
      raise errors.UsageError(
          f"{model_file}: special tokens {missing} are not pieces of this model; train "
          "it with them as user_defined_symbols")
    self._special_pattern = re.compile(
        "(" + "|".join(re.escape(t) for t in special_tokens.values()) + ")")
    super().__init__(special_tokens, vocab_size=sp.get_piece_size())

  def _piece_id(self, piece: str) -> int | None:
    piece_id = self.processor.piece_to_id(piece)
    if piece_id == self.processor.unk_id() and piece != self.processor.id_to_piece(piece_id):
      return None
    return piece_id

  def _split(self, text: str) -> list[tuple[bool, str]]:
    """Splits out special tokens written in the text: [(is_special, chunk)]."""
    chunks = []
    for i, chunk in enumerate(self._special_pattern.split(text)):
      if i % 2:
        chunks.append((True, chunk))
      elif chunk.strip():
        chunks.append((False, chunk.lower() if self.do_lower_case else chunk))
    return chunks

  def tokenize(self, text: str) -> list[str]:
    pieces = []
    for special, chunk in self._split(text):
      pieces += [chunk] if special else self.processor.encode(chunk, out_type=str)
    return pieces

  def token_to_id(self, token: str) -> int | None:
    return self._piece_id(token)

  def id_to_token(self, token_id: int) -> str:
    return self.processor.id_to_piece(token_id)

  def encode_pieces(self, texts: Sequence[str]) -> list[list[int]]:
    result = []
    for text in texts:
      ids = []
      for special, chunk in self._split(text):
        ids += [self._piece_id(chunk)] if special else self.processor.encode(chunk)
      result.append(ids)
    return result

  def decode(self, ids: Sequence[int]) -> str:
    special = set(self.special_ids.values())
    return self.processor.decode([int(i) for i in ids if int(i) not in special])

  def save(self, directory: str) -> dict[str, Any]:
    shutil.copyfile(self.model_file, os.path.join(directory, "spiece.model"))
    return {"type": "sentencepiece", "model_file": "spiece.model",
            "do_lower_case": self.do_lower_case, "special_tokens": self.special_tokens}


class JsonTokenizer(Tokenizer):
  """A `tokenizer.json` of the `tokenizers` library, run as it is written: its
  normaliser, pre-tokeniser, model (BPE, Unigram, WordPiece or WordLevel) and
  decoder. ModernBERT's tokenizer is one (byte-level BPE). The special tokens
  and the `[CLS] A [SEP] B [SEP]` layout are bertjax's, as for the others: the
  file's own post-processor is not used.

  Args:
    path: The `tokenizer.json` file.
    special_tokens: Role -> token; defaults to BERT's [UNK] [CLS] [SEP] [PAD]
      [MASK] (ModernBERT's too).
    split_special_tokens: Read special tokens typed in the text as plain text.
  """

  def __init__(self, path: str, *, special_tokens: dict[str, str] | None = None,
               split_special_tokens: bool = False):
    import tokenizers

    self.path, self.split_special_tokens = path, split_special_tokens
    try:
      # Read here, not by the library: a byte-order mark (a Windows editor's
      # save) is no JSON to it.
      self._backend = tokenizers.Tokenizer.from_str(files.read_text(path))
    except Exception as e:  # the Rust library raises its own exception type
      raise errors.UsageError(f"{path}: not a tokenizer file the tokenizers library reads "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                              ) from None
    self._backend.encode_special_tokens = split_special_tokens
    self._ids = self._backend.get_vocab(with_added_tokens=True)
    special_tokens = special_tokens or {
        "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]"}
    missing = [t for t in special_tokens.values() if t not in self._ids]
    if missing:
      raise errors.UsageError(f"{path}: special tokens {missing} are not in the vocabulary")
    super().__init__(special_tokens, vocab_size=max(self._ids.values()) + 1)

  def tokenize(self, text: str) -> list[str]:
    return self._backend.encode(text, add_special_tokens=False).tokens

  def pieces_to_text(self, pieces: Sequence[str]) -> str:
    decoder = self._backend.decoder
    text = decoder.decode(list(pieces)) if decoder is not None else " ".join(pieces)
    return " ".join(text.split())

  def token_to_id(self, token: str) -> int | None:
    return self._ids.get(token)

  def id_to_token(self, token_id: int) -> str:
    token = self._backend.id_to_token(int(token_id))
    if token is None:
      raise errors.UsageError(f"{self.path}: no token has id {token_id}")
    return token

  def encode_pieces(self, texts: Sequence[str]) -> list[list[int]]:
    encodings = self._backend.encode_batch(list(texts), add_special_tokens=False)
    return [e.ids for e in encodings]

  def encode_words(self, words: Sequence[str], *, text_start: bool = True) -> list[list[int]]:
    # A word after a space is encoded with that space: a byte-level BPE's pre-
    # tokeniser splits running text at spaces, keeping each on the word after it,
    # so these pieces are those of the joined text. Tokenizers that drop or
    # add spaces themselves (WordPiece, Metaspace) give the same pieces.
    return self.encode_pieces([w if i == 0 and text_start else " " + w
                               for i, w in enumerate(words)])

  def encode_sentences(self, documents: Sequence[Sequence[str]]) -> list[list[int]]:
    return self.encode_pieces([s if i == 0 else " " + s
                               for document in documents for i, s in enumerate(document)])

  @property
  def lowercases(self) -> bool:
    """Whether the file's normaliser lower-cases the text."""
    normalizer = self._backend.normalizer
    return normalizer is not None and normalizer.normalize_str("A\u00c9") == "a\u00e9"

  def basic_tokenize(self, text: str) -> list[str]:
    normalizer = self._backend.normalizer
    text = normalizer.normalize_str(text) if normalizer is not None else text
    return text.replace("\u2581", " ").split()  # a normaliser may mark spaces "▁"

  def decode(self, ids: Sequence[int]) -> str:
    return self._backend.decode([int(i) for i in ids], skip_special_tokens=True)

  def save_tokenizer_json(self, path: str, second_type_id: int = 1) -> None:
    """Writes the file as transformers' fast tokenizer is to run it: with
    bertjax's `[CLS] A [SEP] B [SEP]` as its post-processor, whatever the file
    had, segment B's tokens of type `second_type_id` (0 for a family without
    token types: ModernBERT's own file says so)."""
    import tokenizers
    from tokenizers import processors

    backend = tokenizers.Tokenizer.from_str(self._backend.to_str())
    cls, sep = self.special_tokens["cls"], self.special_tokens["sep"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:{second_type_id} {sep}:{second_type_id}",
        special_tokens=[(cls, self.cls_id), (sep, self.sep_id)])
    backend.save(path)

  def save(self, directory: str) -> dict[str, Any]:
    self._backend.save(os.path.join(directory, "tokenizer.json"))
    return {"type": "tokenizer_json", "file": "tokenizer.json", "special_tokens":
            self.special_tokens, "split_special_tokens": self.split_special_tokens}


def tokenizer_from_vocab_file(path: str, do_lower_case: bool | None = None) -> Tokenizer:
  """The tokenizer of a vocabulary file: WordPiece for a `vocab.txt`,
  SentencePiece for a `.model`, the `tokenizers` library's own for a `.json`
  (`tokenizer.json`: a byte-level BPE as ModernBERT's, or any it reads).

  Args:
    path: The file, local or on `gs://`.
    do_lower_case: Whether to lower-case the text (None: true for WordPiece
      and SentencePiece, BERT's uncased). A `tokenizer.json` lower-cases as
      its normaliser says: a value that says otherwise is refused.
  """
  local = files.local_file(path)  # the tokenizer libraries read local files
  if local.endswith(".json"):
    tokenizer = JsonTokenizer(local)
    if do_lower_case is not None and do_lower_case != tokenizer.lowercases:
      raise errors.UsageError(
          f"--do_lower_case={str(do_lower_case).lower()}, but {path} "
          f"{'lower-cases' if tokenizer.lowercases else 'keeps the case of'} the text (its "
          "normaliser decides): leave --do_lower_case unset")
    return tokenizer
  do_lower_case = True if do_lower_case is None else do_lower_case
  if local.endswith(".model"):
    return SentencePieceTokenizer(local, do_lower_case=do_lower_case)
  return WordPieceTokenizer(local, do_lower_case=do_lower_case)


def current_settings(settings: dict[str, Any]) -> dict[str, Any]:
  """Tokenizer settings saved by an earlier bertjax, as this one saves them: a
  WordPiece `special_tokens_in_text` (`false` while plain text was the default,
  no one's choice; missing before then) becomes `split_special_tokens: false`."""
  if settings.get("type") != "wordpiece" or "split_special_tokens" in settings:
    return settings
  kept = {k: v for k, v in settings.items() if k != "special_tokens_in_text"}
  return {**kept, "split_special_tokens": False}


def tokenizer_from_settings(directory: str, settings: dict[str, Any],
                            source: str | None = None) -> Tokenizer:
  """Rebuilds a tokenizer saved by `Tokenizer.save` into `directory`.

  Args:
    directory: Where the vocabulary files are.
    settings: What `save` returned.
    source: The file the settings came from, named in errors.
  """
  source = source or directory
  settings = dict(current_settings(settings))
  kind = settings.pop("type", None)
  builders = {"wordpiece": (WordPieceTokenizer, "vocab_file"),
              "sentencepiece": (SentencePieceTokenizer, "model_file"),
              "tokenizer_json": (JsonTokenizer, "file")}
  if kind not in builders:
    raise errors.UsageError(f"{source}: unknown tokenizer type {kind!r}; known: "
                            f"{', '.join(builders)}")
  builder, file_key = builders[kind]
  if kind == "wordpiece":
    settings["special_tokens_in_text"] = not settings.pop("split_special_tokens")
  if file_key not in settings:
    raise errors.UsageError(f"{source}: tokenizer setting {file_key!r} is missing")
  if files.is_remote(directory):  # the tokenizer libraries read local files
    directory = files.local_copy(directory, [settings[file_key]])
  try:
    return builder(os.path.join(directory, settings.pop(file_key)), **settings)
  except TypeError as e:
    raise errors.UsageError(f"{source}: bad tokenizer settings ({e})") from None
