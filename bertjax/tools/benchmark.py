r"""Throughput of the pre-training step (MLM + NSP, AdamW), on random or real data.

  python -m bertjax.tools.benchmark --layers 4 --hidden 512 --heads 8 \
      --intermediate 2048 --seq_len 128 --batch 32 --steps 20
  python -m bertjax.tools.benchmark --size bert_base --batch 256 --data_dir DATA \
      --sequences_per_row 3 --attention auto

Prints one JSON line: tokens_per_s (every token slot, padding included),
real_tokens_per_s, padding, sequences_per_s, step_s_median, compile_s,
flops_per_token (of a full row, for planning), tflops_per_s_per_device (model
FLOPs of the real work: `bertjax.flops.model_flops`), peak_tflops_per_device,
mfu (none for an accelerator missing from `bertjax.flops.PEAK_TFLOPS`), and
the settings. The step is the trainer's own (`bertjax.train.train_step`); the
batch is split over all devices (data parallel); figures "per device" divide by
their number.

Data: random full rows (`--data_dir` unset: every slot real, the paired
comparison with transformers' Flax BERT), or batches of a prepared directory
through the real input pipeline (`bertjax.data.loader`), padded
(`--sequences_per_row 1`) or packed; `--batches` of them are made before the
clock starts and cycled, so the figures are the step's, not the pipeline's.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import flags
import numpy as np

from bertjax import errors, paths, usage
from bertjax.models.config import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS
from bertjax.models.config import PRESETS, EncoderConfig

_SIZE = flags.DEFINE_string("size", None, "A model preset (bert_base, bert_large, ...); "
                            "overrides --layers/--hidden/--heads/--intermediate.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Transformer layers.")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Hidden size.")
_HEADS = flags.DEFINE_integer("heads", 4, "Attention heads.")
_INTERMEDIATE = flags.DEFINE_integer("intermediate", None, "Feed-forward size (4 x hidden).")
_VOCAB = flags.DEFINE_integer("vocab", 30522, "Vocabulary size (BERT's uncased vocabulary).")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "Tokens per row.")
_BATCH = flags.DEFINE_integer("batch", 32, "Rows per step (global).")
_MAX_PREDICTIONS = flags.DEFINE_integer(
    "max_predictions", None, "Masked positions per row (default: 15% of seq_len, rounded up).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"],
                           "Compute dtype (default: float32 on CPU, bfloat16 elsewhere).")
_ATTENTION = flags.DEFINE_enum("attention", "auto", list(IMPLEMENTATIONS),
                               "Attention kernel (bertjax.models.attention).")
_SCAN = flags.DEFINE_bool("scan", False, "Scan over layers.")
_REMAT = flags.DEFINE_string("remat", "none", "Remat policy (see EncoderConfig).")
_DROPOUT = flags.DEFINE_float("dropout", 0.1, "Hidden dropout.")
_ATTENTION_DROPOUT = flags.DEFINE_float(
    "attention_dropout", None, "Attention dropout (default: --dropout with --attention xla "
    "or auto, which then runs XLA; else 0: the fused kernels have none).")
_DATA_DIR = paths.DEFINE_path("data_dir", None, "A prepared pre-training directory: real "
                              "batches through the input pipeline (default: random rows).")
_SEQUENCES_PER_ROW = flags.DEFINE_integer("sequences_per_row", 1, "With --data_dir: 1 pads "
                                          "each sequence to a row; more packs rows.")
_BATCHES = flags.DEFINE_integer("batches", 4, "Distinct batches made and cycled.")


# Data parallelism: the batch split over every device, parameters replicated.
_DATA_PARALLEL = (("batch", ("data", "fsdp")),)


def make_batch(rng: np.random.Generator, batch: int, seq_len: int, max_predictions: int,
               vocab: int) -> dict[str, np.ndarray]:
  """A random pre-training batch of full rows, with the real one's shapes and dtypes."""
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


def real_batches(data_dir: str, count: int, batch: int, seq_len: int, max_predictions: int,
                 sequences_per_row: int) -> list[dict[str, np.ndarray]]:
  """`count` mlm_nsp batches of a prepared directory (padded or packed rows)."""
  from bertjax.data import loader
  from bertjax.data.masking import MaskingConfig

  config = loader.LoaderConfig(data_dir, objective="mlm_nsp", max_seq_length=seq_len,
                               batch_size=batch,
                               masking=MaskingConfig(max_predictions=max_predictions),
                               max_sequences_per_row=sequences_per_row)
  iterator = iter(loader.make_dataset(config))
  return [next(iterator) for _ in range(count)]


