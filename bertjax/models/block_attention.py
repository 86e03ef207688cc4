"""Attention over rows of one block (128 tokens): TPU Pallas kernels.

Where the keys of a row fit one [128, 128] block of scores, attention needs
none of a flash kernel's machinery: no running maximum across blocks, no
partial sums. These kernels compute a (row, head) pair each, the whole
softmax at once, and keep everything between their inputs and outputs in
the chip's vector memory. What they keep for the backward pass is each
query's log-sum-exp as a row of float32, `[batch, heads, 1, length]`, the
layout the backward kernel reads: splash's forward kernel writes it padded to
128 lanes (`[heads, length, 128]`, as large as the scores), which the
program then reads again to compact it.

The forward kernel computes the scores q k^T, masks them, and writes the
output and the log-sum-exp. The backward kernel computes the transposed
scores k q^T again (keys on sublanes, so that the log-sum-exp and the
queries' output x gradient sums broadcast along them) and from them the
gradients of the values, the keys and the queries, 5 products of the block,
and the output x gradient sums (splash takes those from XLA, outside).

Queries, keys and values are [batch, heads, 128, head_dim] (heads first:
`attention._splash` pads shorter rows to 128 with segment id 0); the queries
already scaled. Interpreted on CPUs (tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

Array = jax.Array

BLOCK = 128  # the length of a row, in tokens
_LANES = 128
# Below every real score and finite, so that exp(masked - max) is 0 without
# an infinity minus an infinity (as splash's mask value).
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b


def _allowed(row_ids: Array, column_ids: Array, causal: bool, window: int | None,
             keys_on_rows: bool) -> Array:
  """[128, 128] bool: which (query, key) pairs attend. `row_ids` [128, 128]
  (each row's id across the lanes) and `column_ids` [1, 128] are the segment
  ids of the block's rows and columns: queries and keys, or keys and queries
  when `keys_on_rows`."""
  allowed = row_ids == column_ids
  if causal or window is not None:
    rows = jax.lax.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 0)
    columns = jax.lax.broadcasted_iota(jnp.int32, (BLOCK, BLOCK), 1)
    queries, keys = (columns, rows) if keys_on_rows else (rows, columns)
    if causal:
      allowed &= keys <= queries
    if window is not None:  # as splash's LocalMask: no integer abs
      allowed &= (keys >= queries - window) & (keys <= queries + window)
  return allowed


def _as_row(column: Array) -> Array:
  """[128, 1] -> [1, 128] (a transpose of the lane-broadcast block)."""
  return jnp.broadcast_to(column, (BLOCK, _LANES)).T[:1, :]


def _forward_kernel(q_ids_ref, kv_ids_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, *,
                    causal: bool, window: int | None):
  """One (row, head): the queries' ids [128, 128] (each across the lanes) and
  the keys' [8, 128]; q, k, v and out [128, head_dim]; lse [1, 128]."""
  q, k = q_ref[...], k_ref[...]
  scores = jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32)  # [q, k]
  allowed = _allowed(q_ids_ref[...], kv_ids_ref[:1, :], causal, window, keys_on_rows=False)
  scores = jnp.where(allowed, scores, _MASKED)
  top = scores.max(axis=-1, keepdims=True)  # [q, 1]
  weights = jnp.exp(scores - top)
  total = weights.sum(axis=-1, keepdims=True)
  out = jax.lax.dot_general(weights, v_ref[...].astype(jnp.float32), _NN,
                            preferred_element_type=jnp.float32)
  out_ref[...] = (out / total).astype(out_ref.dtype)
  lse_ref[...] = _as_row(top + jnp.log(total))


def _backward_kernel(q_ids_ref, kv_ids_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, d_out_ref,
                     dq_ref, dk_ref, dv_ref, *, causal: bool, window: int | None):
  """One (row, head): the queries' ids [8, 128] and the keys' [128, 128] (each
  across the lanes); the [128, head_dim] arrays; lse [1, 128]."""
  q, k, v, d_out = q_ref[...], k_ref[...], v_ref[...], d_out_ref[...]
  # Each query's output x its gradient, summed over head_dim: softmax's
  # backward term, [q, 1], made a row below.
  dot = (out_ref[...].astype(jnp.float32) * d_out.astype(jnp.float32)).sum(axis=-1,
                                                                          keepdims=True)
  scores = jax.lax.dot_general(k, q, _NT, preferred_element_type=jnp.float32)  # [k, q]
  allowed = _allowed(kv_ids_ref[...], q_ids_ref[:1, :], causal, window, keys_on_rows=True)
  weights = jnp.where(allowed, jnp.exp(scores - lse_ref[...]), 0.0)  # [k, q]
  dv_ref[...] = jax.lax.dot_general(weights.astype(d_out.dtype), d_out, _NN,
                                    preferred_element_type=jnp.float32).astype(dv_ref.dtype)
  d_weights = jax.lax.dot_general(v, d_out, _NT, preferred_element_type=jnp.float32)
  d_scores = weights * (d_weights - _as_row(dot))  # [k, q]
  dk_ref[...] = jax.lax.dot_general(d_scores.astype(q.dtype), q, _NN,
                                    preferred_element_type=jnp.float32).astype(dk_ref.dtype)
  dq_ref[...] = jax.lax.dot_general(d_scores.T.astype(k.dtype), k, _NN,
                                    preferred_element_type=jnp.float32).astype(dq_ref.dtype)


