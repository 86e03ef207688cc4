"""Output layers on top of the encoder: the masked LM head and linear heads.

All heads return float32 logits, whatever the compute dtype, so that losses and
softmaxes are computed in float32.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import family
from bertjax.models.config import EncoderConfig
from bertjax.models.layers import activation, dense, kernel_init, layer_norm, matmul, zeros_init

Array = jax.Array


def gather_positions(sequence: Array, positions: Array) -> Array:
  """Picks [batch, predictions, embed] out of [batch, length, embed]."""
  return jnp.take_along_axis(sequence, positions[..., None], axis=1)


@jax.custom_vjp
def add_bias(x: Array, bias: Array) -> Array:
  """x [..., n] + bias [n] (float32), whose gradient sums x's rows as a
  matrix-vector product: XLA's CPU reduction over the leading axes of the
  [positions, vocab] MLM logits runs many times slower than the product; on
  accelerators both are cheap."""
  return x + bias


def _add_bias_forward(x, bias):
  return x + bias, None


def _add_bias_backward(_, grad):
  rows = grad.reshape(-1, grad.shape[-1])
  return grad, jnp.dot(jnp.ones(rows.shape[0], grad.dtype), rows)


add_bias.defvjp(_add_bias_forward, _add_bias_backward)


class MaskedLMHead(nn.Module):
  """Dense + activation + LayerNorm transform, then the tied word embeddings.

  ModernBERT's transform is the encoder's prediction head, applied before
  (`bertjax.models.bert.token_features`); its masked LM head is the decoder's
  bias alone.

  In training it is applied to the gathered masked positions only ([batch,
  max_predictions, embed]): the vocabulary projection is the most expensive
  matmul of a small BERT. Task models score every position only when asked to
  (`masked_positions=None`).
  """

  config: EncoderConfig

  @nn.compact
  def __call__(self, hidden: Array, decode: Callable[[Array], Array]) -> Array:
    """Maps [..., embed] to float32 [..., vocab] logits.

    Args:
      hidden: Encoder outputs at the positions to predict.
      decode: Scores [..., embed] against the word embedding table (the encoder's
        `attend`), which the decoder shares as in the paper.
    """
    config = self.config
    x = hidden
    if family.of(config).mlm_transform:
      x = dense(config, config.hidden_size, config.hidden_size, ("embed", "mlp"),
                "transform")(x)
      x = activation(config.hidden_act)(x)
      x = layer_norm(config, "transform_layer_norm")(x.astype(jnp.float32))
    # Replicated (30,522 floats): `vocab_size` need not divide over a mesh axis
    # as the padded table's rows do.
    bias = self.param("bias", zeros_init((None,)), (config.vocab_size,), jnp.float32)
    return add_bias(decode(x.astype(config.dtype)), bias)


class OutputLayer(nn.Module):
  """Dropout then one linear layer: the paper's fine-tuning output layer.

  Serves next-sentence prediction (on the pooled [CLS], no dropout),
  classification and regression (pooled), multiple choice (pooled, one score
  per choice), span start/end (every position, no dropout) and token
  classification (every position).
  """

  config: EncoderConfig
  features: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    """Maps [..., embed] to float32 [..., features]."""
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    stddev = x.shape[-1] ** -0.5 if family.of(self.config).classifier_fan_in else None
    kernel = self.param("kernel", kernel_init(self.config, ("embed", None), stddev),
                        (x.shape[-1], self.features), jnp.float32)
    bias = self.param("bias", zeros_init((None,)), (self.features,), jnp.float32)
    dtype = jnp.dtype(self.config.dtype)
    logits = matmul(x.astype(dtype), kernel.astype(dtype),
                    preferred_element_type=jnp.float32)
    return logits + bias
