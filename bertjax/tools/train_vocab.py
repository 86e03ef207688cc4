r"""Train a WordPiece `vocab.txt` or a SentencePiece model on a corpus.

  python -m bertjax.tools.train_vocab --input='corpus/*.txt' --output=vocab.txt \
      --vocab_size=30522
  python -m bertjax.tools.train_vocab --input=demo:stdlib --output=spm.model \
      --model=sentencepiece --vocab_size=8000

Inputs are those of `bertjax.tools.prepare_pretraining_data`. The vocabulary
starts with BERT's special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]); a
SentencePiece model gets them as pieces, so `SentencePieceTokenizer` accepts it.
The output is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
from typing import Iterator

from absl import app, flags

from bertjax.data import corpus

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

_INPUT = flags.DEFINE_string("input", None, "Files/globs, tfds:NAME[:SPLIT] or "
                             "demo:stdlib.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "vocab.txt (WordPiece) or NAME.model "
                              "(SentencePiece).", required=True)
_MODEL = flags.DEFINE_enum("model", "wordpiece", ["wordpiece", "sentencepiece"],
                           "Vocabulary type.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 30522, "Tokens in the vocabulary.")
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", True, "Lower-case the text.")
_FILE_FORMAT = flags.DEFINE_enum("file_format", "sentences", list(corpus.FILE_FORMATS),
                                 "Layout of file inputs.")
_MAX_SENTENCES = flags.DEFINE_integer("max_sentences", 10_000_000,
                                      "Train on at most this many sentences.")


def sentences(spec: str, file_format: str = "sentences",
              stats: corpus.CorpusStats | None = None) -> Iterator[str]:
  """Every sentence of a corpus, in order."""
  stats = stats or corpus.CorpusStats()
  if spec == "demo:stdlib":
    documents = corpus.stdlib_documents()
  elif spec.startswith("tfds:"):
    _, name, *split = spec.split(":")
    source = corpus.tfds_source(name, split[0] if split else "train")
    documents = corpus.tfds_documents(source, 0, len(source), stats)
  else:
    files = corpus.scan_files(corpus.expand_inputs(spec), stats)
    documents = (document for path, size in files
                 for document in corpus.read_range(corpus.FileRange(path, 0, size),
                                                   file_format, stats))
  for document in documents:
    yield from document


def train_wordpiece(texts: Iterator[str], output: str, vocab_size: int,
                    do_lower_case: bool) -> None:
  """Trains BERT's WordPiece (BERT normaliser and pre-tokeniser) into `output`."""
  import tokenizers
  from tokenizers import models, normalizers, pre_tokenizers, trainers

  backend = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  backend.normalizer = normalizers.BertNormalizer(lowercase=do_lower_case)
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                      continuing_subword_prefix="##", show_progress=False)
  backend.train_from_iterator(texts, trainer)
  vocab = sorted(backend.get_vocab().items(), key=lambda item: item[1])
  _write_atomically(output, "".join(token + "\n" for token, _ in vocab).encode("utf-8"))


def train_sentencepiece(texts: Iterator[str], output: str, vocab_size: int,
                        do_lower_case: bool) -> None:
  """Trains a unigram SentencePiece model with BERT's special tokens as pieces."""
  import sentencepiece

  if not output.endswith(".model"):
    raise ValueError(f"--output={output}: a SentencePiece model file must end in .model")
  texts = (t.lower() for t in texts) if do_lower_case else texts
  with tempfile.TemporaryDirectory() as scratch:
    prefix = os.path.join(scratch, "spm")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=texts, model_prefix=prefix, vocab_size=vocab_size,
        user_defined_symbols=SPECIAL_TOKENS[2:], pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
        pad_piece="[PAD]", unk_piece="[UNK]", minloglevel=2, train_extremely_large_corpus=False)
    with open(prefix + ".model", "rb") as f:
      _write_atomically(output, f.read())


def _write_atomically(path: str, data: bytes) -> None:
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=directory, delete=False) as f:
    f.write(data)
  os.chmod(f.name, 0o644)
  shutil.move(f.name, path)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  stats = corpus.CorpusStats()
  try:
    texts = itertools.islice(sentences(_INPUT.value, _FILE_FORMAT.value, stats),
                             _MAX_SENTENCES.value)
    train = train_wordpiece if _MODEL.value == "wordpiece" else train_sentencepiece
    train(texts, _OUTPUT.value, _VOCAB_SIZE.value, _DO_LOWER_CASE.value)
  except (ValueError, OSError) as e:
    sys.exit(f"train_vocab: {e}")
  print(f"Wrote {_OUTPUT.value} ({_MODEL.value}, {_VOCAB_SIZE.value} tokens requested)")


if __name__ == "__main__":
  app.run(main)