# Blocks, on a (row, head) grid: segment ids as rows of the block (each id
# across the lanes, from [batch, 128, 128]) and as its columns (from [batch,
# 8, 128], a whole tile), a [batch, heads, 128, head_dim] array's block and
# the log-sum-exp's row.
_ROW_IDS = pl.BlockSpec((None, BLOCK, _LANES), lambda b, h: (b, 0, 0))
_COLUMN_IDS = pl.BlockSpec((None, 8, BLOCK), lambda b, h: (b, 0, 0))
_LSE = pl.BlockSpec((None, None, 1, BLOCK), lambda b, h: (b, h, 0, 0))
_PARALLEL = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))


def _tokens(head_dim: int) -> pl.BlockSpec:
  return pl.BlockSpec((None, None, BLOCK, head_dim), lambda b, h: (b, h, 0, 0))


def _as_rows(ids: Array) -> Array:
  """[batch, 128] -> [batch, 128, 128], each id across the lanes."""
  return jnp.broadcast_to(ids[:, :, None], (*ids.shape, _LANES))


def _as_columns(ids: Array) -> Array:
  """[batch, 128] -> [batch, 8, 128], the ids on every sublane."""
  return jnp.broadcast_to(ids[:, None, :], (ids.shape[0], 8, ids.shape[1]))


def _forward(q: Array, k: Array, v: Array, q_ids: Array, kv_ids: Array, causal: bool,
             window: int | None, interpret: bool) -> tuple[Array, Array]:
  """The output [batch, heads, 128, head_dim] and the log-sum-exp
  [batch, heads, 1, 128]."""
  if not q.shape == k.shape == v.shape or q.shape[2] != BLOCK:
    raise ValueError(f"block_attention takes rows of {BLOCK} tokens: queries, keys and "
                     f"values [batch, heads, {BLOCK}, head_dim], not {q.shape}, {k.shape}, "
                     f"{v.shape}")
  if not q_ids.shape == kv_ids.shape == q.shape[::2]:
    raise ValueError(f"block_attention: segment ids [batch, {BLOCK}], not {q_ids.shape} "
                     f"and {kv_ids.shape}")
  batch, heads, length, head_dim = q.shape
  tokens = _tokens(head_dim)
  return pl.pallas_call(
      functools.partial(_forward_kernel, causal=causal, window=window),
      grid=(batch, heads),
      in_specs=[_ROW_IDS, _COLUMN_IDS, tokens, tokens, tokens],
      out_specs=[tokens, _LSE],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((batch, heads, 1, length), jnp.float32)],
      compiler_params=_PARALLEL, interpret=interpret, name="bertjax_block_attention_fwd")(
          _as_rows(q_ids), _as_columns(kv_ids), q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def block_attention(q: Array, k: Array, v: Array, q_ids: Array, kv_ids: Array,
                    causal: bool, window: int | None, interpret: bool) -> Array:
  """Softmax attention of rows of 128 tokens.

  Args:
    q: [batch, heads, 128, head_dim], scaled.
    k: [batch, heads, 128, head_dim].
    v: [batch, heads, 128, head_dim].
    q_ids: int32 [batch, 128], the queries' segment ids.
    kv_ids: int32 [batch, 128], the keys'.
    causal: Only keys at or before the query.
    window: Only keys at most this many positions away, or None.
    interpret: Run the kernels in Pallas's interpreter (CPUs).

  Returns:
    [batch, heads, 128, head_dim], q's dtype. A query that sees no key (a
    padding query where no padding key is near) holds the mean of the values
    and passes no gradient back: `attention.fused` zeroes it.
  """
  return _forward(q, k, v, q_ids, kv_ids, causal, window, interpret)[0]


def _vjp_forward(q, k, v, q_ids, kv_ids, causal, window, interpret):
  out, lse = _forward(q, k, v, q_ids, kv_ids, causal, window, interpret)
  return out, (q, k, v, q_ids, kv_ids, out, lse)


def _vjp_backward(causal, window, interpret, residuals, d_out):
  q, k, v, q_ids, kv_ids, out, lse = residuals
  batch, heads, _, head_dim = q.shape
  tokens = _tokens(head_dim)
  dq, dk, dv = pl.pallas_call(
      functools.partial(_backward_kernel, causal=causal, window=window),
      grid=(batch, heads),
      in_specs=[_COLUMN_IDS, _ROW_IDS, tokens, tokens, tokens, tokens, _LSE, tokens],
      out_specs=[tokens, tokens, tokens],
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
      compiler_params=_PARALLEL, interpret=interpret, name="bertjax_block_attention_bwd")(
          _as_columns(q_ids), _as_rows(kv_ids), q, k, v, out, lse, d_out)
  return dq, dk, dv, None, None


block_attention.defvjp(_vjp_forward, _vjp_backward)
