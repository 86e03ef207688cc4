"""The building blocks of the BERT encoder: embeddings, attention, one layer.

Every parameter carries logical axis names (`vocab`, `embed`, `mlp`, `heads`,
`kv`) and the main activations are constrained to (`batch`, `length`, ...); a
rules table in the training config maps them onto the device mesh. Square
hidden-to-hidden kernels are named (`embed`, `mlp`) so that their two dimensions
never land on the same mesh axis.

Numerics: matmuls run in `config.dtype`; parameters, attention softmax,
LayerNorm and the residual additions stay float32.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.config import BertConfig

Array = jax.Array

# Logical names of the activations.
BATCH_LENGTH_EMBED = ("batch", "length", "embed")
BATCH_LENGTH_MLP = ("batch", "length", "mlp")
BATCH_LENGTH_HEADS_KV = ("batch", "length", "heads", "kv")


def activation(name: str) -> Callable[[Array], Array]:
  """The feed-forward activation named in `BertConfig.hidden_act`."""
  return {
      # Both GELUs are recomputed in the backward pass from their input (kept
      # anyway): differentiated as they are, they keep their intermediate terms
      # ([batch, length, intermediate] each), which for BERT-base at 16 x 128 a
      # chip is 288 MiB (exact) and 576 MiB (tanh) more (`bertjax.tools.compile`).
      "gelu": jax.checkpoint(functools.partial(jax.nn.gelu, approximate=False)),
      "gelu_tanh": jax.checkpoint(functools.partial(jax.nn.gelu, approximate=True)),
      "relu": jax.nn.relu,
      "silu": jax.nn.silu,
  }[name]


def kernel_init(config: BertConfig, axes: tuple[str, ...]) -> nn.initializers.Initializer:
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(config.initializer_range), axes)


def zeros_init(axes: tuple[str, ...]) -> nn.initializers.Initializer:
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dense(config: BertConfig, features: int, axes: tuple[str, str], name: str) -> nn.Dense:
  """A Dense layer with logically named kernel (`axes`) and bias (`axes[1]`)."""
  return nn.Dense(
      features,
      dtype=jnp.dtype(config.dtype),
      param_dtype=jnp.float32,
      kernel_init=kernel_init(config, axes),
      bias_init=zeros_init(axes[1:]),
      name=name,
  )


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  # Two-pass variance, as in the reference implementations: with eps=1e-12 the
  # one-pass E[x^2]-E[x]^2 form loses precision.
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps,
      dtype=jnp.float32,
      param_dtype=jnp.float32,
      use_fast_variance=False,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      bias_init=zeros_init(("embed",)),
      name=name,
  )


class EmbeddingTable(nn.Module):
  """A [rows, embed] float32 table looked up by id.

  The lookup reads the whole table (all-gathered where FSDP shards it), so the
  gathered rows come out sharded like the batch.
  """

  config: BertConfig
  rows: int
  axes: tuple[str | None, str]

  def setup(self):
    self.embedding = self.param("embedding", kernel_init(self.config, self.axes),
                                (self.rows, self.config.hidden_size), jnp.float32)

  def __call__(self, ids: Array) -> Array:
    table = nn.with_logical_constraint(self.embedding, (None, None))
    return jnp.take(table, ids, axis=0)


class Embeddings(nn.Module):
  """Word + position + token type embeddings, LayerNorm, dropout."""

  config: BertConfig

  def setup(self):
    config = self.config

    def table(rows: int, axes: tuple[str | None, str], name: str) -> EmbeddingTable:
      return EmbeddingTable(config, rows, axes, name=name)

    self.word_embeddings = table(config.vocab_size, ("vocab", "embed"), "word_embeddings")
    self.position_embeddings = table(config.max_position_embeddings, (None, "embed"),
                                     "position_embeddings")
    self.token_type_embeddings = table(config.type_vocab_size, (None, "embed"),
                                       "token_type_embeddings")
    self.layer_norm = layer_norm(config, "layer_norm")
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def __call__(self, input_ids: Array, token_type_ids: Array, position_ids: Array,
               deterministic: bool) -> Array:
    """Embeds [batch, length] ids into [batch, length, embed] (compute dtype)."""
    x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
         + self.token_type_embeddings(token_type_ids))
    x = self.layer_norm(x)
    x = self.dropout(x, deterministic=deterministic)
    x = x.astype(self.config.dtype)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)

  def attend(self, query: Array) -> Array:
    """Scores [..., embed] against every word embedding: float32 [..., vocab]."""
    table = self.word_embeddings.embedding.astype(self.config.dtype)
    return jnp.einsum("...e,ve->...v", query.astype(self.config.dtype), table,
                      preferred_element_type=jnp.float32)


def padding_mask(attention_mask: Array) -> Array:
  """[batch, length] 1/0 -> boolean [batch, 1, 1, length]: which keys to attend to."""
  return attention_mask[:, None, None, :].astype(bool)


class EinsumDense(nn.Module):
  """A dense layer over several input or output axes (the attention projections).

  Flax's DenseGeneral initialises a flattened kernel, which logical-axis
  constraints of the unflattened one reject; this one initialises it whole.
  """

  config: BertConfig
  equation: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str, ...]

  @nn.compact
  def __call__(self, x: Array) -> Array:
    dtype = jnp.dtype(self.config.dtype)
    kernel = self.param("kernel", kernel_init(self.config, self.kernel_axes),
                        self.kernel_shape, jnp.float32)
    bias = self.param("bias", zeros_init(self.bias_axes), self.bias_shape, jnp.float32)
    return jnp.einsum(self.equation, x.astype(dtype), kernel.astype(dtype)) + bias.astype(dtype)


class SelfAttention(nn.Module):
  """Multi-head self-attention over the keys a [batch, 1, 1, k] mask allows
  (and, with `config.causal`, only the keys at or before each query)."""

  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    config = self.config
    heads, kv, embed = config.num_heads, config.head_dim, config.hidden_size

    def project(name: str) -> Array:  # [batch, length, heads, kv]
      projected = EinsumDense(config, "bte,ehd->bthd", (embed, heads, kv),
                              ("embed", "heads", "kv"), (heads, kv), ("heads", "kv"),
                              name=name)(x)
      return nn.with_logical_constraint(projected, BATCH_LENGTH_HEADS_KV)

    query, key, value = project("query"), project("key"), project("value")
    if config.attention_impl == "xla":
      context = self._xla_attention(query, key, value, mask, deterministic)
    else:
      if not deterministic and config.attention_dropout_prob > 0:
        raise ValueError(
            f"BertConfig.attention_impl={config.attention_impl!r} has no attention "
            f"dropout, but attention_dropout_prob={config.attention_dropout_prob}: set "
            "attention_dropout_prob=0.0 or attention_impl='xla' for training.")
      context = jax.nn.dot_product_attention(
          query, key, value, mask=mask, is_causal=config.causal,
          implementation="cudnn" if config.attention_impl == "cudnn" else "xla")
    context = nn.with_logical_constraint(context, BATCH_LENGTH_HEADS_KV)
    return EinsumDense(config, "bthd,hde->bte", (heads, kv, embed), ("heads", "kv", "embed"),
                       (embed,), ("embed",), name="output")(context)

  def _xla_attention(self, query: Array, key: Array, value: Array, mask: Array,
                     deterministic: bool) -> Array:
    config = self.config
    query = query * jnp.asarray(config.head_dim ** -0.5, query.dtype)
    # [batch, heads, q, k], float32 so the softmax is exact in bfloat16 runs.
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32)
    if config.causal:
      length = query.shape[1]
      mask = mask & jnp.tril(jnp.ones((length, length), bool))
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = nn.Dropout(config.attention_dropout_prob)(probs, deterministic=deterministic)
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(value.dtype), value)


class TransformerLayer(nn.Module):
  """A post-LayerNorm transformer layer, as in the paper."""

  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    """Maps [batch, length, embed] to [batch, length, embed]."""
    config = self.config
    dropout = nn.Dropout(config.hidden_dropout_prob)

    attended = SelfAttention(config, name="attention")(x, mask, deterministic)
    attended = dropout(attended, deterministic=deterministic)
    x = layer_norm(config, "attention_layer_norm")(
        x.astype(jnp.float32) + attended.astype(jnp.float32)).astype(config.dtype)
    x = nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)

    hidden = dense(config, config.intermediate_size, ("embed", "mlp"), "intermediate")(x)
    hidden = activation(config.hidden_act)(hidden)
    hidden = nn.with_logical_constraint(hidden, BATCH_LENGTH_MLP)
    hidden = dense(config, config.hidden_size, ("mlp", "embed"), "output")(hidden)
    hidden = dropout(hidden, deterministic=deterministic)
    x = layer_norm(config, "output_layer_norm")(
        x.astype(jnp.float32) + hidden.astype(jnp.float32)).astype(config.dtype)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)
