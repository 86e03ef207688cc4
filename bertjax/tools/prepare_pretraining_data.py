r"""Tokenise a corpus into `array_record` shards of documents for pre-training.

  python -m bertjax.tools.prepare_pretraining_data \
      --input='corpus/*.txt' --vocab=vocab.txt --output_dir=data/wiki --num_shards=256

  # The offline demo corpus (the standard library's docstrings):
  python -m bertjax.tools.prepare_pretraining_data --input=demo:stdlib \
      --vocab=vocab.txt --output_dir=data/demo --num_shards=4

Inputs: files and globs (local or gs://) in the original format (one sentence per
line, blank line between documents; `--file_format=documents` for one document
per line: a file whose first 1,000 lines hold no blank line is refused unless
`--file_format` says how to read it), `tfds:NAME[:SPLIT]`, or `demo:stdlib`.
Shards are built in parallel over `--num_workers` processes; on several hosts,
give each its `--host_index` of `--num_hosts` and it builds the shards with
that index modulo the host count. Finished shards are kept, so an interrupted run resumes.
The closing summary accounts for every file, document and line. Input with no
usable document is an error after the summary, and marks nothing finished;
with `--overwrite`, the new dataset is built beside the old one and replaces it
only then, so the old one survives unusable input.

The loader masks anew every epoch. `--static_dupe_factor=N` also writes N
differently masked copies of the instances for one objective and length, as the
original `create_pretraining_data.py` did, from the training documents (those
not held out by `--eval_percent`); run it once per length (128, then 512: each
length has its own files). A run with `data.static` reads them, or builds them
itself. With several hosts, run it after every host has finished its document
shards.
"""

from __future__ import annotations

import os
import time

from absl import flags, logging

from bertjax import files, paths, usage
from bertjax.data import builder, corpus, static_instances
from bertjax.data.masking import MaskingConfig
from bertjax.data.tokenizers import tokenizer_from_vocab_file

_INPUT = paths.DEFINE_path("input", None, "Files/globs (comma-separated), "
                           "tfds:NAME[:SPLIT] or demo:stdlib.", kind="inputs", required=True)
_OUTPUT_DIR = paths.DEFINE_path("output_dir", None, "Where to write the shards (local or "
                                "gs://).", required=True)
_VOCAB = paths.DEFINE_path("vocab", None, "WordPiece vocab.txt, SentencePiece .model or a "
                           "tokenizer.json (a byte-level BPE as ModernBERT's; make one with "
                           "bertjax.tools.train_vocab).", required=True)
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", None, "Lower-case the text (default: true "
                                   "for vocab.txt and .model; a tokenizer.json as its "
                                   "normaliser says).")
_FILE_FORMAT = flags.DEFINE_enum(
    "file_format", None, list(corpus.FILE_FORMATS), "sentences: one a line, a blank line "
    "between documents; documents: one document a line, split into sentences. Unset: "
    f"sentences, refusing a file whose first {builder.ONE_DOCUMENT_LINES:,} lines hold no blank "
    "line and a median line of several sentences (one document a line, most likely).")
_NUM_SHARDS = flags.DEFINE_integer("num_shards", 16, "Output shards (>= hosts x workers "
                                   "for full parallelism).")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "Processes (default: all cores).")
_NUM_HOSTS = flags.DEFINE_integer("num_hosts", 1, "Hosts sharing the work.")
_HOST_INDEX = flags.DEFINE_integer("host_index", 0, "This host's index.")
_MIN_SENTENCES = flags.DEFINE_integer(
    "min_sentences", 1, "Documents with fewer sentences are skipped and counted. 1 "
    "keeps every document, as the original code (a one-sentence document gives "
    "random-next pairs only); 2 leaves those out.")
_MAX_LINE_CHARS = flags.DEFINE_integer("max_line_chars", 100_000,
                                       "Longer lines are skipped and counted.")
_TFDS_DATA_DIR = paths.DEFINE_path("tfds_data_dir", None, "data_dir for tfds: inputs.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing, different "
                               "dataset in --output_dir.")
# Static masking, as the original code did (the loader masks anew each epoch
# without it).
_STATIC_DUPE_FACTOR = flags.DEFINE_integer(
    "static_dupe_factor", 0, "If > 0, also write this many differently masked copies of "
    "the instances (read with the loader's static=True).")
