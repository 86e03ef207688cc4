r"""Padding of ModernBERT's recipe rows: bertjax's packing against ModernBERT's packer.

  python benchmarks/modernbert_packing.py

One sequence a document, its first `length` tokens with [CLS] and [SEP]
(ModernBERT's rule), packed three ways:
- `bertjax`: best-fit decreasing over windows of `--window` sequences into
  rows of `length` tokens, at most the recipe's `data.max_sequences_per_row`
  a row (`bertjax.data.packing.pack`); `bertjax-8`, at most 8 a row;
- `modernbert`: a transcription of ModernBERT's `GreedyBestFitSequencePacker`:
  sequences in the order they come, each into the fullest of a batch's
  "pseqs" that still holds it, a pseq being a whole micro-batch of
  `--micro` x `length` tokens (sequences may cross its rows: its attention
  reads the sequences' boundaries, not rows), those that fit nowhere kept for
  the next batch, a batch closed when the buffer of `--buffer` sequences
  (ModernBERT's default: 5 device batches) fills with them;
- `modernbert-rows`: the same rule on rows of `length` tokens, at most the
  recipe's cap a row: ModernBERT's order on the static rows that TPU
  attention needs.

Documents: `stdlib`, the demo corpus (the standard library's docstrings) in
a byte-level BPE trained on it, shuffled; `web-like`, synthetic documents
whose token counts are log-normal (`--doc_median_tokens`, `--doc_sigma`), an
assumption standing in for a web corpus, not a measurement of one.
Prints one JSON line per (corpus, length, packer): the padding share of the
full batches made, and the sequences a row.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import tempfile
from typing import Iterable, Iterator, Sequence

import numpy as np

from bertjax.configs import modernbert_pretrain
from bertjax.data import packing, vocabulary
from bertjax.data.stdlib_corpus import stdlib_documents
from bertjax.data.tokenizers import tokenizer_from_vocab_file

MAX_PER_ROW = modernbert_pretrain.get_config().data.max_sequences_per_row


def bertjax_rows(lengths: np.ndarray, length: int, window: int, most: int) -> dict:
  rows, real = 0, 0
  for start in range(0, len(lengths) - window + 1, window):  # whole windows
    part = lengths[start:start + window]
    rows += len(packing.pack(part, np.zeros_like(part), length, most, 1))
    real += int(part.sum())
  return _result(real, rows * length, rows, len(lengths[:len(lengths) // window * window]))


def greedy_best_fit(lengths: Sequence[int], pseqs: int, pseq_tokens: int, buffer_size: int,
                    source_batch: int, max_per_pseq: int | None = None
                    ) -> Iterator[list[list[int]]]:
  """ModernBERT's `GreedyBestFitSequencePacker._create_batch`, transcribed:
  its full batches, each `pseqs` lists of the indices of the sequences in
  them, in the order placed. The source is read `source_batch` sequences at
  a time (empty ones dropped); each sequence, in the order it comes, goes into
  the fullest pseq that holds it (`max_per_pseq`: and has room for another),
  or waits, put back at the front (as `deque.extendleft` does, reversed) for
  the next batch; a batch closes when the buffer cannot take another source
  batch, and the first batch with an empty pseq ends the stream."""
  source = iter(range(len(lengths)))
  buffer: collections.deque[int] = collections.deque()

  def fill(limit: int) -> int:
    added = 0
    while buffer_size - len(buffer) > source_batch and added + source_batch <= limit:
      incoming = list(itertools.islice(source, source_batch))
      if not incoming:
        break
      kept = [i for i in incoming if lengths[i] > 0]
      buffer.extend(kept)
      added += len(kept)
    return added

  while True:
    room = np.full(pseqs, pseq_tokens)
    placed: list[list[int]] = [[] for _ in range(pseqs)]
    skipped: list[int] = []
    while buffer or fill(buffer_size - len(skipped)):
      i = buffer.popleft()
      fits = room >= lengths[i]
      if max_per_pseq:
        fits &= np.array([len(p) < max_per_pseq for p in placed])
      if fits.any():
        best = np.flatnonzero(fits)[np.argmin(room[fits])]
        room[best] -= lengths[i]
        placed[best].append(i)
      else:
        skipped.append(i)
    buffer.extendleft(skipped)
    if not all(placed):
      return
    yield placed


def padding_of(lengths: Sequence[int], batches: Iterable[list[list[int]]],
               pseq_tokens: int) -> tuple[int, int, int]:
  """(real tokens, token slots, sequences) of a packer's batches."""
  real = slots = sequences = 0
  for batch in batches:
    real += sum(lengths[i] for pseq in batch for i in pseq)
    slots += len(batch) * pseq_tokens
    sequences += sum(map(len, batch))
  return real, slots, sequences


def _result(real: int, slots: int, rows: int, sequences: int) -> dict:
  return {"padding": round(1 - real / slots, 4), "sequences_per_row": round(sequences / rows, 3)}


def stdlib_lengths(length: int, seed: int = 0) -> np.ndarray:
  with tempfile.TemporaryDirectory() as scratch:
    path = os.path.join(scratch, "tokenizer.json")
    vocabulary.train("demo:stdlib", path, model="bpe", vocab_size=8000, show_progress=False)
    tokenizer = tokenizer_from_vocab_file(path)
    counts = [len(tokenizer.encode(" ".join(document))) for document in stdlib_documents()]
  order = np.random.default_rng(seed).permutation(len(counts))
  return np.minimum(np.asarray(counts)[order], length)


def web_like_lengths(documents: int, length: int, median: float, sigma: float,
                     seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  tokens = np.maximum(8, rng.lognormal(np.log(median), sigma, documents).astype(int))
  return np.minimum(tokens + 2, length)


def measure(corpus: str, lengths: np.ndarray, length: int, batch: int, micro: int,
            window: int):
  out = {"corpus": corpus, "length": length, "sequences": len(lengths), "batch_rows": batch}
  for packer, most in (("bertjax", MAX_PER_ROW), ("bertjax-8", 8)):
    yield {**out, "packer": packer, "window": window,
           **bertjax_rows(lengths, length, window, most)}
  for packer, pseqs, tokens, cap in (("modernbert", batch // micro, micro * length, None),
                                     ("modernbert-rows", batch, length, MAX_PER_ROW)):
    real, slots, emitted = padding_of(
        lengths, greedy_best_fit(lengths, pseqs, tokens, 5 * batch, batch, cap), tokens)
    yield {**out, "packer": packer, "micro_batch_rows": micro if cap is None else 1,
           **_result(real, slots, slots // length, emitted)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--window", type=int, default=2000)
  parser.add_argument("--documents", type=int, default=50000)
  parser.add_argument("--doc_median_tokens", type=float, default=300)
  parser.add_argument("--doc_sigma", type=float, default=1.25)
  args = parser.parse_args()
  # The recipe's device batch on 8 GPUs (4,608 / 8 rows, micro-batches of 96)
  # at 1,024 tokens and 576 / 8 (micro-batches of 12) at 8,192; the demo's (32
  # rows, micro-batches of 8) at 128 and for the demo corpus's 631 documents.
  web = {128: (32, 8), 1024: (576, 96), 8192: (72, 12)}
  for length, (batch, micro) in web.items():
    for line in measure("stdlib", stdlib_lengths(length), length, 32, 8, 600):
      print(json.dumps(line), flush=True)
    lengths = web_like_lengths(args.documents, length, args.doc_median_tokens, args.doc_sigma)
    for line in measure("web-like", lengths, length, batch, micro, args.window):
      print(json.dumps(line), flush=True)


if __name__ == "__main__":
  main()
