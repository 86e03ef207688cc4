r"""Throughput of the pre-training data path on one core.

  python -m bertjax.tools.benchmark_data
  python -m bertjax.tools.benchmark_data --input='corpus/*.txt' --vocab=vocab.txt

Prints one JSON line per measurement:
- `builder`: end-to-end tokens/s of `prepare_pretraining_data` with one worker
  (read, split, tokenise, write) on raw text in the original format;
- `loader`: masked sequences/s of the `mlm_nsp` pipeline (instances, shuffle,
  batching, masking; no worker processes) at each `--lengths`.
Without `--input`, the raw text is the demo corpus (the standard library's
docstrings) written out `--repeat` times, with a WordPiece vocabulary trained
on it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import app, flags

from bertjax.data import builder, corpus, loader, vocabulary
from bertjax.data.masking import MaskingConfig
from bertjax.data.tokenizers import tokenizer_from_vocab_file

_INPUT = flags.DEFINE_string("input", None, "Raw text (files/globs); default: the demo "
                             "corpus written out.")
_VOCAB = flags.DEFINE_string("vocab", None, "vocab.txt; default: trained on the input.")
_REPEAT = flags.DEFINE_integer("repeat", 8, "Copies of the demo corpus in the raw text.")
_LENGTHS = flags.DEFINE_list("lengths", ["128", "512"], "Sequence lengths for the loader.")
_BATCH = flags.DEFINE_integer("batch", 256, "Loader batch size.")
_BATCHES = flags.DEFINE_integer("batches", 40, "Timed loader batches.")


def _demo_text(path: str, repeat: int) -> None:
  documents = list(corpus.stdlib_documents())
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(repeat):
      for document in documents:
        f.write("\n".join(document) + "\n\n")


def main(argv):
  del argv
  os.environ["RAYON_NUM_THREADS"] = "1"  # one core for the Rust tokenizer too
  with tempfile.TemporaryDirectory() as scratch:
    raw = _INPUT.value
    if raw is None:
      raw = os.path.join(scratch, "demo.txt")
      _demo_text(raw, _REPEAT.value)
    vocab = _VOCAB.value
    if vocab is None:
      vocab = os.path.join(scratch, "vocab.txt")
      vocabulary.train_wordpiece(lambda: vocabulary.sentences(raw), vocab, 30522, True)
    tokenizer = tokenizer_from_vocab_file(vocab)
    data_dir = os.path.join(scratch, "prepared")
    start = time.perf_counter()
    stats = builder.prepare(raw, data_dir, tokenizer, num_shards=4, num_workers=1,
                            show_progress=False)
    seconds = time.perf_counter() - start
    print(json.dumps({"stage": "builder", "cores": 1, "tokens": stats.tokens,
                      "documents": stats.documents_used, "seconds": round(seconds, 2),
                      "tokens_per_s": round(stats.tokens / seconds),
                      "vocab_size": tokenizer.vocab_size}))

    for length in (int(n) for n in _LENGTHS.value):
      config = loader.LoaderConfig(
          data_dir, objective="mlm_nsp", max_seq_length=length, batch_size=_BATCH.value,
          masking=MaskingConfig(max_predictions=-(-15 * length // 100)))
      iterator = iter(loader.make_dataset(config))
      for _ in range(3):
        next(iterator)
      start = time.perf_counter()
      for _ in range(_BATCHES.value):
        next(iterator)
      seconds = time.perf_counter() - start
      print(json.dumps({"stage": "loader", "cores": 1, "objective": "mlm_nsp",
                        "max_seq_length": length, "batch": _BATCH.value,
                        "sequences_per_s": round(_BATCHES.value * _BATCH.value / seconds),
                        "seconds": round(seconds, 2)}))


if __name__ == "__main__":
  app.run(main)
