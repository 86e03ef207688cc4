"""The ModernBERT encoder (Warner et al., 2024): BERT's descendant, beside it.

What differs from the paper's layer (`bertjax.models.layers.TransformerLayer`):
- positions are rotary (`bertjax.models.rotary`), with one base for global
  and one for local layers; no learned positions, no token types;
- pre-normalisation: LayerNorm before attention and before the feed-forward
  (none before the first layer's attention, whose input is the embeddings'
  LayerNorm), and a final LayerNorm after the last layer;
- no biases in linears and LayerNorms (the masked-LM decoder keeps its bias);
- a gated feed-forward, GeGLU: `act(x W_up) * (x W_gate)`, then `W_out`;
- local attention in all but every `global_attention_every`-th layer: keys
  at most `local_attention // 2` positions away;
- a prediction head (dense, activation, LayerNorm) shared by the masked LM and
  every fine-tuning head, which in ModernBERT sits on top of the encoder; here
  it is the encoder's `head`, so that fine-tuning starts from the pre-trained
  head as transformers' ModernBERT classes do.

The encoder has `BertEncoder`'s interface (`bertjax.models.bert.encoder`
builds the one its config names), so the task models, trainer, sharding rules
and checkpoints serve both. Its parameters map one to one onto transformers'
`ModernBert*` classes (`bertjax.interop.mapping`).

Layer layouts: looped, `layers_0` ... `layers_{L-1}`; scanned, `layers_0`
looped (the first layer has no attention LayerNorm), then blocks of
`global_attention_every` layers (local ..., global) under `nn.scan`
(`layers/layers_j`, j < global_attention_every, with a leading [blocks]
axis), then any remaining local layers looped under their own numbers
(`bertjax.models.layout`).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.attention import Segments
from bertjax.models.config import EncoderConfig
from bertjax.models.encoder import SCANNED_LAYERS, EncoderOutput, default_inputs, remat
from bertjax.models.layers import (BATCH_LENGTH_EMBED, BATCH_LENGTH_HEADS_KV, BATCH_LENGTH_MLP,
                                   Dense, Embeddings, SelfAttention, activation, layer_norm,
                                   matmul)
from bertjax.models.rotary import Rotary

Array = jax.Array

def out_stddev(config: EncoderConfig) -> float:
  """The initializer's standard deviation for projections back into the
  residual stream: `initializer_range / sqrt(2 L)`, as ModernBERT's."""
  return config.initializer_range / math.sqrt(2.0 * config.num_layers)


class ModernAttention(SelfAttention):
  """Self-attention with one query-key-value kernel and no biases; queries and
  keys are rotated (`rotary`) before attention."""

  def project(self, x: Array) -> tuple[Array, Array, Array]:
    config = self.config
    heads, kv, embed = config.num_heads, config.head_dim, config.hidden_size
    # Stored [embed, 3, heads, kv] (transformers' Wqkv, one to one).
    qkv = Dense(config, (embed, 3, heads, kv), ("embed", None, "heads", "kv"),
                use_bias=False, name="qkv")(x)  # [batch, length, 3, heads, kv]
    return tuple(nn.with_logical_constraint(qkv[:, :, i], BATCH_LENGTH_HEADS_KV)
                 for i in range(3))

  def project_out(self, context: Array) -> Array:
    config = self.config
    return Dense(config, (config.num_heads, config.head_dim, config.hidden_size),
                 ("heads", "kv", "embed"), contracting=2, use_bias=False,
                 stddev=out_stddev(config), name="output")(context)


