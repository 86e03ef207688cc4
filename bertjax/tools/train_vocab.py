r"""Train a WordPiece `vocab.txt`, a SentencePiece model or a byte-level BPE
`tokenizer.json` (ModernBERT's kind) on a corpus.

  python -m bertjax.tools.train_vocab --input='corpus/*.txt' --output=vocab.txt \
      --vocab_size=30522
  python -m bertjax.tools.train_vocab --input=demo:stdlib --output=spm.model \
      --model=sentencepiece --vocab_size=8000
  python -m bertjax.tools.train_vocab --input=demo:stdlib --output=tokenizer.json \
      --model=bpe --vocab_size=8000

Inputs are those of `bertjax.tools.prepare_pretraining_data`. The vocabulary
starts with BERT's special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]); a
SentencePiece model gets them as pieces, so `SentencePieceTokenizer` accepts it.
The summary accounts for every file and document, as the builder's. An existing
output is replaced only with `--overwrite`, and never by a vocabulary of the
special tokens and a handful more (input with next to no usable text is an
error). The output is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

from absl import flags

from bertjax import paths, usage
from bertjax.data import corpus, vocabulary

_INPUT = paths.DEFINE_path("input", None, "Files/globs, tfds:NAME[:SPLIT] or demo:stdlib.",
                           kind="inputs", required=True)
_OUTPUT = paths.DEFINE_path("output", None, "vocab.txt (WordPiece), NAME.model "
                            "(SentencePiece) or NAME.json (BPE).", required=True)
_MODEL = flags.DEFINE_enum("model", "wordpiece", ["wordpiece", "sentencepiece", "bpe"],
                           "Vocabulary type (bpe: byte-level, as ModernBERT's).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 30522, "Tokens in the vocabulary.")
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", None, "Lower-case the text (default: "
                                   "true for wordpiece and sentencepiece, false for bpe).")
_FILE_FORMAT = flags.DEFINE_enum("file_format", "sentences", list(corpus.FILE_FORMATS),
                                 "Layout of file inputs.")
_MAX_SENTENCES = flags.DEFINE_integer("max_sentences", 10_000_000,
                                      "Train on at most this many sentences.")
_TFDS_DATA_DIR = paths.DEFINE_path("tfds_data_dir", None, "data_dir for tfds: inputs.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing --output.")


def main(argv):
  del argv
  stats = corpus.CorpusStats()
  try:
    size = vocabulary.train(
        _INPUT.value, _OUTPUT.value, model=_MODEL.value, vocab_size=_VOCAB_SIZE.value,
        do_lower_case=_DO_LOWER_CASE.value, file_format=_FILE_FORMAT.value,
        max_sentences=_MAX_SENTENCES.value, tfds_data_dir=_TFDS_DATA_DIR.value,
        overwrite=_OVERWRITE.value, stats=stats)
  except vocabulary.UnusableTextError as e:
    print(stats.summary(tokens=False))
    usage.fail(str(e))
  print(stats.summary(tokens=False))
  print(f"Wrote {_OUTPUT.value} ({_MODEL.value}, {size} tokens of {_VOCAB_SIZE.value} "
        "requested)")


if __name__ == "__main__":
  usage.run_main(main, interrupted="nothing was written")
