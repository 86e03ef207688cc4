"""The BERT encoder: embeddings, a stack of transformer layers, the [CLS] pooler.

The layers run either as a Python loop (parameters `layers_0` ... `layers_{L-1}`)
or under `nn.scan` (one `layers` subtree whose leaves carry a leading "layers"
axis), each optionally rematerialised. `bertjax.models.layout` converts between
the two parameter layouts.
"""

from __future__ import annotations

import jax
import flax.linen as nn
import flax.struct
import jax.numpy as jnp

from bertjax import errors
from bertjax.models.config import EncoderConfig
from bertjax.models.attention import Segments
from bertjax.models.layers import Embeddings, TransformerLayer, dense

Array = jax.Array

SCANNED_LAYERS = "layers"  # Name of the scanned subtree and of its stacked axis.


def pool(x: Array, attention_mask: Array, causal: bool) -> Array:
  """The position whose vector sums up the input: [batch, length, embed] -> [batch, embed].

  [CLS] (position 0) in a bidirectional model. Under a causal mask [CLS] sees
  only itself, and every input would give the same summary; there the last real
  token (the final [SEP]), the one position that has seen the whole input.
  """
  if not causal:
    return x[:, 0]
  length = attention_mask.shape[1]
  last = length - 1 - jnp.argmax(attention_mask[:, ::-1] > 0, axis=-1)  # [batch]
  return jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]


def restarting_positions(segment_ids: Array) -> Array:
  """Positions counted from 0 at the start of each run of equal ids.

  Args:
    segment_ids: [batch, length] ids of a packed row (1, 2, ..., then 0).

  Returns:
    int32 [batch, length]: each token's position within its sequence.
  """
  index = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)
  starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                            segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)  # [batch, length]
  return index - first


def default_inputs(config: EncoderConfig, input_ids: Array, attention_mask: Array | None,
                   position_ids: Array | None, segment_ids: Array | None) -> tuple[Array, Array]:
  """The attention mask and positions of a batch, filled in where not given.

  Args:
    config: The architecture (its longest input).
    input_ids: [batch, length] token ids.
    attention_mask: [batch, length] 1/0, or None: all ones, or with
      `segment_ids`, `segment_ids > 0`.
    position_ids: [batch, length], or None: 0..length-1, or with `segment_ids`
      0.. from each sequence's start.
    segment_ids: [batch, length] ids of packed rows, or None.

  Returns:
    (attention_mask, position_ids), int32 [batch, length] each.
  """
  batch, length = input_ids.shape
  if length > config.max_position_embeddings:
    raise errors.UsageError(f"Input length {length} exceeds max_position_embeddings="
                            f"{config.max_position_embeddings} of the model")
  if segment_ids is not None:
    attention_mask = (segment_ids > 0).astype(jnp.int32)
  elif attention_mask is None:
    attention_mask = jnp.ones((batch, length), jnp.int32)
  if position_ids is None and segment_ids is not None:
    position_ids = restarting_positions(segment_ids)
  elif position_ids is None:
    position_ids = jnp.broadcast_to(jnp.arange(length), (batch, length))
  return attention_mask, position_ids


@flax.struct.dataclass
class EncoderOutput:
  """What the encoder computes.

  Attributes:
    sequence_output: [batch, length, embed] last layer, compute dtype.
    pooled_output: [batch, embed] tanh(dense([CLS])), or None without a pooler.
      A causal (left-to-right) model pools its last real token instead (`pool`).
      Given `pool_positions` [batch, sequences]: [batch, sequences, embed].
    hidden_states: [num_layers + 1, batch, length, embed], the embedding output
      then every layer's output, when `config.return_hidden_states`; else None.
  """

  sequence_output: Array
  pooled_output: Array | None
  hidden_states: Array | None


def remat(layer_class: type[nn.Module], policy_name: str, scanned: bool) -> type[nn.Module]:
  """`layer_class` rematerialised in the backward pass by the named policy
  (`EncoderConfig.remat_policy`); its __call__ is (self, x, segments,
  deterministic, ...). `scanned`: whether it runs inside `nn.scan`.

  Outside a scan, XLA would find the backward pass's recomputation the same
  as the forward pass's computation and keep one of them (common
  subexpressions), undoing the remat: `prevent_cse` stops it there. Inside a
  scan, the two are in different loops, and the barrier would only cost.
  """
  if policy_name == "none":
    return layer_class
  policy = None if policy_name == "full" else getattr(jax.checkpoint_policies, policy_name)
  # Argument 3 of __call__(self, x, segments, deterministic) is a Python bool.
  return nn.remat(layer_class, policy=policy, prevent_cse=not scanned, static_argnums=(3,))


