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

from bertjax.models import attention, family
from bertjax.models.config import EncoderConfig
from bertjax.models.rotary import Rotary

Array = jax.Array

# Logical names of the activations.
BATCH_LENGTH_EMBED = ("batch", "length", "embed")
BATCH_LENGTH_MLP = ("batch", "length", "mlp")
BATCH_LENGTH_HEADS_KV = ("batch", "length", "heads", "kv")


def activation(name: str) -> Callable[[Array], Array]:
  """The feed-forward activation named in `EncoderConfig.hidden_act`."""
  return {
      # Both GELUs are recomputed in the backward pass from their input (kept
      # anyway): differentiated as they are, they keep their intermediate terms
      # ([batch, length, intermediate] each) as temporaries a chip
      # (`bertjax.tools.compile` reports them).
      "gelu": jax.checkpoint(functools.partial(jax.nn.gelu, approximate=False)),
      "gelu_tanh": jax.checkpoint(functools.partial(jax.nn.gelu, approximate=True)),
      "relu": jax.nn.relu,
      "silu": jax.nn.silu,
  }[name]


def kernel_init(config: EncoderConfig, axes: tuple[str, ...],
                stddev: float | None = None) -> nn.initializers.Initializer:
  """Truncated normal (at two standard deviations), `config.initializer_range`
  unless `stddev` is given."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(stddev or config.initializer_range), axes)


def zeros_init(axes: tuple[str, ...]) -> nn.initializers.Initializer:
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def matmul(x: Array, kernel: Array, contracting: int = 1,
           preferred_element_type: jnp.dtype | None = None) -> Array:
  """x[..., *in] @ kernel[*in, *out] -> [..., *out], x's leading axes as one.

  The rows are x's leading axes, flattened: XLA's CPU matmuls, and the weight
  gradient above all, are fastest with one row axis (contracting the batch
  and length axes of a 3-D input at once runs ~2x slower), and merging leading
  axes is free everywhere. `in` and `out` stay as they are: on TPU, merging
  [heads, kv] into one axis changes how they tile (kv=64 is half a tile's 128
  lanes), so XLA would copy the kernel, its gradient and the activations at
  every projection; kept apart, the product comes out laid out as the next
  operation (the attention kernel) reads it.

  Args:
    x: [..., *in] input.
    kernel: [*in, *out] weights.
    contracting: How many trailing axes of `x` (leading of `kernel`) are summed.
    preferred_element_type: The product's dtype (default: the operands').

  Returns:
    [..., *out].
  """
  inner = x.shape[x.ndim - contracting:]
  assert inner == kernel.shape[:contracting], (x.shape, kernel.shape)
  rows = x.reshape(-1, *inner)
  dims = ((tuple(range(1, contracting + 1)), tuple(range(contracting))), ((), ()))
  out = jax.lax.dot_general(rows, kernel, dims, preferred_element_type=preferred_element_type)
  return out.reshape(*x.shape[:x.ndim - contracting], *kernel.shape[contracting:])


class Dense(nn.Module):
  """A dense layer: float32 kernel `kernel_shape` (logical `axes`) and bias
  (its output axes), computed in `config.dtype` as one matmul (`matmul`).

  Attributes:
    config: The architecture (compute dtype, initializer).
    kernel_shape: [*in, *out] of the kernel.
    axes: Logical names of the kernel's axes; the bias takes those of `out`.
    contracting: Leading axes of the kernel that are input axes.
    use_bias: Whether the layer has a bias (ModernBERT's have none).
    stddev: The kernel initializer's standard deviation (default
      `config.initializer_range`).
  """

  config: EncoderConfig
  kernel_shape: tuple[int, ...]
  axes: tuple[str | None, ...]
  contracting: int = 1
  use_bias: bool = True
  stddev: float | None = None

  @nn.compact
  def __call__(self, x: Array | None) -> Array | tuple[Array, Array | None]:
    """Applies the layer to `x`; with None, returns its float32 (kernel, bias)."""
    kernel = self.param("kernel", kernel_init(self.config, self.axes, self.stddev),
                        self.kernel_shape, jnp.float32)
    bias = None
    if self.use_bias:
      bias = self.param("bias", zeros_init(self.axes[self.contracting:]),
                        self.kernel_shape[self.contracting:], jnp.float32)
    if x is None:
      return kernel, bias
    dtype = jnp.dtype(self.config.dtype)
    out = matmul(x.astype(dtype), kernel.astype(dtype), self.contracting)
    return out if bias is None else out + bias.astype(dtype)


def dense(config: EncoderConfig, in_features: int, features: int, axes: tuple[str, str],
          name: str) -> Dense:
  """A [in_features, features] dense layer with logically named kernel axes."""
  return Dense(config, (in_features, features), axes, name=name)


def layer_norm(config: EncoderConfig, name: str) -> nn.LayerNorm:
  """A float32 LayerNorm over `embed` (with a bias where the family's have one)."""
  # One-pass statistics, E[x^2] - E[x]^2: both sums reduce in one fusion that
  # reads the row once, where the two-pass form (the reference's) reads it
  # again for each LayerNorm of the forward and backward pass. Its precision
  # falls as the mean grows against the spread; in these hidden states the
  # mean stays within the spread, and a real checkpoint's outputs agree with
  # transformers' to 1e-5 (tests/interop/test_real_checkpoint.py). Sums taken
  # around a value of the row, which keep the two-pass precision, cost more
  # on TPU than the two-pass form (their slice of the row breaks the fusion).
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps,
      dtype=jnp.float32,
      param_dtype=jnp.float32,
      use_bias=family.of(config).norm_bias,
      use_fast_variance=True,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      bias_init=zeros_init(("embed",)),
      name=name,
  )


