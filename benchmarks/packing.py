r"""How much of a batch is padding, one sequence a row against packed rows.

  python benchmarks/packing.py                       # both corpora, lengths 128 and 512

Two corpora:
- `stdlib`: the demo corpus (the standard library's docstrings, real prose),
  prepared with a WordPiece vocabulary trained on it, through the real input
  pipeline (`bertjax.data.loader`, mlm_nsp): the padding share of its batches.
- `wikipedia-like`: synthetic documents whose lengths follow a stated
  distribution (`--doc_median_tokens`, `--doc_sigma`: log-normal, median 300
  tokens and mean ~650 by default, a stand-in for Wikipedia's many short and
  few long articles; sentences log-normal around 24 tokens), through the
  original's instance generator (`bertjax.data.instances`) and the packer
  (`bertjax.data.packing.pack`, windows of `--window`).
Prints one JSON line per (corpus, length, sequences a row): the padding
share, sequences a row, and the real tokens a row, whose ratio to the unpacked
row's is the gain in useful tokens a step.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np

from bertjax.data import builder, instances, loader, packing, vocabulary
from bertjax.data.masking import MaskingConfig
from bertjax.data.tokenizers import tokenizer_from_vocab_file

ROWS = (1, 2, 3, 4, 8)


def stdlib(lengths, batches: int, batch: int):
  with tempfile.TemporaryDirectory() as scratch:
    vocab = os.path.join(scratch, "vocab.txt")
    vocabulary.train("demo:stdlib", vocab, vocab_size=8000, show_progress=False)
    data = os.path.join(scratch, "data")
    builder.prepare("demo:stdlib", data, tokenizer_from_vocab_file(vocab), num_shards=2,
                    num_workers=1, show_progress=False)
    for length in lengths:
      for rows in ROWS:
        config = loader.LoaderConfig(
            data, objective="mlm_nsp", max_seq_length=length, batch_size=batch,
            masking=MaskingConfig(max_predictions=-(-15 * length // 100)),
            max_sequences_per_row=rows, shuffle_window=1000)
        iterator = iter(loader.make_dataset(config))
        real = sequences = 0
        for _ in range(batches):
          b = next(iterator)
          ids = b["segment_ids"] if "segment_ids" in b else b["attention_mask"]
          real += int((ids > 0).sum())
          sequences += int(ids.max(axis=1).sum())
        yield _line("stdlib", length, rows, real, sequences, batches * batch)


def wikipedia_like(lengths, documents: int, window: int, median: float, sigma: float,
                   seed: int = 0):
  rng = np.random.default_rng(seed)
  corpus = []
  for _ in range(documents):
    target = max(8, int(rng.lognormal(np.log(median), sigma)))
    sentences, total = [], 0
    while total < target:
      n = max(3, int(rng.lognormal(np.log(24), 0.5)))
      sentences.append(np.full(n, 7, np.int32))
      total += n
    corpus.append(sentences)
  candidates = np.arange(documents)
  for length in lengths:
    sizes = []
    for index, document in enumerate(corpus):
      made = instances.create_instances_from_document(
          document, index, candidates, corpus.__getitem__, length, 0.1, 2, 3,
          np.random.default_rng([seed, index]))
      sizes.extend(len(i.token_ids) for i in made)
    sizes = np.asarray(sizes)
    predictions = np.minimum(-(-15 * length // 100),
                             np.maximum(1, np.round(sizes * 0.15))).astype(int)
    for rows in ROWS:
      count = 0
      for start in range(0, len(sizes), window):
        count += len(packing.pack(sizes[start:start + window],
                                  predictions[start:start + window], length, rows,
                                  -(-15 * length // 100)))
      yield _line("wikipedia-like", length, rows, int(sizes.sum()), len(sizes), count)


def _line(corpus: str, length: int, rows: int, real: int, sequences: int,
          slots_rows: int) -> str:
  return json.dumps({"corpus": corpus, "max_seq_length": length, "max_sequences_per_row": rows,
                     "padding": round(1 - real / (slots_rows * length), 4),
                     "sequences_per_row": round(sequences / slots_rows, 3),
                     "real_tokens_per_row": round(real / slots_rows, 1)})


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--lengths", default="128,512")
  parser.add_argument("--batches", type=int, default=30)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--documents", type=int, default=20000)
  parser.add_argument("--window", type=int, default=2000)
  parser.add_argument("--doc_median_tokens", type=float, default=300)
  parser.add_argument("--doc_sigma", type=float, default=1.25)
  args = parser.parse_args()
  lengths = [int(n) for n in args.lengths.split(",")]
  for line in stdlib(lengths, args.batches, args.batch):
    print(line, flush=True)
  for line in wikipedia_like(lengths, args.documents, args.window, args.doc_median_tokens,
                             args.doc_sigma):
    print(line, flush=True)


if __name__ == "__main__":
  main()