_OBJECTIVE = flags.DEFINE_enum("objective", "mlm_nsp", ["mlm_nsp", "mlm_pairs", "mlm"],
                               "Static instances: the objective.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "Static instances: length.")
_MAX_PREDICTIONS = flags.DEFINE_integer("max_predictions", 20,
                                        "Static instances: masked positions per sequence.")
_MASKED_LM_PROB = flags.DEFINE_float("masked_lm_prob", 0.15, "Static instances: mask rate.")
_WHOLE_WORD_MASKING = flags.DEFINE_bool("whole_word_masking", False,
                                        "Static instances: mask whole words.")
_MASKING_SPECIALS = flags.DEFINE_enum(
    "masking_specials", "original", ["original", "excluded"], "Static instances: 'original' "
    "masks any token but [CLS] and [SEP] and draws random tokens from the whole vocabulary, "
    "as create_pretraining_data.py; 'excluded' masks and draws no special token.")
_SHORT_SEQ_PROB = flags.DEFINE_float("short_seq_prob", 0.1,
                                     "Static instances: probability of a shorter length.")
_SEED = flags.DEFINE_integer("seed", 12345, "Static instances: random seed.")
_EVAL_PERCENT = flags.DEFINE_float(
    "eval_percent", 1.0, "Static instances: documents held out for evaluation, in percent "
    "(the run's data.eval_percent; they get no static instances).")


def main(argv):
  del argv
  start = time.perf_counter()
  files.check_directory(_OUTPUT_DIR.value, "--output_dir")
  tokenizer = tokenizer_from_vocab_file(_VOCAB.value, _DO_LOWER_CASE.value)
  try:
    stats = builder.prepare(
        _INPUT.value, _OUTPUT_DIR.value, tokenizer, file_format=_FILE_FORMAT.value,
        num_shards=_NUM_SHARDS.value, num_workers=_NUM_WORKERS.value or os.cpu_count() or 1,
        num_hosts=_NUM_HOSTS.value, host_index=_HOST_INDEX.value,
        min_sentences=_MIN_SENTENCES.value, max_line_chars=_MAX_LINE_CHARS.value,
        tfds_data_dir=_TFDS_DATA_DIR.value, overwrite=_OVERWRITE.value,
        keep_local_copy=_STATIC_DUPE_FACTOR.value > 0)  # the static build reads it, removes it
  except builder.NoDocumentsError as e:
    print(e.stats.summary())
    usage.fail(e.line)
  seconds = time.perf_counter() - start
  print(stats.summary())
  print(f"time:       {seconds:.1f} s, {stats.tokens / max(seconds, 1e-9):,.0f} tokens/s")
  if stats.documents_used == 1 and _NUM_HOSTS.value == 1:
    logging.warning("%s holds one document: sentence pairs (the mlm_nsp, mlm_pairs and ltr "
                    "objectives) need two or more, and are refused; if the input holds one "
                    "document a line, rebuild with --file_format=documents --overwrite",
                    _OUTPUT_DIR.value)
  if _STATIC_DUPE_FACTOR.value > 0:
    count = static_instances.prepare_static(
        _OUTPUT_DIR.value, objective=_OBJECTIVE.value, max_seq_length=_MAX_SEQ_LENGTH.value,
        masking=MaskingConfig(masked_lm_prob=_MASKED_LM_PROB.value,
                              max_predictions=_MAX_PREDICTIONS.value,
                              whole_word=_WHOLE_WORD_MASKING.value,
                              specials=_MASKING_SPECIALS.value),
        dupe_factor=_STATIC_DUPE_FACTOR.value, short_seq_prob=_SHORT_SEQ_PROB.value,
        seed=_SEED.value, eval_percent=_EVAL_PERCENT.value,
        num_workers=_NUM_WORKERS.value or os.cpu_count() or 1,
        num_hosts=_NUM_HOSTS.value, host_index=_HOST_INDEX.value)
    print(f"instances:  {count} statically masked ({_STATIC_DUPE_FACTOR.value} copies)")


if __name__ == "__main__":
  usage.run_main(main, interrupted="finished shards are kept: rerun the same command to "
                 "build the rest")
