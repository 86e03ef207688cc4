"""Scaled dot-product attention: one mask description, several kernels.

Which keys a query sees is said by two int32 [batch, length] arrays of segment
ids (`Segments`): a query attends to the keys of its own id (and, when causal,
at or before it).
- An unpacked row (one sequence, padding at the end): every query has id 1
  and the keys their attention mask (1 real, 0 padding), which is the
  reference's key-padding mask.
- A packed row (several sequences, `bertjax.data.packing`): ids 1, 2, ... for
  its sequences in order, 0 for the padding after them, for queries and keys
  alike, so no sequence sees another.

Kernels (`EncoderConfig.attention_impl`):
- "xla": einsum scores in float32, softmax, attention dropout: the paper's
  computation, any device. Layers call it themselves (it needs the dropout RNG).
- "dot_product": `jax.nn.dot_product_attention`'s XLA implementation.
- "cudnn": cuDNN's fused flash attention on NVIDIA GPUs (bfloat16/float16):
  sequence lengths for unpacked rows (so their padding must be at the end, as
  every bertjax pipeline and tokenizer writes it), its packed (ragged offsets)
  layout for packed ones (Hopper GPUs and newer).
- "splash": the Pallas splash attention kernel of TPUs with segment ids,
  under `shard_map` on the mesh; interpreted on CPUs (tests). Rows are padded
  to its tiles (multiples of 128 tokens), so "auto" takes it only for lengths
  that need no padding. Rows of at most one tile (padded to 128 tokens) take
  bertjax's one-block kernels instead (`block_attention`): the same softmax,
  with less kept for the backward pass and one backward kernel.
- "auto": `choose` picks per call: splash on TPU, cuDNN on GPU (where it can
  run the call), XLA otherwise, and XLA whenever attention dropout is on
  (fused kernels have none).
Fused kernels write zeros at padding queries (the XLA path's values there are
meaningless too); every kernel agrees with "xla" at real positions
(tests/models/test_attention.py).
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertjax import errors
from bertjax.models import block_attention
from bertjax.models.config import ATTENTION_FUSED, ATTENTION_IMPLEMENTATIONS

Array = jax.Array

# The kernels by name (`EncoderConfig.attention_impl`), kept with the config.
FUSED = ATTENTION_FUSED
IMPLEMENTATIONS = ATTENTION_IMPLEMENTATIONS
# Splash attention's tiles: its sequence length must be a multiple of this.
SPLASH_BLOCK = 128


@flax.struct.dataclass
class Segments:
  """Who attends to whom: int32 [batch, length] ids of queries and of keys."""

  queries: Array
  keys: Array
  # Several sequences per row (ids 1..k, then 0 for padding); static.
  packed: bool = flax.struct.field(pytree_node=False)

  @classmethod
  def unpacked(cls, attention_mask: Array) -> Segments:
    """One sequence per row: `attention_mask` [batch, length] 1/0 (padding at the end)."""
    keys = attention_mask.astype(jnp.int32)
    return cls(jnp.ones_like(keys), keys, False)

  @classmethod
  def from_ids(cls, segment_ids: Array) -> Segments:
    """Packed rows: `segment_ids` [batch, length], 1..k per sequence, 0 padding."""
    ids = segment_ids.astype(jnp.int32)
    return cls(ids, ids, True)

  def mask(self, causal: bool, window: int | None = None) -> Array:
    """Boolean [batch, 1, q, k] of allowed pairs ([batch, 1, 1, k] for
    unpacked rows without a causal or local mask).

    Args:
      causal: Only keys at or before the query.
      window: Only keys at most this many positions from the query (local
        attention), or None.
    """
    if self.packed:
      mask = self.queries[:, None, :, None] == self.keys[:, None, None, :]
    else:
      mask = self.keys[:, None, None, :] > 0
    length = self.keys.shape[1]
    if causal:
      mask = mask & jnp.tril(jnp.ones((length, length), bool))
    if window is not None:
      index = jnp.arange(length)
      mask = mask & (jnp.abs(index[:, None] - index[None, :]) <= window)
    return mask

  def real_queries(self) -> Array:
    """Boolean [batch, length]: queries of real tokens (a real token is a key too)."""
    return self.keys > 0


def platform() -> str:
  """The platform the computation is for: the mesh's (the compile tool compiles
  for TPUs from a CPU host), else the default backend's."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    return mesh.abstract_device.platform
  return jax.default_backend()


def _gpu_runs_packed_cudnn() -> bool:
  """Whether this host's GPU has cuDNN's packed layout (Hopper, compute
  capability 9.0, or newer; jax refuses it before)."""
  try:
    capability = jax.local_devices(backend="gpu")[0].compute_capability
  except (RuntimeError, IndexError, AttributeError):
    return False
  major, _, minor = str(capability).partition(".")
  return (int(major), int(minor or 0)) >= (9, 0)


