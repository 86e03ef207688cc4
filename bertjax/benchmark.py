r"""Throughput of the pre-training step (MLM + NSP, AdamW) on random data.

  python -m bertjax.benchmark --layers 4 --hidden 512 --heads 8 \
      --intermediate 2048 --seq_len 128 --batch 32 --steps 20

Prints one JSON line: tokens_per_s, sequences_per_s, step_s_median, compile_s,
flops_per_token, tflops_per_s_per_device, peak_tflops_per_device, mfu, and the
settings. The batch is split over all local devices (data parallel); figures
"per device" divide by their number.
"""

from __future__ import annotations

import functools
import json
import statistics
import time

from absl import app, flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import flops, losses, optim
from bertjax.models import BertConfig, BertForPreTraining, init_params

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


def pretraining_step(state, batch, rng, model: nn.Module,
                     optimizer: optax.GradientTransformation):
  """One AdamW step on the MLM + NSP loss; returns (state, metrics)."""

  def loss_fn(params):
    out = model.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                      batch["token_type_ids"], batch["masked_positions"],
                      deterministic=False, rngs={"dropout": rng})
    mlm_loss, mlm_accuracy = losses.masked_lm_loss(out["mlm_logits"], batch["masked_ids"],
                                                   batch["masked_weights"])
    nsp_loss, nsp_accuracy = losses.next_sentence_loss(out["nsp_logits"],
                                                       batch["next_sentence_labels"])
    return mlm_loss + nsp_loss, (mlm_accuracy, nsp_accuracy)

  (loss, (mlm_accuracy, nsp_accuracy)), grads = jax.value_and_grad(
      loss_fn, has_aux=True)(state["params"])
  updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  metrics = {"loss": loss, "mlm_accuracy": mlm_accuracy, "nsp_accuracy": nsp_accuracy}
  return {"params": params, "opt_state": opt_state}, metrics


def run(config: BertConfig, seq_len: int, batch_size: int, max_predictions: int,
        steps: int, warmup: int) -> dict:
  """Compiles and times the step; returns the figures."""
  devices = jax.devices()
  if batch_size % len(devices):
    raise ValueError(f"--batch={batch_size} is not divisible by the {len(devices)} devices")
  mesh = jax.make_mesh((len(devices),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  replicated = jax.NamedSharding(mesh, jax.P())
  data_sharding = jax.NamedSharding(mesh, jax.P("data"))

  model = BertForPreTraining(config)
  optimizer = optim.adamw(1e-4)

  @functools.partial(jax.jit, out_shardings=replicated)
  def init(rng):
    params = nn.meta.unbox(init_params(model, rng))
    return {"params": params, "opt_state": optimizer.init(params)}

  state = init(jax.random.key(0))
  step = jax.jit(functools.partial(pretraining_step, model=model, optimizer=optimizer),
                 in_shardings=(replicated, data_sharding, replicated),
                 out_shardings=(replicated, replicated), donate_argnums=0)

  rng = np.random.default_rng(0)
  batches = [jax.device_put(make_batch(rng, batch_size, seq_len, max_predictions,
                                       config.vocab_size), data_sharding) for _ in range(2)]
  dropout_rng = jax.random.key(1)

  start = time.perf_counter()
  compiled = step.lower(state, batches[0], dropout_rng).compile()
  compile_s = time.perf_counter() - start

  times = []
  for i in range(warmup + steps):
    start = time.perf_counter()
    state, metrics = compiled(state, batches[i % 2], jax.random.fold_in(dropout_rng, i))
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
