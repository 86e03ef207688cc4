r"""Tokenise a corpus into `array_record` shards of documents for pre-training.

  python -m bertjax.tools.prepare_pretraining_data \
      --input='corpus/*.txt' --vocab=vocab.txt --output_dir=data/wiki --num_shards=256

  # The offline demo corpus (the standard library's docstrings):
  python -m bertjax.tools.prepare_pretraining_data --input=demo:stdlib \
      --vocab=vocab.txt --output_dir=data/demo --num_shards=4

Inputs: files and globs (local or gs://) in the original format (one sentence per
line, blank line between documents; `--file_format=documents` for one document
per line), `tfds:NAME[:SPLIT]`, or `demo:stdlib`. Shards are built in parallel
over `--num_workers` processes; on several hosts, give each its
`--host_index` of `--num_hosts` and it builds the shards with that index
modulo the host count. Finished shards are kept, so an interrupted run resumes.
The closing summary accounts for every file, document and line.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags

from bertjax.data import builder, corpus
from bertjax.data.tokenizers import tokenizer_from_vocab_file

_INPUT = flags.DEFINE_string("input", None, "Files/globs (comma-separated), "
                             "tfds:NAME[:SPLIT] or demo:stdlib.", required=True)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where to write the shards.",
                                  required=True)
_VOCAB = flags.DEFINE_string("vocab", None, "WordPiece vocab.txt or SentencePiece .model "
                             "(make one with bertjax.tools.train_vocab).", required=True)
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", True, "Lower-case the text.")
_FILE_FORMAT = flags.DEFINE_enum("file_format", "sentences", list(corpus.FILE_FORMATS),
                                 "sentences: one per line, blank line between documents; "
                                 "documents: one document per line.")
_NUM_SHARDS = flags.DEFINE_integer("num_shards", 16, "Output shards (>= hosts x workers "
                                   "for full parallelism).")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "Processes (default: all cores).")
_NUM_HOSTS = flags.DEFINE_integer("num_hosts", 1, "Hosts sharing the work.")
_HOST_INDEX = flags.DEFINE_integer("host_index", 0, "This host's index.")
_MIN_SENTENCES = flags.DEFINE_integer(
    "min_sentences", 2, "Documents with fewer sentences are skipped and counted (a "
    "next-sentence pair needs two); 1 keeps them for the MLM-only objectives.")
_MAX_LINE_CHARS = flags.DEFINE_integer("max_line_chars", 100_000,
                                       "Longer lines are skipped and counted.")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "data_dir for tfds: inputs.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing, different "
                               "dataset in --output_dir.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  start = time.perf_counter()
  try:
    tokenizer = tokenizer_from_vocab_file(_VOCAB.value, _DO_LOWER_CASE.value)
    stats = builder.prepare(
        _INPUT.value, _OUTPUT_DIR.value, tokenizer, file_format=_FILE_FORMAT.value,
        num_shards=_NUM_SHARDS.value, num_workers=_NUM_WORKERS.value or os.cpu_count() or 1,
        num_hosts=_NUM_HOSTS.value, host_index=_HOST_INDEX.value,
        min_sentences=_MIN_SENTENCES.value, max_line_chars=_MAX_LINE_CHARS.value,
        tfds_data_dir=_TFDS_DATA_DIR.value, overwrite=_OVERWRITE.value)
  except (ValueError, OSError) as e:
    sys.exit(f"prepare_pretraining_data: {e}")
  seconds = time.perf_counter() - start
  print(stats.summary())
  print(f"time:       {seconds:.1f} s, {stats.tokens / max(seconds, 1e-9):,.0f} tokens/s")


if __name__ == "__main__":
  app.run(main)