def choose(implementation: str, *, length: int, head_dim: int, dtype: str, dropout: bool,
           packed: bool = False, local: bool = False, target: str | None = None) -> str:
  """The kernel `implementation` ("auto" or a name) runs as, for one call.

  Args:
    implementation: `EncoderConfig.attention_impl`: "auto" or one of `FUSED`/"xla".
    length: Tokens per row.
    head_dim: Width of a head.
    dtype: Compute dtype.
    dropout: Whether attention dropout is applied (training with a rate > 0).
    packed: Whether rows hold several sequences (`Segments.packed`).
    local: Whether the layer attends within a window (ModernBERT's local layers).
    target: Platform ("tpu", "gpu", "cpu"); default `platform()`.

  Returns:
    The kernel's name: "xla" or one of `FUSED`.

  Raises:
    ValueError: a named kernel that cannot run this call, saying what would.
  """
  if implementation == "xla":
    return "xla"
  if dropout:
    if implementation == "auto":
      return "xla"
    raise errors.UsageError(
        f"EncoderConfig.attention_impl={implementation!r} has no attention dropout: set "
        "attention_dropout_prob=0.0, or attention_impl='xla' (or 'auto') for the paper's "
        "attention dropout")
  target = target or platform()
  if implementation == "auto":
    if target == "tpu" and length % SPLASH_BLOCK == 0:
      return "splash"
    if (target == "gpu" and dtype in ("bfloat16", "float16") and head_dim <= 128
        and head_dim % 8 == 0 and (not packed or (_gpu_runs_packed_cudnn() and not local))):
      return "cudnn"
    return "xla"
  if implementation == "cudnn":
    if dtype == "float32":
      raise errors.UsageError("attention_impl='cudnn' needs dtype 'bfloat16' or 'float16'; use "
                              "'dot_product' or 'auto' for float32")
    if target != "gpu":
      raise errors.UsageError(f"attention_impl='cudnn' runs on NVIDIA GPUs, not {target}; use "
                              "'auto'")
    if packed and not _gpu_runs_packed_cudnn():
      raise errors.UsageError("attention_impl='cudnn' runs packed rows (pre-training's "
                              "data.max_sequences_per_row > 1, fine-tuning's data.pack_examples) "
                              "on Hopper GPUs and newer only; use 'auto' (XLA attention here) "
                              "or unpacked rows")
    if packed and local:
      raise errors.UsageError("attention_impl='cudnn' runs local attention on unpacked rows "
                              "only; use 'auto' (XLA attention for packed local layers)")
  if implementation == "splash" and target != "tpu" and target != "cpu":
    raise errors.UsageError(f"attention_impl='splash' runs on TPUs (interpreted on CPUs), not "
                            f"{target}; use 'auto'")
  return implementation


def fused(implementation: str, query: Array, key: Array, value: Array, segments: Segments,
          causal: bool, window: int | None = None) -> Array:
  """Attention by a fused kernel ("dot_product", "cudnn", "splash"), no dropout.

  Args:
    implementation: One of `FUSED`.
    query: [batch, length, heads, head_dim], compute dtype.
    key: [batch, length, heads, head_dim], compute dtype.
    value: [batch, length, heads, head_dim], compute dtype.
    segments: Which keys each query sees.
    causal: Also only keys at or before the query.
    window: Also only keys at most this many positions away (local attention).

  Returns:
    [batch, length, heads, head_dim], zero at padding queries.
  """
  if implementation == "dot_product":
    out = jax.nn.dot_product_attention(query, key, value, mask=segments.mask(causal, window),
                                       implementation="xla")
  elif implementation == "cudnn":
    out = _cudnn(query, key, value, segments, causal, window)
  elif implementation == "splash":
    out = _splash(query, key, value, segments, causal, window)
  else:
    raise errors.UsageError(f"unknown fused attention {implementation!r}; one of {FUSED}")
  return jnp.where(segments.real_queries()[:, :, None, None], out, 0).astype(query.dtype)


def _cudnn(query: Array, key: Array, value: Array, segments: Segments, causal: bool,
           window: int | None = None) -> Array:
  """cuDNN's flash attention: padding as sequence lengths, packed rows as its
  ragged layout (each segment's offset and length; segments must be runs in
  id order from position 0, as `bertjax.data.packing` writes them). A local
  window goes in as a [1, 1, q, k] band mask, which cuDNN adds as a bias:
  JAX's binding of cuDNN's own sliding window is causal only."""
  if not segments.packed:
    lengths = segments.keys.sum(axis=1).astype(jnp.int32)  # [batch]
    band = None
    if window is not None:
      length = query.shape[1]
      band = Segments.unpacked(jnp.ones((1, length), jnp.int32)).mask(causal, window)
    return jax.nn.dot_product_attention(query, key, value, mask=band, is_causal=causal,
                                        query_seq_lengths=lengths,
                                        key_value_seq_lengths=lengths,
                                        implementation="cudnn")
  if window is not None:  # `choose` refuses it first; a direct call must not drop the window
    raise errors.UsageError("attention_impl='cudnn' runs local attention on unpacked rows "
                            "only; use 'auto' (XLA attention for packed local layers)")
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # the packed layout

  seqlen, offsets = ragged_layout(segments.keys)
  mask_type = cudnn.MaskType.PADDING_CAUSAL if causal else cudnn.MaskType.PADDING
  return cudnn.dot_product_attention(
      query, key, value, q_seqlen=seqlen, kv_seqlen=seqlen, q_offsets=offsets,
      kv_offsets=offsets, scale=float(query.shape[-1]) ** -0.5, mask_type=mask_type,
      qkv_layout="BTNH")


