"""Model FLOPs against XLA's own count of the compiled computation."""

import json
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import cpu_load, flops
from bertjax.models import EncoderConfig, BertForPreTraining, init_params


@pytest.mark.parametrize("layers,hidden,heads,length,predictions", [
    (2, 128, 2, 64, 10), (1, 256, 4, 128, 20)])
def test_flops_per_token_matches_xla_cost_analysis(layers, hidden, heads, length,
                                                   predictions):
  config = EncoderConfig(vocab_size=1000, hidden_size=hidden, num_layers=layers,
                      num_heads=heads, intermediate_size=4 * hidden)
  model = BertForPreTraining(config)
  params = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
  batch = 2
  ids = jnp.ones((batch, length), jnp.int32)
  positions = jnp.zeros((batch, predictions), jnp.int32)

  def loss(p):
    out = model.apply({"params": p}, ids, ids, ids * 0, positions)
    return out["mlm_logits"].sum() + out["nsp_logits"].sum()

  forward = jax.jit(loss).lower(params).compile().cost_analysis()["flops"] / (batch * length)
  training = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()["flops"] / (
      batch * length)
  # XLA also counts elementwise work (softmax, GELU, LayerNorm): a few % more.
  ours_forward = flops.flops_per_token(config, length, predictions, training=False)
  ours_training = flops.flops_per_token(config, length, predictions)
  assert 0.88 * forward < ours_forward <= forward
  assert 0.88 * training < ours_training <= training


def test_peak_comes_from_the_table_or_a_measurement(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  monkeypatch.setattr(cpu_load, "other_cores", lambda before, after: 0.0)  # a quiet machine
  peak, source = flops.peak_tflops("float32")
  assert peak > 0
  assert source == "float32 matmul measured now on this CPU, its best so far"
  assert flops.PEAK_TFLOPS["TPU v4"] == (275.0, 275.0)


def test_a_cpus_peak_is_its_best_rate_measured_kept_between_runs(monkeypatch, tmp_path):
  """A start on a busy machine measures a low rate: the best rate recorded on
  this CPU stays the peak, so MFU does not swing with the load at the start."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  record = tmp_path / "bertjax" / "cpu_peak.json"
  rates = iter([0.5, 0.2, 0.7])
  monkeypatch.setattr(flops, "measure_matmul_tflops", lambda dtype: next(rates))
  assert flops.cpu_peak_tflops("float32")[0] == 0.5  # first run: measured, recorded
  (key, value), = json.loads(record.read_text()).items()
  assert value == 0.5 and "cores | float32 | jax " in key
  peak, source = flops.cpu_peak_tflops("float32")  # busy: 0.2 now
  assert peak == 0.5 and source == (
      f"the best float32 matmul measured on this CPU, in {record}; 0.200 now")
  assert flops.cpu_peak_tflops("float32")[0] == 0.7  # quieter than ever: the new best
  assert json.loads(record.read_text()) == {key: 0.7}
  # Another dtype, XLA_FLAGS or core count is another CPU for the record.
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  monkeypatch.setattr(flops, "measure_matmul_tflops", lambda dtype: 0.1)
  assert flops.cpu_peak_tflops("float32")[0] == 0.1
  assert len(json.loads(record.read_text())) == 2


def test_a_record_that_cannot_be_read_or_written_is_left_out(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  monkeypatch.setattr(flops, "measure_matmul_tflops", lambda dtype: 0.3)
  record = tmp_path / "bertjax" / "cpu_peak.json"
  record.parent.mkdir()
  record.write_text('{"cut short by a full di')
  assert flops.cpu_peak_tflops("float32")[0] == 0.3
  assert list(json.loads(record.read_text()).values()) == [0.3]  # written whole again
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a file"))
  (tmp_path / "a file").write_text("")
  assert flops.cpu_peak_tflops("float32")[0] == 0.3  # nowhere to record: measured alone


# Spins outside this process's tree (its launcher exits at once) until a file
# says stop; another file says it has started.
_SPIN = """import os, sys, time
open(sys.argv[1], "w").close()
end = time.time() + 120
while not os.path.exists(sys.argv[2]) and time.time() < end:
  pass
"""
_LAUNCH = "import subprocess, sys\nsubprocess.Popen([sys.executable, *sys.argv[1:]])\n"


def test_a_peak_measured_beside_a_busy_process_is_not_recorded(monkeypatch, tmp_path):
  """A fresh machine (no record) whose other core a process keeps busy: the
  rate measured is this run's figure for now, said to be measured busy, and
  neither recorded nor a quiet peak to expect rates from."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  spin, started, stop = tmp_path / "spin.py", tmp_path / "started", tmp_path / "stop"
  spin.write_text(_SPIN)
  subprocess.run([sys.executable, "-c", _LAUNCH, str(spin), str(started), str(stop)],
                 check=True)
  try:
    while not started.exists():
      time.sleep(0.05)
    peak, source = flops.cpu_peak_tflops("float32")
    record = tmp_path / "cache" / "bertjax" / "cpu_peak.json"
    assert not record.exists() and flops.quiet_cpu_peak("float32") is None
    # With a quiet peak recorded (say, of a day the machine was quiet), a
    # busy start keeps that, and leaves the record as it is.
    flops._record(str(record), flops._cpu_key("float32"), 100.0)
    kept, kept_source = flops.cpu_peak_tflops("float32")
  finally:
    stop.touch()
  assert peak > 0
  assert source.startswith("float32 matmul measured now while other processes used "), source
  assert source.endswith(f" of its {cpu_load.cores()} cores, not recorded as its peak")
  assert float(source.split(" used ")[1].split()[0]) >= flops.QUIET_CORES
  assert kept == 100.0 and kept_source.startswith(
      f"the best float32 matmul measured quiet on this CPU, in {record}; "), kept_source
  assert flops.quiet_cpu_peak("float32") == 100.0


class _Device:
  """What `peak_tflops` reads of a JAX device."""

  def __init__(self, platform, device_kind):
    self.platform, self.device_kind = platform, device_kind


@pytest.mark.parametrize("kind,bf16", [
    ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0)])