class ModernLayer(nn.Module):
  """One pre-norm layer: attention (global or local) and a GeGLU feed-forward.

  Attributes:
    config: The architecture.
    local: Local (sliding-window) attention rather than global.
    attention_norm: A LayerNorm before attention (all layers but the first).
  """

  config: EncoderConfig
  local: bool = False
  attention_norm: bool = True

  @nn.compact
  def __call__(self, x: Array, segments: Segments, deterministic: bool,
               rotary: tuple[Rotary, Rotary]) -> Array:
    """Maps [batch, length, embed] to [batch, length, embed].

    Args:
      rotary: The (global, local) rotations of the tokens' positions.
    """
    config = self.config
    dtype, stream = jnp.dtype(config.dtype), jnp.dtype(config.stream_dtype)

    h = x
    if self.attention_norm:
      h = layer_norm(config, "attention_norm")(x.astype(jnp.float32)).astype(dtype)
    window = config.local_attention // 2 if self.local else None
    attended = ModernAttention(config, window, name="attention")(
        h, segments, deterministic, rotary[1] if self.local else rotary[0])
    attended = nn.Dropout(config.attention_output_dropout)(attended,
                                                           deterministic=deterministic)
    x = (x.astype(jnp.float32) + attended.astype(jnp.float32)).astype(stream)
    x = nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)

    h = layer_norm(config, "mlp_norm")(x.astype(jnp.float32)).astype(dtype)
    # [embed, 2, mlp]: transformers' Wi (its input half, then its gate half).
    kernel, _ = Dense(config, (config.hidden_size, 2, config.intermediate_size),
                      ("embed", None, "mlp"), use_bias=False, name="intermediate")(None)
    kernel = kernel.astype(dtype)
    up, gate = (matmul(h, kernel[:, i]) for i in range(2))  # [batch, length, mlp] each
    hidden = activation(config.hidden_act)(up) * gate
    hidden = nn.with_logical_constraint(hidden, BATCH_LENGTH_MLP)
    hidden = nn.Dropout(config.mlp_dropout_prob)(hidden, deterministic=deterministic)
    hidden = Dense(config, (config.intermediate_size, config.hidden_size), ("mlp", "embed"),
                   use_bias=False, stddev=out_stddev(config), name="output")(hidden)
    x = (x.astype(jnp.float32) + hidden.astype(jnp.float32)).astype(stream)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)


class PredictionHead(nn.Module):
  """Dense, activation, LayerNorm: what the masked LM and the fine-tuning
  heads read (transformers' `ModernBertPredictionHead`). Its dense layer
  starts at `initializer_range`, as in ModernBERT's training code (an input
  projection there; transformers' `_init_weights` scales it as an output
  one, which only a model trained from scratch would feel)."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """[..., embed] -> [..., embed], compute dtype."""
    config = self.config
    x = Dense(config, (config.hidden_size, config.hidden_size), ("embed", "mlp"),
              use_bias=False, name="dense")(x)
    x = activation(config.hidden_act)(x)
    return layer_norm(config, "layer_norm")(x.astype(jnp.float32)).astype(config.dtype)


class _ScanBlock(nn.Module):
  """`global_attention_every` layers, local ..., global, as one `nn.scan` step."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: Array, segments: Segments, deterministic: bool,
               rotary: tuple[Rotary, Rotary]):
    every = self.config.global_attention_every
    outputs = []
    for j in range(every):
      layer = remat(ModernLayer, self.config.remat_policy, scanned=True)
      x = layer(self.config, local=j < every - 1, name=f"layers_{j}")(
          x, segments, deterministic, rotary)
      outputs.append(x)
    return x, (jnp.stack(outputs) if self.config.return_hidden_states else None)


def block_plan(config: EncoderConfig) -> tuple[int, int]:
  """(blocks, tail) of the scanned layout: after layer 0, `blocks` scanned
  blocks of `global_attention_every` layers, then `tail` looped local layers."""
  return divmod(config.num_layers - 1, config.global_attention_every)


def mean_pool(x: Array, segment_ids: Array, pool_positions: Array | None) -> Array:
  """The mean of each sequence's real tokens.

  Args:
    x: [batch, length, embed].
    segment_ids: [batch, length]: 1 for real tokens and 0 for padding, or the
      ids of packed rows (1, 2, ..., then 0).
    pool_positions: [batch, sequences] a position in each packed sequence, or
      None for one sequence a row.

  Returns:
    [batch, embed], or [batch, sequences, embed] for packed rows.
  """
  if pool_positions is None:
    ids = jnp.ones((x.shape[0], 1), jnp.int32)
  else:
    ids = jnp.take_along_axis(segment_ids, pool_positions, axis=1)  # [batch, sequences]
  members = (segment_ids[:, None, :] == ids[:, :, None]) & (ids[:, :, None] > 0)
  members = members.astype(jnp.float32)  # [batch, sequences, length]
  total = jnp.einsum("bsl,ble->bse", members, x.astype(jnp.float32))
  mean = total / jnp.maximum(members.sum(-1, keepdims=True), 1.0)
  return (mean if pool_positions is not None else mean[:, 0]).astype(x.dtype)