def ragged_layout(segment_ids: Array) -> tuple[Array, Array]:
  """cuDNN's packed layout of rows of segments 1..k in order from position 0.

  Args:
    segment_ids: int32 [batch, length], 1..k per sequence, 0 padding.

  Returns:
    (seqlen, offsets): int32 [batch, length] tokens of each id 1..length and
    [batch, length + 1] their first positions, -1 for the ids a row lacks.
  """
  length = segment_ids.shape[1]
  counts = jax.vmap(lambda ids: jnp.bincount(ids, length=length + 1))(segment_ids)[:, 1:]
  present = counts > 0
  seqlen = jnp.where(present, counts, -1).astype(jnp.int32)
  starts = jnp.where(present, jnp.cumsum(counts, axis=1) - counts, -1)
  return seqlen, jnp.pad(starts, ((0, 0), (0, 1)), constant_values=-1).astype(jnp.int32)


def _splash_kernel(heads: int, length: int, causal: bool, interpret: bool,
                   window: int | None = None):
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  block = SPLASH_BLOCK
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            block_q_dq=block, block_kv_dq=block)
  if window is not None:  # keys at most `window` away (before the query only, if causal)
    head_mask = splash.LocalMask((length, length), (window, 0 if causal else window), 0)
  elif causal:
    head_mask = splash.CausalMask((length, length))
  else:
    head_mask = splash.FullMask((length, length))
  return splash.make_splash_mha(splash.MultiHeadMask([head_mask] * heads), head_shards=1,
                                q_seq_shards=1, block_sizes=sizes, interpret=interpret)


def _splash(query: Array, key: Array, value: Array, segments: Segments, causal: bool,
            window: int | None = None) -> Array:
  """TPU splash attention, each device on its own rows and heads (`shard_map`
  over the mesh's batch and heads axes); interpreted on CPUs. Rows of one
  block (at most 128 tokens, padded to it) take the one-block kernels
  (`block_attention`). A local window is splash's `LocalMask`, whose blocks
  wholly outside the band the kernel skips; segment ids still keep packed
  sequences apart."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  interpret = platform() == "cpu"
  scale = jnp.asarray(query.shape[-1] ** -0.5, query.dtype)  # the kernel does not scale

  def attend(q, k, v, q_ids, kv_ids):  # [b, t, h, d] of one device
    length = q.shape[1]
    pad = -length % SPLASH_BLOCK  # to whole tiles: id 0 keeps added keys from real queries
    if pad:
      q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
      q_ids, kv_ids = (jnp.pad(ids, ((0, 0), (0, pad))) for ids in (q_ids, kv_ids))
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [b, h, t, d]
    q, k, v = heads_first(q * scale), heads_first(k), heads_first(v)
    if q.shape[2] == block_attention.BLOCK:
      out = block_attention.block_attention(q, k, v, q_ids, kv_ids, causal, window, interpret)
    else:
      kernel = _splash_kernel(q.shape[1], q.shape[2], causal, interpret, window)
      out = jax.vmap(kernel)(q, k, v, splash.SegmentIds(q_ids, kv_ids))
    return heads_first(out)[:, :length]

  if jax.sharding.get_abstract_mesh().empty:
    return attend(query, key, value, segments.queries, segments.keys)
  qkv_spec = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
  if qkv_spec[1] is not None or qkv_spec[3] is not None:
    raise errors.UsageError("attention_impl='splash' shards rows and heads only; map the logical "
                            "axes 'length' and 'kv' to None in logical_axis_rules")
  ids_spec = jax.P(qkv_spec[0], None)
  return jax.shard_map(attend, in_specs=(qkv_spec, qkv_spec, qkv_spec, ids_spec, ids_spec),
                       out_specs=qkv_spec, check_vma=False)(
                           query, key, value, segments.queries, segments.keys)


def reference(query: Array, key: Array, value: Array, segments: Segments,
              causal: bool, window: int | None = None) -> Array:
  """Plain float32 attention: what the kernels are checked against."""
  scores = jnp.einsum("bqhd,bkhd->bhqk", query.astype(jnp.float32),
                      key.astype(jnp.float32)) * query.shape[-1] ** -0.5
  scores = jnp.where(segments.mask(causal, window), scores, jnp.finfo(jnp.float32).min)
  out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1),
                   value.astype(jnp.float32))
  return jnp.where(segments.real_queries()[:, :, None, None], out, 0)
