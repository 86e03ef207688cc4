"""Model FLOPs against XLA's own count of the compiled computation."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from bertjax import flops
from bertjax.models import BertConfig, BertForPreTraining, init_params


@pytest.mark.parametrize("layers,hidden,heads,length,predictions", [
    (2, 128, 2, 64, 10), (1, 256, 4, 128, 20)])
def test_flops_per_token_matches_xla_cost_analysis(layers, hidden, heads, length,
                                                   predictions):
  config = BertConfig(vocab_size=1000, hidden_size=hidden, num_layers=layers,
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
