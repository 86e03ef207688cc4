"""Model FLOPs per token and per-device peak rates, for MFU.

MFU = model FLOP/s per device / peak FLOP/s per device. Model FLOPs count the
matmuls of the useful work (multiply-add = 2 FLOPs): real tokens only, the
attention of each sequence over its own tokens (a packed row's sequences do
not attend to each other; padding is not attended), the masked LM head at the
real masked positions; recomputation (remat) is not counted, so MFU does not
reward it, nor padding.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from typing import TypeVar

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import cpu_load
from bertjax.models import EncoderConfig, family

# Dense peak TFLOP/s per JAX device: (bfloat16, float32). On TPU, float32
# matmuls run as bfloat16 passes, so both use the bfloat16 peak; on NVIDIA GPUs
# float32 uses TF32 tensor cores (JAX's default precision). Keys are matched as
# substrings of `device.device_kind`, longest first.
PEAK_TFLOPS = {
    "TPU v2": (22.5, 22.5),        # per core (a JAX device)
    "TPU v3": (61.5, 61.5),        # per core
    "TPU v4": (275.0, 275.0),
    "TPU v5 lite": (197.0, 197.0),  # v5e
    "TPU v5e": (197.0, 197.0),
    "TPU v5p": (459.0, 459.0),
    "TPU v5": (459.0, 459.0),       # v5p reports "TPU v5"
    "TPU v6 lite": (918.0, 918.0),  # v6e (Trillium)
    "TPU v6e": (918.0, 918.0),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
    "A100": (312.0, 156.0),
    "L4": (121.0, 60.0),
    "L40": (181.0, 90.5),
    "L40S": (362.0, 183.0),
    # The SXM parts (and GH200); the PCIe and NVL cards run at lower clocks.
    "H100 PCIe": (756.0, 378.0),
    "H100 NVL": (835.0, 418.0),
    "H100": (989.0, 494.0),
    "H200 NVL": (835.0, 418.0),
    "H200": (989.0, 494.0),
    "B200": (2250.0, 1100.0),
}


Count = TypeVar("Count", float, jax.Array)


def local_pairs(tokens: Count, window: int) -> Count:
  """(query, key) pairs of a sequence of `tokens` tokens whose queries see the
  keys at most `window` positions away (numbers or arrays of sizes)."""
  xp = jnp if isinstance(tokens, jax.Array) else np
  # n (2w + 1), less the keys past each end: w (w + 1) / 2 at each end of a
  # sequence of at least w tokens, n w - n (n - 1) / 2 of a shorter one.
  missing = xp.where(tokens >= window, window * (window + 1) / 2,
                     tokens * window - tokens * (tokens - 1) / 2)
  return tokens * (2 * window + 1) - 2 * missing


def work_flops(config: EncoderConfig, work: dict[str, Count], scale: float = 1.0,
               training: bool = True) -> Count:
  """`model_flops` of a work count (`row_work`, `bertjax.train.batch_work`),
  times `scale` (rows)."""
  return model_flops(config, scale * work["real_tokens"], scale * work["token_pairs"],
                     scale * work["predictions"], scale * work["nsp_pairs"], training,
                     scale * work["local_token_pairs"])


def model_flops(config: EncoderConfig, tokens: Count, token_pairs: Count, predictions: Count,
                nsp_sequences: Count, training: bool = True,
                local_token_pairs: Count | None = None) -> Count:
  """Model FLOPs of the useful work of a batch (numbers or device scalars).

  Args:
    config: The architecture.
    tokens: Real (non-padding) tokens.
    token_pairs: (query, key) pairs attended within each sequence: the sum of
      n^2 over its sequences of n tokens (n (n + 1) / 2 under a causal mask).
    predictions: Positions scored against the vocabulary (real masked ones).
    nsp_sequences: Sequences with a next-sentence prediction (pooler + head).
    training: Count the backward pass too (2x the forward).
    local_token_pairs: ModernBERT: the pairs its local layers attend
      (`local_pairs` of each sequence); default `token_pairs`.
  """
  hidden, inner, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
  # Query, key, value and output projections; the feed-forward (ModernBERT's
  # gated one has two input matrices).
  gated = family.of(config).gated_mlp
  per_token = 2 * 4 * hidden * hidden + 2 * (3 if gated else 2) * hidden * inner
  per_pair = 2 * 2 * hidden                # scores and weighted values, all heads
  global_layers = sum(config.is_global_layer(i) for i in range(config.num_layers))
  local_layers = config.num_layers - global_layers
  if local_token_pairs is None:
    local_token_pairs = token_pairs
  encoder = (config.num_layers * per_token * tokens + per_pair * (
      global_layers * token_pairs + local_layers * local_token_pairs))
  # BERT's MLM transform is the head's; ModernBERT's is its prediction head.
  mlm = predictions * (2 * hidden * hidden + 2 * hidden * vocab)
  pooler_nsp = nsp_sequences * (2 * hidden * hidden + 2 * hidden * 2)
  forward = encoder + mlm + pooler_nsp
  return 3 * forward if training else forward


def flops_per_token(config: EncoderConfig, seq_len: int, max_predictions: int,
                    training: bool = True) -> float:
  """Model FLOPs per token of a full row of `seq_len` tokens (one sequence,
  `max_predictions` masked, next-sentence prediction): the planning figure.

  Args:
    config: The architecture.
    seq_len: Tokens per sequence (attention cost grows with it).
    max_predictions: Masked positions per sequence scored by the MLM head.
    training: Count the backward pass too (2x the forward).
  """
  spec = family.of(config)
  window = spec.local_window(config)
  local = local_pairs(seq_len, window) if window is not None else None
  nsp = 1 if spec.next_sentence else 0
  return model_flops(config, seq_len, seq_len ** 2, max_predictions, nsp, training,
                     local) / seq_len


def row_work(objective: str, real_tokens: float, max_predictions: int,
             masked_lm_prob: float, window: int | None = None) -> dict[str, float]:
  """The useful work of a row holding one sequence of `real_tokens` tokens,
  as `bertjax.train.batch_work` counts a batch's (`model_flops`' arguments).

  Masked LM predicts `masked_lm_prob` of the tokens, rounded, at least one
  and at most `max_predictions` (the original's rule); left-to-right LM
  predicts each token's next one.

  Args:
    objective: "mlm_nsp", "mlm" or "ltr".
    real_tokens: Tokens of the sequence ([CLS] and [SEP] included).
    max_predictions: Prediction slots of a row.
    masked_lm_prob: The share of tokens masked.
    window: ModernBERT's local window (keys either side), for its local layers.
  """
  causal = objective == "ltr"
  if causal:
    predictions = max(real_tokens - 1, 0.0)
  else:
    predictions = min(max_predictions, max(1, round(real_tokens * masked_lm_prob)))
  pairs = real_tokens * (real_tokens + 1) / 2 if causal else real_tokens ** 2
  return {"real_tokens": real_tokens, "sequences": 1.0, "token_pairs": pairs,
          "local_token_pairs": pairs if window is None else float(local_pairs(real_tokens,
                                                                                window)),
          "predictions": float(predictions),
          "nsp_pairs": 1.0 if objective == "mlm_nsp" else 0.0}


def measure_matmul_tflops(dtype: str = "float32", size: int = 2048, repeats: int = 5,
                          min_seconds: float = 0.25) -> float:
  """The device's achieved TFLOP/s on a large square matmul (the CPU's 'peak'):
  the best of `repeats` timings, or of as many as `min_seconds` take."""
  device = jax.local_devices()[0]
  a = jax.device_put(jnp.ones((size, size), dtype), device)
  matmul = jax.jit(lambda x, y: x @ y)
  matmul(a, a).block_until_ready()
  best, began, timed = float("inf"), time.perf_counter(), 0
  while timed < repeats or time.perf_counter() - began < min_seconds:
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    best, timed = min(best, time.perf_counter() - start), timed + 1
  return 2 * size ** 3 / best / 1e12


def peak_tflops(dtype: str = "float32", device=None) -> tuple[float | None, str]:
  """(peak TFLOP/s per device, where the figure comes from) for `device` (default:
  the first local one).

  Accelerators take their dense peak from `PEAK_TFLOPS`; one not in it has no
  peak (None), so no MFU is reported rather than one against a guess. A CPU's
  "peak" is the best matmul rate measured on it (`cpu_peak_tflops`).
  """
  device = device or jax.local_devices()[0]
  kind = device.device_kind
  if device.platform == "cpu":
    return cpu_peak_tflops(dtype)
  for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
    if key in kind:
      bf16, f32 = PEAK_TFLOPS[key]
      return (f32 if dtype == "float32" else bf16), f"table: {key}"
  return None, f"{kind!r} is not in bertjax.flops.PEAK_TFLOPS: no MFU"


# A matmul timed while other processes kept this many cores busy is not the
# CPU's peak: it is not recorded.
QUIET_CORES = 0.1


def cpu_peak_tflops(dtype: str = "float32") -> tuple[float, str]:
  """(this CPU's peak TFLOP/s, where it comes from): the best matmul rate
  measured on it, now or by any earlier run.

  One measurement swings with whatever else the machine runs at that moment
  (a busy start would make every later MFU figure too high), so the best rate
  measured while other processes kept less than `QUIET_CORES` busy
  (`bertjax.cpu_load`) is kept in a record (`cpu_peak_record`) per CPU model,
  core count, JAX version and XLA_FLAGS, and a run measures again now and then
  (`bertjax.tasks.pretrain`): MFU is measured against what the machine does
  when it is quiet. A rate measured on a busy machine is not recorded; with
  no record it is this run's peak until a quiet one comes, and
  `quiet_cpu_peak` has none. Where `/proc` cannot tell how busy the machine
  is, every measurement counts as quiet. A record that cannot be read or
  written is left out.
  """
  before = cpu_load.sample()
  measured = measure_matmul_tflops(dtype)
  others = cpu_load.other_cores(before, cpu_load.sample())
  path, key = cpu_peak_record(), _cpu_key(dtype)
  recorded = _read_record(path).get(key, 0.0)
  if others is None or others < QUIET_CORES:
    if measured > recorded:
      _record(path, key, measured)
    if measured >= recorded:
      return measured, f"{dtype} matmul measured now on this CPU, its best so far"
    return recorded, (f"the best {dtype} matmul measured on this CPU, in {path}; "
                      f"{measured:.3f} now")
  busy = f"while other processes used {others:.1f} of its {cpu_load.cores()} cores"
  if recorded:
    return max(measured, recorded), (f"the best {dtype} matmul measured quiet on this CPU, "
                                     f"in {path}; {measured:.3f} now, {busy}")
  return measured, f"{dtype} matmul measured now {busy}, not recorded as its peak"


def quiet_cpu_peak(dtype: str = "float32") -> float | None:
  """This CPU's best matmul rate measured quiet (`cpu_peak_tflops`' record),
  or None where none was."""
  return _read_record(cpu_peak_record()).get(_cpu_key(dtype))


def cpu_peak_record() -> str:
  """Where the best CPU matmul rates are kept: `$XDG_CACHE_HOME/bertjax/cpu_peak.json`
  (`~/.cache/...` by default)."""
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "bertjax", "cpu_peak.json")


def _cpu_key(dtype: str) -> str:
  model = ""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), "")
  except OSError:
    pass
  model = model or platform.processor() or "cpu"
  return (f"{model} | {cpu_load.cores()} cores | {dtype} | jax {jax.__version__} | "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")


def _read_record(path: str) -> dict[str, float]:
  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return {}
  return {k: float(v) for k, v in record.items()
          if isinstance(v, (int, float))} if isinstance(record, dict) else {}


def _record(path: str, key: str, tflops: float) -> None:
  """Adds `key`'s rate to the record, atomically (a reader sees the old file or
  the new one); a record that cannot be written is left as it is."""
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {**_read_record(path), key: round(tflops, 4)}
    fd, staged = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".cpu_peak.")
    try:
      with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
      os.replace(staged, path)
    except BaseException:
      os.unlink(staged)
      raise
  except OSError as e:
    logging.info("Not recording the CPU's matmul rate in %s: %s", path, e)
