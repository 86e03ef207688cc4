"""Training vocabularies from a corpus: BERT's WordPiece, a SentencePiece
model, or a byte-level BPE (`tokenizer.json`, ModernBERT's kind).

The vocabulary starts with BERT's special tokens ([PAD] [UNK] [CLS] [SEP]
[MASK]); a SentencePiece model gets them as pieces, so `SentencePieceTokenizer`
accepts it, and a BPE as added tokens, as ModernBERT's has them. An existing output is replaced only when asked (`overwrite`), and
only by a vocabulary that learned more than a handful of tokens: text that
gives nothing better is an error, and nothing is written. Outputs are written
under a temporary name and renamed when complete. The command line is
`python -m bertjax.tools.train_vocab`.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from typing import Callable, Iterable, Iterator

from bertjax import errors, files
from bertjax.data import corpus, stdlib_corpus
from bertjax.data.progress import Progress

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Fewer learned tokens (characters, ## pieces, merges) than this, or than asked
# for, mean the input held next to no usable text: fewer than an alphabet.
_MIN_LEARNED_TOKENS = 20


class UnusableTextError(errors.UsageError):
  """The corpus gave no vocabulary worth writing; nothing was written."""


def sentences(spec: str, file_format: str = "sentences",
              stats: corpus.CorpusStats | None = None, tfds_data_dir: str | None = None,
              max_line_chars: int = 100_000, progress: Progress | None = None) -> Iterator[str]:
  """Every sentence of a corpus (the builder's `--input` forms), in order.

  Args:
    stats: Receives the account: files and documents read, used and skipped,
      sentences (no tokens: the text is not tokenised here).
    progress: Receives the input's size once known (bytes of files, records of
      TFDS) and the input read.
  """
  stats = stats if stats is not None else corpus.CorpusStats()
  progress = progress or Progress("", enabled=False)
  if spec == "demo:stdlib":
    progress.set_total(None, "documents")
    documents = stdlib_corpus.stdlib_documents()
  elif spec.startswith("tfds:"):
    source = corpus.tfds_source(*corpus.parse_tfds_spec(spec), tfds_data_dir)
    progress.set_total(len(source), "documents")
    documents = corpus.tfds_documents(source, 0, len(source), stats, max_line_chars,
                                      progress.advance)
  else:
    inputs = corpus.scan_files(corpus.expand_inputs(spec), stats)
    progress.set_total(sum(file.size for file in inputs))
    documents = (document for part in corpus.plan_ranges(inputs, 1) for file_range in part
                 for document in corpus.read_range(file_range, file_format, stats,
                                                   max_line_chars, progress.advance))
  for document in documents:
    if spec == "demo:stdlib":
      stats.documents_read += 1
      progress.advance(1)
    if not document:
      stats.documents_skipped["no sentences"] += 1
      continue
    stats.documents_used += 1
    stats.sentences += len(document)
    yield from document


def train(spec: str, output: str, *, model: str = "wordpiece", vocab_size: int = 30522,
          do_lower_case: bool | None = None, file_format: str = "sentences",
          max_sentences: int | None = None, tfds_data_dir: str | None = None,
          overwrite: bool = False, show_progress: bool = True,
          stats: corpus.CorpusStats | None = None) -> int:
  """Trains a vocabulary on a corpus (the builder's `--input` forms); returns its size.

  Args:
    model: "wordpiece" (a `vocab.txt`), "sentencepiece" (a `.model`) or
      "bpe" (a byte-level BPE `tokenizer.json`).
    do_lower_case: Lower-case the text (None: true for WordPiece and
      SentencePiece, BERT's uncased; false for BPE, cased as ModernBERT's).
    max_sentences: Train on at most this many sentences.
    overwrite: Replace an existing `output` (refused before reading anything).
    show_progress: A progress line per pass over the corpus, with its size.
    stats: Receives the account of the corpus (its first pass), also when
      training fails.

  Raises:
    FileExistsError: `output` exists and not `overwrite`.
    UnusableTextError: the corpus gave no vocabulary worth writing.
  """
  trainers = {"wordpiece": (train_wordpiece, 2), "sentencepiece": (train_sentencepiece, 1),
              "bpe": (train_bpe, 1)}
  if model not in trainers:
    raise errors.UsageError(f"model must be one of {sorted(trainers)}, got {model!r}")
  if do_lower_case is None:
    do_lower_case = model != "bpe"
  trainer, passes = trainers[model]  # each checks `output` before reading anything
  accounts: list[corpus.CorpusStats] = []

  def texts() -> Iterator[str]:
    account = stats if not accounts and stats is not None else corpus.CorpusStats()
    accounts.append(account)
    with Progress(f"reading ({len(accounts)}/{passes})", show_progress) as bar:
      yield from itertools.islice(sentences(spec, file_format, account, tfds_data_dir,
                                            progress=bar), max_sentences)

  return trainer(texts, output, vocab_size, do_lower_case, overwrite=overwrite, source=spec)


def _check_output(output: str, overwrite: bool) -> None:
  files.check_file(output, "--output")
  if not overwrite and files.exists(output):
    raise errors.OutputExistsError(f"{output} already exists; pass --overwrite to replace it, or "
                                   "choose another --output")


def _check_size(tokens: int, vocab_size: int, source: str, output: str) -> None:
  """Refuses a vocabulary of the special tokens and a handful more."""
  learned = tokens - len(SPECIAL_TOKENS)
  outcome = f"{output} is unchanged" if files.exists(output) else "nothing was written"
  if learned <= 0:
    raise UnusableTextError(f"{source}: no usable text (the vocabulary would hold only the "
                            f"special tokens); {outcome}")
  if learned < min(_MIN_LEARNED_TOKENS, vocab_size - len(SPECIAL_TOKENS)):
    raise UnusableTextError(
        f"{source}: too little usable text for a vocabulary ({learned} tokens learned besides "
        f"the {len(SPECIAL_TOKENS)} special ones, {vocab_size} asked); {outcome}")


def train_wordpiece(texts: Callable[[], Iterable[str]], output: str, vocab_size: int,
                    do_lower_case: bool, *, overwrite: bool = False,
                    source: str = "the corpus") -> int:
  """Trains BERT's WordPiece (BERT normaliser and pre-tokeniser) into `output`.

  `texts()` yields the corpus; it is called twice. The first pass finds the
  characters that can continue a word, whose `##` pieces are then given to the
  trainer up front, in a fixed order. Left to itself, the trainer numbers them
  in a hash map's order, which differs in every process, so ties between
  equally frequent merges fell differently and the same corpus gave a
  different vocabulary each time.

  Returns the vocabulary's size.

  Raises:
    FileExistsError: `output` exists and not `overwrite`.
    UnusableTextError: a vocabulary of the special tokens and a handful more
      (`source` names the corpus in the message); nothing is written.
  """
  import tokenizers
  from tokenizers import models, normalizers, pre_tokenizers, trainers

  _check_output(output, overwrite)
  backend = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  backend.normalizer = normalizers.BertNormalizer(lowercase=do_lower_case)
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  continuing = ["##" + c for c in _continuing_characters(texts(), backend)]
  trainer = trainers.WordPieceTrainer(vocab_size=vocab_size,
                                      special_tokens=SPECIAL_TOKENS + continuing,
                                      continuing_subword_prefix="##", show_progress=False)
  backend.train_from_iterator(texts(), trainer)
  vocab = sorted(backend.get_vocab().items(), key=lambda item: item[1])
  _check_size(len(vocab), vocab_size, source, output)
  _write_atomically(output, "".join(token + "\n" for token, _ in vocab).encode("utf-8"))
  return len(vocab)


def _continuing_characters(texts: Iterable[str], backend) -> list[str]:
  """The characters of the normalised corpus that can follow another in a word
  (not whitespace, punctuation or CJK, which the pre-tokeniser splits off),
  sorted. Text is normalised in chunks of about a megabyte."""
  seen: set[str] = set()
  chunk: list[str] = []
  size = 0
  for text in texts:
    chunk.append(text)
    size += len(text)
    if size > 1 << 20:
      seen.update(backend.normalizer.normalize_str("\n".join(chunk)))
      chunk, size = [], 0
  seen.update(backend.normalizer.normalize_str("\n".join(chunk)))
  def continues(c: str) -> bool:  # "a" + c stays one word (CJK is spaced by the normaliser)
    word = backend.normalizer.normalize_str("a" + c)
    return [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(word)] == ["a" + c]

  return sorted(c for c in seen if continues(c))


def train_sentencepiece(texts: Callable[[], Iterable[str]], output: str, vocab_size: int,
                        do_lower_case: bool, *, overwrite: bool = False,
                        source: str = "the corpus") -> int:
  """Trains a unigram SentencePiece model with BERT's special tokens as pieces.

  `texts()` yields the corpus (called once). `vocab_size` is an upper bound (as
  for WordPiece). Returns the number of pieces; raises as `train_wordpiece`.
  """
  import sentencepiece

  if not output.endswith(".model"):
    raise errors.UsageError(f"--output={output}: a SentencePiece model file must end in .model")
  _check_output(output, overwrite)
  texts = (t.lower() for t in texts()) if do_lower_case else iter(texts())
  first = next(texts, None)
  if first is None:
    _check_size(0, vocab_size, source, output)
  with tempfile.TemporaryDirectory() as scratch:
    prefix = os.path.join(scratch, "spm")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=itertools.chain([first], texts), model_prefix=prefix,
        vocab_size=vocab_size, user_defined_symbols=SPECIAL_TOKENS[2:], pad_id=0, unk_id=1,
        bos_id=-1, eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]", minloglevel=2,
        # vocab_size is an upper bound, as for WordPiece: a small corpus may
        # not support that many pieces.
        hard_vocab_limit=False)
    size = sentencepiece.SentencePieceProcessor(model_file=prefix + ".model").get_piece_size()
    _check_size(size, vocab_size, source, output)
    with open(prefix + ".model", "rb") as f:
      _write_atomically(output, f.read())
  return size


def train_bpe(texts: Callable[[], Iterable[str]], output: str, vocab_size: int,
              do_lower_case: bool, *, overwrite: bool = False,
              source: str = "the corpus") -> int:
  """Trains a byte-level BPE into the `tokenizer.json` `output`, laid out as
  ModernBERT's: no normaliser (cased; `do_lower_case` adds one that
  lower-cases), GPT-2's byte-level pre-tokeniser and decoder (a word after a
  space is one piece with it, "Ġword"; every byte has a piece, so no text is
  unknown), BERT's special tokens as added tokens, and `[CLS] A [SEP] B [SEP]`
  as its post-processor.

  `texts()` yields the corpus (called once). `vocab_size` is an upper bound
  (as for WordPiece) and holds the 256 byte pieces. Returns the vocabulary's
  size; raises as `train_wordpiece`.
  """
  import tokenizers
  from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

  if not output.endswith(".json"):
    raise errors.UsageError(f"--output={output}: a BPE tokenizer file must end in .json "
                            "(tokenizer.json)")
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size <= len(alphabet) + len(SPECIAL_TOKENS):
    raise errors.UsageError(f"--vocab_size={vocab_size}: a byte-level BPE holds the "
                            f"{len(alphabet)} byte pieces and {len(SPECIAL_TOKENS)} special "
                            "tokens before it learns any; ask for more")
  _check_output(output, overwrite)
  backend = tokenizers.Tokenizer(models.BPE())
  if do_lower_case:
    backend.normalizer = normalizers.Lowercase()
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                initial_alphabet=alphabet, show_progress=False)
  backend.train_from_iterator(texts(), trainer)
  merges = backend.get_vocab_size() - len(alphabet) - len(SPECIAL_TOKENS)
  _check_size(len(SPECIAL_TOKENS) + merges, vocab_size, source, output)
  backend.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[(t, backend.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
  _write_atomically(output, backend.to_str(pretty=True).encode("utf-8"))
  return backend.get_vocab_size()


def _write_atomically(path: str, data: bytes) -> None:
  with errors.writing(path, f"{path} is as it was"):
    if not files.is_remote(path):
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    files.write_bytes(path, data)