class ModernBertEncoder(nn.Module):
  """The ModernBERT encoder (the `bert` subtree of every task model).

  Attributes:
    config: The architecture (`family="modernbert"`).
    add_summary: Whether to build the prediction head (`head`), which every
      task model uses; only the bare encoder goes without.
  """

  config: EncoderConfig
  add_summary: bool = True

  def setup(self):
    config = self.config
    self.embeddings = Embeddings(config)
    layer = remat(ModernLayer, config.remat_policy, scanned=False)  # outside the scan
    blocks, tail = block_plan(config)
    if self.scanned:
      # Named as in the looped layout: layers_0, and the tail's own numbers.
      self.layers_0 = layer(config, local=False, attention_norm=False)
      self.layers = nn.scan(
          _ScanBlock,
          variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
          length=blocks,
          metadata_params={nn.PARTITION_NAME: SCANNED_LAYERS},
      )(config)
      for i in range(config.num_layers - tail, config.num_layers):
        setattr(self, f"layers_{i}", layer(config, local=not config.is_global_layer(i)))
    else:
      self.layers = [layer(config, local=not config.is_global_layer(i), attention_norm=i > 0)
                     for i in range(config.num_layers)]
    self.final_norm = layer_norm(config, "final_norm")
    if self.add_summary:
      self.head = PredictionHead(config)

  @property
  def scanned(self) -> bool:
    """Whether the layers after the first run under `nn.scan` (in blocks)."""
    return self.config.scan_layers and block_plan(self.config)[0] > 0

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               position_ids: Array | None = None,
               deterministic: bool = True, *, segment_ids: Array | None = None,
               pool_positions: Array | None = None) -> EncoderOutput:
    """Encodes a batch; the arguments are `BertEncoder`'s (`token_type_ids`,
    which ModernBERT does not have, are ignored).

    Returns:
      The `EncoderOutput`: `sequence_output` after the final LayerNorm, and
      `pooled_output` the prediction head on the first token or the mean of
      the real tokens (`config.classifier_pooling`).
    """
    del token_type_ids  # ModernBERT has no token types.
    config = self.config
    attention_mask, position_ids = default_inputs(config, input_ids, attention_mask,
                                                  position_ids, segment_ids)

    x = embedded = self.embeddings(input_ids, None, None, deterministic)
    segments = (Segments.unpacked(attention_mask) if segment_ids is None
                else Segments.from_ids(segment_ids))
    rotary = (Rotary.at(position_ids, config.head_dim, config.global_rope_theta),
              Rotary.at(position_ids, config.head_dim, config.local_rope_theta))

    outputs = [embedded[None]]  # [1 or layers, batch, length, embed] each
    if self.scanned:
      x = self.layers_0(x, segments, deterministic, rotary)
      outputs.append(x[None])
      x, stacked = self.layers(x, segments, deterministic, rotary)  # [blocks, every, b, t, e]
      if config.return_hidden_states:
        outputs.append(stacked.reshape(-1, *x.shape))
      tail = block_plan(config)[1]
      layers = [getattr(self, f"layers_{i}")
                for i in range(config.num_layers - tail, config.num_layers)]
    else:
      layers = self.layers
    for layer in layers:
      x = layer(x, segments, deterministic, rotary)
      outputs.append(x[None])
    x = self.final_norm(x.astype(jnp.float32)).astype(config.dtype)
    x = nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)
    hidden_states = None
    if config.return_hidden_states:
      # As transformers' ModernBERT: the last layer's entry is after the final
      # LayerNorm (the sequence output).
      hidden_states = jnp.concatenate(outputs)[:-1]  # [layers, batch, length, embed]
      hidden_states = jnp.concatenate([hidden_states, x[None]])

    pooled = None
    if self.add_summary:
      if config.classifier_pooling == "mean":
        summary = mean_pool(x, segment_ids if segment_ids is not None else attention_mask,
                            pool_positions)
      elif pool_positions is not None:  # [batch, sequences, embed]
        summary = jnp.take_along_axis(x, pool_positions[..., None], axis=1)
      else:
        summary = x[:, 0]
      pooled = self.head(summary)
    return EncoderOutput(sequence_output=x, pooled_output=pooled,
                         hidden_states=hidden_states)

  def token_features(self, x: Array) -> Array:
    """What the token-level heads read: the prediction head at every position."""
    return self.head(x)

  def attend(self, query: Array) -> Array:
    """Scores [..., embed] against the word embeddings: float32 [..., vocab]."""
    return self.embeddings.attend(query)
