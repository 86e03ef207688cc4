r"""Throughput of the pre-training data path on one core, and what devices consume.

  python -m bertjax.tools.benchmark_data
  python -m bertjax.tools.benchmark_data --input='corpus/*.txt' --vocab=vocab.txt
  python -m bertjax.tools.benchmark_data --config=configs/base_pretrain.py --accelerator=H200
  python -m bertjax.tools.benchmark_data --config=configs/large_pretrain.py --accelerator=v4-32

Prints one JSON line per measurement:
- `builder`: tokens/s of `prepare_pretraining_data`'s work with one worker
  (read, split, tokenise, write) on raw text in the original format;
- `builder_command` and `tokenizers_alone`: end to end, from process start to
  exit, the `prepare_pretraining_data` command (one worker) against a script
  that only reads the same text and tokenises its lines with the `tokenizers`
  library (one thread), and the ratio of their tokens/s;
- `loader`: sequences/s one loader process delivers (instances, shuffle,
  packing, masking, batching), per length: the `mlm_nsp` pipeline at
  `--lengths`, or with `--config` that config's objective, masking and packing
  at each of its phases' lengths, with the share of padding slots;
- `consumption` (with `--config` and `--accelerator`): the rows/s one host's
  devices take at 40% and 60% MFU for that model and length, and the loader
  processes that needs at the rows/s measured (a packed row holds several
  sequences) next to what `data.worker_count=-1` picks.
`--accelerator` is a gcloud TPU type (`v4-32`, `v5litepod-16`: chips per host
from the slice) or a device of `bertjax.flops.PEAK_TFLOPS` (`H200`, `A100`)
with `--devices_per_host`. Without `--input`, the raw text is the demo corpus
(the standard library's docstrings) written out `--repeat` times, with a
WordPiece vocabulary trained on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

import ml_collections
from absl import flags
from ml_collections import config_flags

from bertjax import errors, paths, throughput, usage
from bertjax.phases import Phase, phases
from bertjax.data import builder, shards, stdlib_corpus, vocabulary
from bertjax.data.masking import MaskingConfig
from bertjax.data.tokenizers import tokenizer_from_vocab_file

if TYPE_CHECKING:  # JAX and grain come in with the loader: imported where measured
  from bertjax.data import loader

_INPUT = paths.DEFINE_path("input", None, "Raw text (files/globs); default: the demo corpus "
                           "written out.", kind="inputs")
_VOCAB = paths.DEFINE_path("vocab", None, "vocab.txt, .model or tokenizer.json; default: a "
                           "WordPiece trained on the input.")
_REPEAT = flags.DEFINE_integer("repeat", 8, "Copies of the demo corpus in the raw text.")
_LENGTHS = flags.DEFINE_list("lengths", ["128", "512"], "Sequence lengths for the loader "
                             "(without --config).")
_BATCH = flags.DEFINE_integer("batch", 256, "Loader batch size (rows).")
_BATCHES = flags.DEFINE_integer("batches", 40, "Timed loader batches.")
_CONFIG = config_flags.DEFINE_config_file("config", None, "A pre-training config: measure "
                                          "its loader settings and model.", lock_config=True)
_ACCELERATOR = flags.DEFINE_string("accelerator", None, "gcloud TPU type (v4-32) or a "
                                   "bertjax.flops.PEAK_TFLOPS device (H200): what it consumes.")
_DEVICES_PER_HOST = flags.DEFINE_integer("devices_per_host", 8, "GPUs a host (with a GPU "
                                         "--accelerator).")
_HOST_CPUS = flags.DEFINE_integer("host_cpus", None, "Cores of the accelerator's host, for "
                                  "the worker-count rule; default: this machine's.")
_MFUS = (0.4, 0.6)


def _demo_text(path: str, repeat: int) -> None:
  documents = list(stdlib_corpus.stdlib_documents())
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(repeat):
      for document in documents:
        f.write("\n".join(document) + "\n\n")


def accelerator(name: str, devices_per_host: int) -> tuple[str, int, float]:
  """(PEAK_TFLOPS key, devices a host, bfloat16 peak TFLOP/s a device) of a
  gcloud TPU type or a table device.

  Raises:
    ValueError: neither, naming both kinds.
  """
  from bertjax import flops, topology

  tpu_keys = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5p", "v6e": "TPU v6 lite"}
  try:
    tpu_slice = topology.parse(name)
  except ValueError:
    pass
  else:
    key = tpu_keys[tpu_slice.generation.name]
    return key, tpu_slice.chips // tpu_slice.hosts, flops.PEAK_TFLOPS[key][0]
  for key, (bf16, _) in flops.PEAK_TFLOPS.items():
    if key.lower() == name.lower():
      return key, devices_per_host, bf16
  raise errors.UsageError(
      f"--accelerator={name}: give a gcloud TPU type (v4-32, v5litepod-16, ...) "
      f"or one of {', '.join(flops.PEAK_TFLOPS)}")


def _loaders(config: ml_collections.ConfigDict | None) -> list[tuple[Phase | None, int]]:
  """(phase, sequence length) to measure: the config's phases, or (None,
  length) for mlm_nsp at each of --lengths without a config."""
  if config is None:
    return [(None, int(n)) for n in _LENGTHS.value]
  return [(phase, phase.max_seq_length) for phase in phases(config)]


def main(argv):
  del argv
  from bertjax.data import loader  # with JAX and grain: not for --help
  os.environ["RAYON_NUM_THREADS"] = "1"  # one core for the Rust tokenizer too
  config = _CONFIG.value
  target = (accelerator(_ACCELERATOR.value, _DEVICES_PER_HOST.value)
            if _ACCELERATOR.value else None)
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
    stats = builder.prepare(raw, data_dir, tokenizer, file_format="sentences", num_shards=4,
                            num_workers=1, show_progress=False)
    seconds = time.perf_counter() - start
    print(json.dumps({"stage": "builder", "cores": 1, "tokens": stats.tokens,
                      "documents": stats.documents_used, "seconds": round(seconds, 2),
                      "tokens_per_s": round(stats.tokens / seconds),
                      "vocab_size": tokenizer.vocab_size}))

    print(json.dumps(_against_tokenizers(raw, vocab, scratch)))

    for phase, length in _loaders(config):
      if config is None:
        settings = loader.LoaderConfig(
            data_dir, objective="mlm_nsp", max_seq_length=length, batch_size=_BATCH.value,
            masking=MaskingConfig(max_predictions=-(-15 * length // 100)))
      else:
        from bertjax.tasks import pretrain_data

        # A window no larger than what is timed: the rate is the stream's, not
        # that of handing out instances made before the clock started.
        settings = pretrain_data.loader_config(config, data_dir, phase, "train", _BATCH.value)
        settings = dataclasses.replace(
            settings, shuffle_window=min(settings.shuffle_window, _BATCH.value * 4))
      rates = _measure(settings)
      print(json.dumps({"stage": "loader", "cores": 1, "objective": settings.objective,
                        "max_seq_length": length, "batch": _BATCH.value,
                        "max_sequences_per_row": settings.max_sequences_per_row, **rates}))
      if target is not None and config is not None:
        print(json.dumps(_consumption(config, phase, target, rates, settings)))


# Only what the data builder cannot do without: read the text, tokenise its
# lines with the Rust tokenizer.
_TOKENIZERS_ALONE = """
import sys
import tokenizers
if sys.argv[2].endswith(".json"):
  tokenizer = tokenizers.Tokenizer.from_file(sys.argv[2])