class EmbeddingTable(nn.Module):
  """A [rows, embed] float32 table looked up by id.

  The lookup reads the whole table (all-gathered where FSDP shards it), so the
  gathered rows come out sharded like the batch.
  """

  config: EncoderConfig
  rows: int
  axes: tuple[str | None, str]

  def setup(self):
    self.embedding = self.param("embedding", kernel_init(self.config, self.axes),
                                (self.rows, self.config.hidden_size), jnp.float32)

  def __call__(self, ids: Array) -> Array:
    table = nn.with_logical_constraint(self.embedding, (None, None))
    return jnp.take(table, ids, axis=0)


class Embeddings(nn.Module):
  """Word + position + token type embeddings, LayerNorm, dropout; a family
  with rotary positions has no position table, one without token types no
  token type table."""

  config: EncoderConfig

  def setup(self):
    config = self.config

    def table(rows: int, axes: tuple[str | None, str], name: str) -> EmbeddingTable:
      return EmbeddingTable(config, rows, axes, name=name)

    spec = family.of(config)
    self.word_embeddings = table(config.embedding_rows, ("vocab", "embed"), "word_embeddings")
    if not spec.rotary:
      self.position_embeddings = table(config.max_position_embeddings, (None, "embed"),
                                       "position_embeddings")
    if spec.token_types:
      self.token_type_embeddings = table(config.type_vocab_size, (None, "embed"),
                                         "token_type_embeddings")
    self.layer_norm = layer_norm(config, "layer_norm")
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def __call__(self, input_ids: Array, token_type_ids: Array, position_ids: Array,
               deterministic: bool) -> Array:
    """Embeds [batch, length] ids into [batch, length, embed] (the stream's dtype)."""
    spec = family.of(self.config)
    x = self.word_embeddings(input_ids)
    if not spec.rotary:
      x = x + self.position_embeddings(position_ids)
    if spec.token_types:
      x = x + self.token_type_embeddings(token_type_ids)
    x = self.layer_norm(x)
    x = self.dropout(x, deterministic=deterministic)
    x = x.astype(self.config.stream_dtype)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)

  def attend(self, query: Array) -> Array:
    """Scores [..., embed] against every word: float32 [..., vocab_size] (the
    table's padding rows are scored by the matmul and cut off)."""
    table = self.word_embeddings.embedding.astype(self.config.dtype)  # [rows, embed]
    rows = query.reshape(-1, query.shape[-1]).astype(self.config.dtype)  # as in `matmul`
    scores = jax.lax.dot_general(rows, table, (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)
    scores = scores.reshape(*query.shape[:-1], table.shape[0])
    return scores[..., :self.config.vocab_size]


class SelfAttention(nn.Module):
  """Multi-head self-attention over the keys `segments` allows (with
  `config.causal`, only those at or before each query; with `window`, only
  those at most `window` positions away).

  Attributes:
    config: The architecture.
    window: Keys at most this many positions either side (local attention),
      or None for all.
  """

  config: EncoderConfig
  window: int | None = None

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, deterministic: bool,
               rotary: Rotary | None = None) -> Array:
    """Maps [batch, length, embed] to [batch, length, embed].

    Args:
      x: The layer's input.
      segments: Which keys each query sees.
      deterministic: No attention dropout.
      rotary: Rotary position embeddings to apply to queries and keys.
    """
    query, key, value = self.project(x)  # each [batch, length, heads, kv]
    if rotary is not None:
      query, key = rotary.apply(query), rotary.apply(key)
    context = self.attend(query, key, value, segments, deterministic)
    return self.project_out(context)

  def project(self, x: Array) -> tuple[Array, Array, Array]:
    """Queries, keys and values of [batch, length, embed]: [batch, length, heads, kv] each."""
    config = self.config
    heads, kv, embed = config.num_heads, config.head_dim, config.hidden_size
    return tuple(
        nn.with_logical_constraint(
            Dense(config, (embed, heads, kv), ("embed", "heads", "kv"), name=name)(x),
            BATCH_LENGTH_HEADS_KV)
        for name in ("query", "key", "value"))

  def project_out(self, context: Array) -> Array:
    """[batch, length, heads, kv] -> [batch, length, embed]."""
    config = self.config
    return Dense(config, (config.num_heads, config.head_dim, config.hidden_size),
                 ("heads", "kv", "embed"), contracting=2, name="output")(context)

  def attend(self, query: Array, key: Array, value: Array, segments: attention.Segments,
             deterministic: bool) -> Array:
    """The attention context, [batch, length, heads, kv], by the kernel the
    config and the call allow (`attention.choose`)."""
    config = self.config
    dropout = not deterministic and config.attention_dropout_prob > 0
    kernel_name = attention.choose(config.attention_impl, length=query.shape[1],
                                   head_dim=config.head_dim, dtype=config.dtype,
                                   dropout=dropout, packed=segments.packed,
                                   local=self.window is not None)
    if kernel_name == "xla":
      context = self._xla_attention(query, key, value, segments, deterministic)
    else:
      context = attention.fused(kernel_name, query, key, value, segments, config.causal,
                                self.window)
    return nn.with_logical_constraint(context, BATCH_LENGTH_HEADS_KV)

  def _xla_attention(self, query: Array, key: Array, value: Array,
                     segments: attention.Segments, deterministic: bool) -> Array:
    config = self.config
    query = query * jnp.asarray(config.head_dim ** -0.5, query.dtype)
    # [batch, heads, q, k], float32 so the softmax is exact in bfloat16 runs.
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32)
    scores = jnp.where(segments.mask(config.causal, self.window), scores,
                       jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = nn.Dropout(config.attention_dropout_prob)(probs, deterministic=deterministic)
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(value.dtype), value)


class TransformerLayer(nn.Module):
  """A post-LayerNorm transformer layer, as in the paper."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, deterministic: bool) -> Array:
    """Maps [batch, length, embed] to [batch, length, embed]."""
    config = self.config
    dropout = nn.Dropout(config.hidden_dropout_prob)

    attended = SelfAttention(config, name="attention")(x, segments, deterministic)
    attended = dropout(attended, deterministic=deterministic)
    x = layer_norm(config, "attention_layer_norm")(
        x.astype(jnp.float32) + attended.astype(jnp.float32)).astype(config.stream_dtype)
    x = nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)

    hidden = dense(config, config.hidden_size, config.intermediate_size, ("embed", "mlp"),
                   "intermediate")(x)
    hidden = activation(config.hidden_act)(hidden)
    hidden = nn.with_logical_constraint(hidden, BATCH_LENGTH_MLP)
    hidden = dense(config, config.intermediate_size, config.hidden_size, ("mlp", "embed"),
                   "output")(hidden)
    hidden = dropout(hidden, deterministic=deterministic)
    x = layer_norm(config, "output_layer_norm")(
        x.astype(jnp.float32) + hidden.astype(jnp.float32)).astype(config.stream_dtype)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)