def run(config: EncoderConfig, seq_len: int, batch_size: int, max_predictions: int,
        steps: int, warmup: int, batches: list[dict[str, np.ndarray]] | None = None) -> dict:
  """Compiles and times `bertjax.train.train_step`; returns the figures.

  Args:
    batches: Host batches to cycle through; default two random ones.
  """
  import flax.linen as nn  # here: --help and a flag mistake answer without JAX's start
  import jax

  from bertjax import flops, optim, sharding, train

  devices = jax.devices()
  if batch_size % len(devices):
    raise errors.UsageError(f"--batch={batch_size} is not divisible by the {len(devices)} devices")
  mesh = sharding.make_mesh((-1, 1, 1))
  model = train.pretraining_model(config, "mlm_nsp")
  schedule = optim.learning_rate_schedule(1e-4, 0, max(steps + warmup, 1))
  optimizer = optim.create_optimizer("adamw", schedule)
  data_sharding = sharding.batch_sharding(mesh)
  if batches is None:
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, batch_size, seq_len, max_predictions, config.vocab_size)
               for _ in range(2)]

  with jax.set_mesh(mesh), nn.logical_axis_rules(_DATA_PARALLEL):
    abstract = train.abstract_train_state(model, optimizer, 0)
    shardings = train.state_shardings(abstract, mesh, _DATA_PARALLEL)
    state = train.init_train_state(model, optimizer, 0, shardings)
    step, _ = train.jit_steps(model, optimizer, schedule, "mlm_nsp", 1, shardings,
                              data_sharding, sharding.replicated(mesh))
    on_device = [jax.device_put(batch, data_sharding) for batch in batches]
    start = time.perf_counter()
    compiled = step.lower(state, on_device[0]).compile()
    compile_s = time.perf_counter() - start

    times, work = [], []
    for i in range(warmup + steps):
      start = time.perf_counter()
      state, metrics = compiled(state, on_device[i % len(on_device)])
      jax.block_until_ready(metrics)
      if i >= warmup:
        times.append(time.perf_counter() - start)
        work.append({k: float(metrics[k]) for k in ("real_tokens", "sequences",
                                                    "model_flops")})

  step_s = statistics.median(times)
  mean = {k: statistics.fmean(w[k] for w in work) for k in work[0]}
  achieved = mean["model_flops"] / step_s / len(devices) / 1e12
  peak, peak_source = flops.peak_tflops(config.dtype)
  slots = batch_size * seq_len
  return {
      "tokens_per_s": round(slots / step_s, 1),
      "real_tokens_per_s": round(mean["real_tokens"] / step_s, 1),
      "padding": round(1 - mean["real_tokens"] / slots, 4),
      "sequences_per_s": round(mean["sequences"] / step_s, 2),
      "step_s_median": round(step_s, 5),
      "step_s_min": round(min(times), 5),
      "compile_s": round(compile_s, 2),
      "flops_per_token": flops.flops_per_token(config, seq_len, max_predictions),
      "tflops_per_s_per_device": round(achieved, 4),
      "peak_tflops_per_device": None if peak is None else round(peak, 4),
      "peak_source": peak_source,
      "mfu": None if peak is None else round(achieved / peak, 4),
      "final_loss": float(metrics["loss"]),
      "devices": len(devices),
      "device_kind": devices[0].device_kind,
      "layers": config.num_layers, "hidden": config.hidden_size, "heads": config.num_heads,
      "intermediate": config.intermediate_size, "vocab": config.vocab_size,
      "seq_len": seq_len, "batch": batch_size, "max_predictions": max_predictions,
      "dtype": config.dtype, "attention": config.attention_impl,
      "attention_dropout": config.attention_dropout_prob,
      "scan": config.scan_layers, "remat": config.remat_policy, "steps": steps,
      "sequences_per_row": round(mean["sequences"] / batch_size, 3),
  }


def main(argv):
  del argv
  import jax

  on_cpu = jax.devices()[0].platform == "cpu"
  dtype = _DTYPE.value or ("float32" if on_cpu else "bfloat16")
  attention_dropout = _ATTENTION_DROPOUT.value
  if attention_dropout is None:
    attention_dropout = _DROPOUT.value if _ATTENTION.value in ("xla", "auto") else 0.0
  sizes = dict(num_layers=_LAYERS.value, hidden_size=_HIDDEN.value, num_heads=_HEADS.value,
               intermediate_size=_INTERMEDIATE.value or 4 * _HIDDEN.value)
  if _SIZE.value:
    if _SIZE.value not in PRESETS:
      raise errors.UsageError(f"--size={_SIZE.value}: one of {', '.join(sorted(PRESETS))}")
    sizes = PRESETS[_SIZE.value]
  config = EncoderConfig(
      vocab_size=_VOCAB.value, max_position_embeddings=max(512, _SEQ_LEN.value), dtype=dtype,
      hidden_dropout_prob=_DROPOUT.value, attention_dropout_prob=attention_dropout,
      attention_impl=_ATTENTION.value, scan_layers=_SCAN.value, remat_policy=_REMAT.value,
      **sizes)
  max_predictions = _MAX_PREDICTIONS.value or -(-15 * _SEQ_LEN.value // 100)
  batches = None
  if _DATA_DIR.value:
    batches = real_batches(_DATA_DIR.value, _BATCHES.value, _BATCH.value, _SEQ_LEN.value,
                           max_predictions, _SEQUENCES_PER_ROW.value)
  result = run(config, _SEQ_LEN.value, _BATCH.value, max_predictions, _STEPS.value,
               _WARMUP.value, batches)
  print(json.dumps(result))


if __name__ == "__main__":
  usage.run_main(main)