else:
  tokenizer = tokenizers.BertWordPieceTokenizer(sys.argv[2], lowercase=True)
text = open(sys.argv[1], encoding="utf-8").read()
lines = [line for line in text.split("\\n") if line.strip()]
print(sum(len(e.ids) for e in tokenizer.encode_batch(lines, add_special_tokens=False)))
"""


def _timed(command: list[str]) -> tuple[float, str]:
  start = time.perf_counter()
  result = subprocess.run(command, capture_output=True, text=True, check=True,
                          env={**os.environ, "RAYON_NUM_THREADS": "1"})
  return time.perf_counter() - start, result.stdout


def _against_tokenizers(raw: str, vocab: str, scratch: str) -> dict:
  """The builder command and the tokenizers library alone, end to end."""
  out = os.path.join(scratch, "command")
  builder_s, _ = _timed([sys.executable, "-m", "bertjax.tools.prepare_pretraining_data",
                         f"--input={raw}", f"--vocab={vocab}", f"--output_dir={out}",
                         "--num_shards=4", "--num_workers=1"])
  tokens = shards.read_stats(out).tokens
  alone_s, printed = _timed([sys.executable, "-c", _TOKENIZERS_ALONE, raw, vocab])
  alone_tokens = int(printed.split()[-1])
  return {"stage": "builder_command", "cores": 1, "seconds": round(builder_s, 2),
          "tokens_per_s": round(tokens / builder_s),
          "tokenizers_alone_seconds": round(alone_s, 2),
          "tokenizers_alone_tokens_per_s": round(alone_tokens / alone_s),
          "ratio": round((tokens / builder_s) / (alone_tokens / alone_s), 3)}


def _measure(settings: loader.LoaderConfig) -> dict:
  """Rates of the loader over --batches batches (at least two packing windows'
  worth: a window is packed at once, when its first row is asked for)."""
  from bertjax.data import loader, packing

  batches = _BATCHES.value
  if settings.packed:
    batches = max(batches, math.ceil(2 * settings.packing_window / settings.batch_size))
  iterator = iter(loader.make_dataset(settings))
  for _ in range(3):
    next(iterator)
  sequences = padding = 0.0
  start = time.perf_counter()
  for _ in range(batches):
    batch = next(iterator)
    ids = batch["segment_ids"] if "segment_ids" in batch else batch["attention_mask"]
    sequences += float(ids.max(axis=1).sum())
    padding += packing.padding_share(batch)
  seconds = time.perf_counter() - start
  rows = batches * settings.batch_size
  return {"sequences_per_s": round(sequences / seconds), "rows_per_s": round(rows / seconds),
          "sequences_per_row": round(sequences / rows, 3), "batches": batches,
          "padding": round(padding / batches, 4), "seconds": round(seconds, 2)}


def _consumption(config: ml_collections.ConfigDict, phase: Phase,
                 target: tuple[str, int, float], rates: dict,
                 settings: loader.LoaderConfig) -> dict:
  """What the target's devices consume of the phase's rows a second at each
  MFU, and the loader processes that takes at the rate measured (`rates`)."""
  from bertjax import flops
  from bertjax.models import EncoderConfig

  key, devices, peak = target
  cpus = _HOST_CPUS.value or os.cpu_count() or 1
  bert = EncoderConfig.from_run_config(config)
  per_row = phase.max_seq_length * flops.flops_per_token(
      bert, phase.max_seq_length, phase.max_predictions)
  needed = {f"{mfu:.0%}": round(devices * peak * 1e12 * mfu / per_row) for mfu in _MFUS}
  delivered = rates["rows_per_s"]  # one process; a packed row holds several sequences
  return {"stage": "consumption", "accelerator": key, "devices_per_host": devices,
          "peak_tflops_per_device": peak, "max_seq_length": phase.max_seq_length,
          "model_flops_per_row": per_row, "rows_per_s_needed": needed,
          "loader_processes_needed": {mfu: math.ceil(n / delivered) for mfu, n in needed.items()},
          "worker_count_rule": throughput.loader_workers(
              platform="tpu" if key.startswith("TPU") else "gpu",
              length=phase.max_seq_length, flops_per_row=per_row, local_devices=devices,
              peak_tflops=peak, cpus=cpus,
              sequences_per_row=settings.max_sequences_per_row),
          "host_cpus": cpus}


if __name__ == "__main__":
  usage.run_main(main)