def test_gpus_are_told_apart(kind, bf16):
  peak, source = flops.peak_tflops("bfloat16", _Device("gpu", kind))
  assert peak == bf16, source


def test_an_accelerator_missing_from_the_table_has_no_peak():
  peak, source = flops.peak_tflops("bfloat16", _Device("gpu", "NVIDIA Hypothetical X9"))
  assert peak is None and "not in bertjax.flops.PEAK_TFLOPS" in source


def test_model_flops_count_the_attention_of_each_sequence_alone():
  """A row packing sequences of 50, 40 and 38 tokens attends over 50^2 + 40^2
  + 38^2 pairs, not 128^2; padding adds nothing."""
  config = EncoderConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=2,
                      intermediate_size=256)
  full = flops.model_flops(config, 128, 128 ** 2, 20, 1)
  packed = flops.model_flops(config, 128, 50 ** 2 + 40 ** 2 + 38 ** 2, 20, 3)
  per_pair = 3 * 2 * 2 * 2 * 64  # training x layers x (scores, values) x multiply-add x H
  per_nsp = 3 * (2 * 64 * 64 + 2 * 64 * 2)
  assert full - packed == (128 ** 2 - (50 ** 2 + 40 ** 2 + 38 ** 2)) * per_pair - 2 * per_nsp
  assert flops.flops_per_token(config, 128, 20) == full / 128


@pytest.mark.parametrize("tokens", [1, 5, 64, 65, 129, 300])
def test_local_pairs_count_the_band(tokens):
  window = 64
  index = np.arange(tokens)
  brute = int((np.abs(index[:, None] - index[None]) <= window).sum())
  assert flops.local_pairs(tokens, window) == brute
  assert float(flops.local_pairs(jnp.asarray(float(tokens)), window)) == brute


def test_modernbert_flops_count_its_gated_feed_forward_and_local_layers():
  """Per layer: 4 H^2 projections, 3 H I (GeGLU), 2 H per attended pair;
  global layers attend every pair, local ones their band."""
  from bertjax.models import EncoderConfig

  config = EncoderConfig.from_preset("modernbert_base", num_layers=4)  # layers 0 and 3 global
  hidden, inner, vocab = 768, 1152, 50368
  tokens, predictions, window = 1024, 308, 64
  pairs, local = tokens ** 2, flops.local_pairs(tokens, window)
  expected = (4 * tokens * 2 * (4 * hidden ** 2 + 3 * hidden * inner)
              + 4 * hidden * (2 * pairs + 2 * local)
              + predictions * 2 * (hidden ** 2 + hidden * vocab))
  got = flops.model_flops(config, tokens, pairs, predictions, 0, training=False,
                          local_token_pairs=local)
  assert got == pytest.approx(expected, rel=1e-12)
  per_token = flops.flops_per_token(config, tokens, predictions, training=False)
  assert per_token * tokens == pytest.approx(expected, rel=1e-12)
