"""Training vocabularies: BERT's WordPiece or a SentencePiece model, from a corpus.

The vocabulary starts with BERT's special tokens ([PAD] [UNK] [CLS] [SEP]
[MASK]); a SentencePiece model gets them as pieces, so `SentencePieceTokenizer`
accepts it. Outputs are written under a temporary name and renamed when
complete. The command line is `python -m bertjax.tools.train_vocab`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, Iterable, Iterator

from bertjax import files
from bertjax.data import corpus

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def sentences(spec: str, file_format: str = "sentences",
              stats: corpus.CorpusStats | None = None, tfds_data_dir: str | None = None,
              max_line_chars: int = 100_000) -> Iterator[str]:
  """Every sentence of a corpus (the builder's `--input` forms), in order."""
  stats = stats or corpus.CorpusStats()
  if spec == "demo:stdlib":
    documents = corpus.stdlib_documents()
  elif spec.startswith("tfds:"):
    source = corpus.tfds_source(*corpus.parse_tfds_spec(spec), tfds_data_dir)
    documents = corpus.tfds_documents(source, 0, len(source), stats, max_line_chars)
  else:
    files = corpus.scan_files(corpus.expand_inputs(spec), stats)
    documents = (document for path, size in files
                 for document in corpus.read_range(corpus.FileRange(path, 0, size, size),
                                                   file_format, stats, max_line_chars))
  for document in documents:
    yield from document


def train_wordpiece(texts: Callable[[], Iterable[str]], output: str, vocab_size: int,
                    do_lower_case: bool) -> None:
  """Trains BERT's WordPiece (BERT normaliser and pre-tokeniser) into `output`.

  `texts()` yields the corpus; it is called twice. The first pass finds the
  characters that can continue a word, whose `##` pieces are then given to the
  trainer up front, in a fixed order. Left to itself, the trainer numbers them
  in a hash map's order, which differs in every process, so ties between
  equally frequent merges fell differently and the same corpus gave a
  different vocabulary each time.
  """
  import tokenizers
  from tokenizers import models, normalizers, pre_tokenizers, trainers

  backend = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  backend.normalizer = normalizers.BertNormalizer(lowercase=do_lower_case)
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  continuing = ["##" + c for c in _continuing_characters(texts(), backend)]
  trainer = trainers.WordPieceTrainer(vocab_size=vocab_size,
                                      special_tokens=SPECIAL_TOKENS + continuing,
                                      continuing_subword_prefix="##", show_progress=False)
  backend.train_from_iterator(texts(), trainer)
  vocab = sorted(backend.get_vocab().items(), key=lambda item: item[1])
  _write_atomically(output, "".join(token + "\n" for token, _ in vocab).encode("utf-8"))


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
                        do_lower_case: bool) -> None:
  """Trains a unigram SentencePiece model with BERT's special tokens as pieces.

  `texts()` yields the corpus (called once). `vocab_size` is an upper bound (as
  for WordPiece).
  """
  import sentencepiece

  if not output.endswith(".model"):
    raise ValueError(f"--output={output}: a SentencePiece model file must end in .model")
  texts = (t.lower() for t in texts()) if do_lower_case else iter(texts())
  with tempfile.TemporaryDirectory() as scratch:
    prefix = os.path.join(scratch, "spm")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=texts, model_prefix=prefix, vocab_size=vocab_size,
        user_defined_symbols=SPECIAL_TOKENS[2:], pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
        pad_piece="[PAD]", unk_piece="[UNK]", minloglevel=2,
        # vocab_size is an upper bound, as for WordPiece: a small corpus may
        # not support that many pieces.
        hard_vocab_limit=False)
    with open(prefix + ".model", "rb") as f:
      _write_atomically(output, f.read())


def _write_atomically(path: str, data: bytes) -> None:
  if files.is_remote(path):
    files.write_bytes(path, data)
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=directory, delete=False) as f:
    f.write(data)
  os.chmod(f.name, 0o644)
  shutil.move(f.name, path)
