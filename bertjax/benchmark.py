r"""Throughput of the pre-training step (MLM + NSP, AdamW) on random data.

  python -m bertjax.benchmark --layers 4 --hidden 512 --heads 8 \
      --intermediate 2048 --seq_len 128 --batch 32 --steps 20

Prints one JSON line: tokens_per_s, sequences_per_s, step_s_median, compile_s,
flops_per_token, tflops_per_s_per_device, peak_tflops_per_device, mfu, and the
settings. The step is the trainer's own (`bertjax.train.train_step`); the batch
is split over all devices (data parallel); figures "per device" divide by
their number.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags
import flax.linen as nn
import jax
import numpy as np

from bertjax import flops, optim, sharding, train
from bertjax.models import BertConfig

_LAYERS = flags.DEFINE_integer("layers", 4, "Transformer layers.")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Hidden size.")
_HEADS = flags.DEFINE_integer("heads", 4, "Attention heads.")
_INTERMEDIATE = flags.DEFINE_integer("intermediate", None, "Feed-forward size (4 x hidden).")
_VOCAB = flags.DEFINE_integer("vocab", 30522, "Vocabulary size (BERT's uncased vocabulary).")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "Tokens per sequence.")
_BATCH = flags.DEFINE_integer("batch", 32, "Sequences per step (global).")
_MAX_PREDICTIONS = flags.DEFINE_integer(
    "max_predictions", None, "Masked positions per sequence (default: 15% of seq_len, rounded up).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"],
                           "Compute dtype (default: float32 on CPU, bfloat16 elsewhere).")
_ATTENTION = flags.DEFINE_enum("attention", "xla", ["xla", "dot_product", "cudnn"],
                               "Attention implementation.")
_SCAN = flags.DEFINE_bool("scan", False, "Scan over layers.")
_REMAT = flags.DEFINE_string("remat", "none", "Remat policy (see BertConfig).")
_DROPOUT = flags.DEFINE_float("dropout", 0.1, "Hidden and attention dropout.")


# Data parallelism: the batch split over every device, parameters replicated.
_DATA_PARALLEL = (("batch", ("data", "fsdp")),)


def make_batch(rng: np.random.Generator, batch: int, seq_len: int, max_predictions: int,
               vocab: int) -> dict[str, np.ndarray]:
  """A random pre-training batch with the shapes and dtypes of the real one."""
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq_len), max_predictions,
                                           replace=False) for _ in range(batch)]), axis=1)
  token_types = (np.arange(seq_len)[None] >= seq_len // 2).astype(np.int32)
  return {
      "input_ids": rng.integers(0, vocab, (batch, seq_len), dtype=np.int32),
      "attention_mask": np.ones((batch, seq_len), np.int32),
      "token_type_ids": np.repeat(token_types, batch, axis=0),
      "masked_positions": positions.astype(np.int32),
      "masked_ids": rng.integers(0, vocab, (batch, max_predictions), dtype=np.int32),
      "masked_weights": np.ones((batch, max_predictions), np.float32),
      "next_sentence_labels": rng.integers(0, 2, (batch,), dtype=np.int32),
  }


def run(config: BertConfig, seq_len: int, batch_size: int, max_predictions: int,
        steps: int, warmup: int) -> dict:
  """Compiles and times `bertjax.train.train_step`; returns the figures."""
  devices = jax.devices()
  if batch_size % len(devices):
    raise ValueError(f"--batch={batch_size} is not divisible by the {len(devices)} devices")
  mesh = sharding.make_mesh((-1, 1, 1))
  model = train.pretraining_model(config, "mlm_nsp")
  schedule = optim.learning_rate_schedule(1e-4, 0, max(steps + warmup, 1))
  optimizer = optim.create_optimizer("adamw", schedule)
  data_sharding = sharding.batch_sharding(mesh)

  with jax.set_mesh(mesh), nn.logical_axis_rules(_DATA_PARALLEL):
    abstract = train.abstract_train_state(model, optimizer, 0)
    shardings = train.state_shardings(abstract, mesh, _DATA_PARALLEL)
    state = train.init_train_state(model, optimizer, 0, shardings)
    step, _ = train.jit_steps(model, optimizer, schedule, "mlm_nsp", 1, shardings,
                              data_sharding, sharding.replicated(mesh))
    rng = np.random.default_rng(0)
    batches = [jax.device_put(make_batch(rng, batch_size, seq_len, max_predictions,
                                         config.vocab_size), data_sharding) for _ in range(2)]
    start = time.perf_counter()
    compiled = step.lower(state, batches[0]).compile()
    compile_s = time.perf_counter() - start

    times = []
    for i in range(warmup + steps):
      start = time.perf_counter()
      state, metrics = compiled(state, batches[i % 2])
      jax.block_until_ready(metrics)
      if i >= warmup:
        times.append(time.perf_counter() - start)

  step_s = statistics.median(times)
  tokens_per_s = batch_size * seq_len / step_s
  per_token = flops.flops_per_token(config, seq_len, max_predictions)
  achieved = tokens_per_s * per_token / len(devices) / 1e12
  peak, peak_source = flops.peak_tflops(config.dtype)
  return {
      "tokens_per_s": round(tokens_per_s, 1),
      "sequences_per_s": round(batch_size / step_s, 2),
      "step_s_median": round(step_s, 5),
      "step_s_min": round(min(times), 5),
      "compile_s": round(compile_s, 2),
      "flops_per_token": per_token,
      "tflops_per_s_per_device": round(achieved, 4),
      "peak_tflops_per_device": round(peak, 4),
      "peak_source": peak_source,
      "mfu": round(achieved / peak, 4),
      "final_loss": float(metrics["loss"]),
      "devices": len(devices),
      "device_kind": devices[0].device_kind,
      "layers": config.num_layers, "hidden": config.hidden_size, "heads": config.num_heads,
      "intermediate": config.intermediate_size, "vocab": config.vocab_size,
      "seq_len": seq_len, "batch": batch_size, "max_predictions": max_predictions,
      "dtype": config.dtype, "attention": config.attention_impl,
      "scan": config.scan_layers, "remat": config.remat_policy, "steps": steps,
  }


def main(argv):
  del argv
  on_cpu = jax.devices()[0].platform == "cpu"
  dtype = _DTYPE.value or ("float32" if on_cpu else "bfloat16")
  attention_dropout = 0.0 if _ATTENTION.value != "xla" else _DROPOUT.value
  config = BertConfig(
      vocab_size=_VOCAB.value, hidden_size=_HIDDEN.value, num_layers=_LAYERS.value,
      num_heads=_HEADS.value, intermediate_size=_INTERMEDIATE.value or 4 * _HIDDEN.value,
      max_position_embeddings=max(512, _SEQ_LEN.value), dtype=dtype,
      hidden_dropout_prob=_DROPOUT.value, attention_dropout_prob=attention_dropout,
      attention_impl=_ATTENTION.value, scan_layers=_SCAN.value, remat_policy=_REMAT.value)
  max_predictions = _MAX_PREDICTIONS.value or -(-15 * _SEQ_LEN.value // 100)
  result = run(config, _SEQ_LEN.value, _BATCH.value, max_predictions, _STEPS.value,
               _WARMUP.value)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
