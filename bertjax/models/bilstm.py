"""The feature-based tagger of the paper's Table 7: frozen BERT activations of
each word, combined across layers, into a two-layer BiLSTM and a classifier."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import errors

Array = jax.Array

# How the stored layers become one vector per word (Table 7's rows):
# "select" takes the single stored layer (embeddings, second-to-last, last);
# "concat" concatenates them; "weighted_sum" mixes them with learned softmax
# weights and a scale (ELMo's scalar mix; the paper does not say which weights).
COMBINATIONS = ("select", "concat", "weighted_sum")


class LayerCombination(nn.Module):
  combination: str

  @nn.compact
  def __call__(self, layers: Array) -> Array:
    """[batch, words, layers, hidden] -> [batch, words, features]."""
    if self.combination == "select":
      return layers[..., 0, :]
    if self.combination == "concat":
      return layers.reshape(*layers.shape[:-2], -1)
    if self.combination == "weighted_sum":
      logits = self.param("layer_logits", nn.initializers.zeros, (layers.shape[-2],))
      scale = self.param("scale", nn.initializers.ones, ())
      weights = jax.nn.softmax(logits)  # [layers]
      return scale * jnp.einsum("...lh,l->...h", layers, weights)
    raise errors.UsageError(f"combination must be one of {COMBINATIONS}, got {self.combination!r}")


class BiLSTMTagger(nn.Module):
  """Combined layers -> `num_layers` BiLSTM layers -> a label per word.

  Attributes:
    num_labels: Tags.
    combination: How stored layers combine (see `COMBINATIONS`).
    hidden_size: Units of each direction's LSTM (the paper: 768).
    num_layers: Stacked BiLSTMs (the paper: 2).
    dropout_rate: Dropout on the LSTM inputs and outputs.
  """

  num_labels: int
  combination: str = "concat"
  hidden_size: int = 768
  num_layers: int = 2
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, layers: Array, mask: Array, deterministic: bool = True) -> Array:
    """Per-word logits [batch, words, num_labels].

    Args:
      layers: [batch, words, stored layers, hidden] frozen activations.
      mask: [batch, words], 1 for real words.
      deterministic: No dropout.
    """
    x = LayerCombination(self.combination)(layers.astype(jnp.float32))
    lengths = mask.sum(-1).astype(jnp.int32)  # [batch]
    for _ in range(self.num_layers):
      x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
      x = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(self.hidden_size)),
                           nn.RNN(nn.OptimizedLSTMCell(self.hidden_size)))(
                               x, seq_lengths=lengths)  # [batch, words, 2 * hidden]
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    return nn.Dense(self.num_labels)(x)
