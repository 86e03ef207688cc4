"""Model FLOPs against XLA's own count of the compiled computation."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import flops
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


def test_peak_comes_from_the_table_or_a_measurement():
  peak, source = flops.peak_tflops("float32")
  assert peak > 0
  assert source.startswith("measured float32 matmul on cpu")
  assert flops.PEAK_TFLOPS["TPU v4"] == (275.0, 275.0)


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