class _ScanStep(nn.Module):
  """Adapts a layer to `nn.scan`'s (carry, inputs) -> (carry, outputs) form."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: Array, segments: Segments, deterministic: bool):
    layer = remat(TransformerLayer, self.config.remat_policy, scanned=True)
    x = layer(self.config, name="layer")(x, segments, deterministic)
    return x, (x if self.config.return_hidden_states else None)


class BertEncoder(nn.Module):
  """BERT's encoder (the `bert` subtree of every task model).

  Attributes:
    config: The architecture.
    add_summary: Whether to build BERT's summary module, the [CLS] pooler
      (task models that never use it, like masked LM or span prediction,
      leave it out as the reference does).
  """

  config: EncoderConfig
  add_summary: bool = True

  def setup(self):
    config = self.config
    self.embeddings = Embeddings(config)
    if config.scan_layers:
      # The scanned step returns (carry, per-layer output); `nn.scan` stacks the
      # parameters and RNG streams along a leading axis named "layers".
      self.layers = nn.scan(
          _ScanStep,
          variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast),
          length=config.num_layers,
          metadata_params={nn.PARTITION_NAME: SCANNED_LAYERS},
      )(config)
    else:
      layer = remat(TransformerLayer, config.remat_policy, scanned=False)
      self.layers = [layer(config) for _ in range(config.num_layers)]
    if self.add_summary:
      self.pooler = dense(config, config.hidden_size, config.hidden_size, ("embed", "mlp"),
                          "pooler")

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               position_ids: Array | None = None,
               deterministic: bool = True, *, segment_ids: Array | None = None,
               pool_positions: Array | None = None) -> EncoderOutput:
    """Encodes a batch.

    Args:
      input_ids: [batch, length] token ids.
      attention_mask: [batch, length], 1 for real tokens and 0 for padding
        (at the end of the row, as the tokenizers pad: the cuDNN kernel reads
        it as lengths); default all ones. Not read with `segment_ids`, which
        say the same (`segment_ids > 0`).
      token_type_ids: [batch, length] token types (sentence A or B); default zeros.
      position_ids: [batch, length] positions; default 0..length-1, or with
        `segment_ids` 0.. from each sequence's start (`restarting_positions`).
      deterministic: Disable dropout (evaluation and inference).
      segment_ids: [batch, length] packed rows: 1, 2, ... for the sequences in
        order, 0 for the padding after them; no sequence attends to another.
      pool_positions: [batch, sequences] positions to pool (each packed
        sequence's [CLS]): `pooled_output` is then [batch, sequences, embed].

    Returns:
      The `EncoderOutput`.
    """
    config = self.config
    attention_mask, position_ids = default_inputs(config, input_ids, attention_mask,
                                                  position_ids, segment_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids, jnp.int32)

    x = embedded = self.embeddings(input_ids, token_type_ids, position_ids,
                                   deterministic)
    segments = (Segments.unpacked(attention_mask) if segment_ids is None
                else Segments.from_ids(segment_ids))

    if config.scan_layers:
      x, stacked = self.layers(x, segments, deterministic)  # stacked: [layers, b, t, e]
    else:
      outputs = []
      for layer in self.layers:
        x = layer(x, segments, deterministic)
        outputs.append(x)
      stacked = jnp.stack(outputs) if config.return_hidden_states else None

    hidden_states = None
    if config.return_hidden_states:
      hidden_states = jnp.concatenate([embedded[None], stacked])
    pooled = None
    if self.add_summary:
      if pool_positions is not None:  # [batch, sequences, embed]
        summary = jnp.take_along_axis(x, pool_positions[..., None], axis=1)
      else:
        summary = pool(x, attention_mask, config.causal)  # [batch, embed]
      pooled = jnp.tanh(self.pooler(summary).astype(jnp.float32)).astype(config.dtype)
    return EncoderOutput(sequence_output=x, pooled_output=pooled,
                         hidden_states=hidden_states)

  def attend(self, query: Array) -> Array:
    """Scores [..., embed] against the word embeddings: float32 [..., vocab]."""
    return self.embeddings.attend(query)
