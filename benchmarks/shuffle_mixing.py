r"""How independent a pre-training batch's instances are, by shuffle window.

The `mlm_nsp` pipeline makes a document's instances one after another; the
loader's `WindowShuffle` then permutes windows of `data.shuffle_window`
consecutive instances. A batch drawn from a small window holds several
instances of the same few documents; the original code shuffled all of them.
This runs bertjax's own instance generator (`create_instances_from_document`)
and `WindowShuffle` over synthetic documents whose sentence counts give about
`--sentences` x (tokens a sentence) / 125 instances each at length 128, and
prints, per window, the distinct documents in a batch of 256 (full shuffle:
the same with all instances permuted), the window's memory (the instances'
numpy arrays and Python objects, by tracemalloc while they are made) and the
time to make a window's instances, which a start or a restore pays (reading
the documents from shards comes on top).

  python benchmarks/shuffle_mixing.py --sentences 40 --windows 1000,10000,50000
  python benchmarks/shuffle_mixing.py --sentences 400 --max_seq_length 512

One JSON line per window.
"""

import argparse
import json
import time
import tracemalloc

import grain
import numpy as np

from bertjax.data import instances
from bertjax.data.loader import WindowShuffle


def _documents(count: int, sentences: int, seed: int):
  """Documents of `sentences` (+-50%) sentences of 10-40 tokens, ids unique per document."""
  rng = np.random.default_rng(seed)
  documents = []
  for d in range(count):
    n = max(1, int(rng.integers(sentences // 2, sentences * 3 // 2 + 1)))
    documents.append([np.arange(rng.integers(10, 41), dtype=np.int32) + 1000
                      for _ in range(n)])
  return documents


def _stream(documents, max_seq_length: int, owner: dict):
  """The `mlm_nsp` instances of the documents in order, each key's document noted."""
  candidates = np.arange(len(documents))
  for d, sentences in enumerate(documents):
    rng = np.random.default_rng([0, d])
    for instance in instances.create_instances_from_document(
        sentences, d, candidates, documents.__getitem__, max_seq_length, 0.1, 2, 3, rng, d):
      owner[instance.key] = d
      yield instance


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--documents", type=int, default=20_000)
  parser.add_argument("--sentences", type=int, default=40, help="Sentences a document, mean.")
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--batches", type=int, default=200, help="Batches measured a window.")
  parser.add_argument("--windows", default="1000,10000,50000,100000")
  args = parser.parse_args()

  documents = _documents(args.documents, args.sentences, seed=1)
  owner: dict[int, int] = {}
  tracemalloc.start()
  start = time.perf_counter()
  every = list(_stream(documents, args.max_seq_length, owner))
  seconds_per_instance = (time.perf_counter() - start) / len(every)
  # The instances alone: the owner table (a measurement aid) is left out.
  owner_bytes = len(owner) * (8 + 28 + 28) * 2  # two ints and a dict slot, generously
  bytes_per_instance = max(tracemalloc.get_traced_memory()[0] - owner_bytes, 0) / len(every)
  tracemalloc.stop()
  per_document = len(every) / len(documents)
  # Full shuffle: a batch of B from N instances of D documents of k each.
  rng = np.random.default_rng(2)
  full = np.mean([len({owner[every[i].key] for i in rng.choice(len(every), args.batch,
                                                                 replace=False)})
                  for _ in range(args.batches)])
  for window in [int(w) for w in args.windows.split(",")]:
    if window > len(every):
      print(json.dumps({"window": window, "skipped": f"more than the {len(every)} instances"}))
      continue
    source = grain.MapDataset.source(every).to_iter_dataset()
    iterator = iter(WindowShuffle(source, window, seed=0))
    batches, batch = [], []
    for instance in iterator:
      batch.append(instance)
      if len(batch) == args.batch:
        batches.append(len({owner[i.key] for i in batch}))
        batch = []
        if len(batches) == args.batches:
          break
    print(json.dumps({
        "max_seq_length": args.max_seq_length, "instances_per_document": round(per_document, 1),
        "window": window, "batch": args.batch,
        "distinct_documents_per_batch": round(float(np.mean(batches)), 1),
        "full_shuffle": round(float(full), 1),
        "window_mib": round(window * bytes_per_instance / 2**20, 1),
        "bytes_per_instance": round(bytes_per_instance),
        "fill_s": round(window * seconds_per_instance, 2)}))


if __name__ == "__main__":
  main()
