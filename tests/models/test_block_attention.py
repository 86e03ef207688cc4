"""The one-block attention kernels (rows of 128 tokens) called directly, in
Pallas's interpreter, against float32 softmax attention: masks at their
edges (a window of 0, causal within a window, rows of padding only), other
head sizes, bfloat16, and the shapes they refuse. They run through
`attention.fused` in tests/models/test_attention.py and are compiled for TPUs
by libtpu in tests/tools/test_compile.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import attention, block_attention

BLOCK = block_attention.BLOCK


def _ids():
  """Three rows: packed (sequences of 50, 40 and 30, then padding), unpacked
  with 90 real tokens, and padding only (every key and query id 0 as packed
  rows write it)."""
  packed = np.repeat([1, 2, 3, 0], [50, 40, 30, 8])
  unpacked = (np.arange(BLOCK) < 90).astype(np.int32)
  queries = np.stack([packed, np.ones(BLOCK, np.int32), np.zeros(BLOCK, np.int32)])
  keys = np.stack([packed, unpacked, np.zeros(BLOCK, np.int32)])
  return jnp.asarray(queries), jnp.asarray(keys)


def _check(causal, window, head_dim=16, dtype=jnp.float32, tolerance=2e-5):
  q_ids, kv_ids = _ids()
  segments = attention.Segments(q_ids, kv_ids, packed=True)
  rng = np.random.default_rng(head_dim)
  q, k, v = (jnp.asarray(rng.normal(size=(3, BLOCK, 2, head_dim)), dtype) for _ in range(3))
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)

  def kernel(q, k, v):
    scaled = q * jnp.asarray(head_dim ** -0.5, q.dtype)
    return heads_first(block_attention.block_attention(
        heads_first(scaled), heads_first(k), heads_first(v), q_ids, kv_ids, causal, window,
        True))

  # Real queries that see a key (the reference zeroes padding queries, and
  # `fused` the kernel's).
  mask = segments.mask(causal, window)[:, 0]  # [batch, q, k]
  seen = (jnp.any(mask, axis=-1) & segments.real_queries())[:, :, None, None]
  weights = jnp.cos(jnp.arange(q.size)).reshape(q.shape)
  loss = lambda f: lambda *a: (jnp.where(seen, f(*a).astype(jnp.float32), 0) * weights).sum()
  wide = [x.astype(jnp.float32) for x in (q, k, v)]
  reference = lambda q, k, v: attention.reference(q, k, v, segments, causal, window)
  got = jnp.where(seen, jax.jit(kernel)(q, k, v).astype(jnp.float32), 0)
  np.testing.assert_allclose(got, jnp.where(seen, reference(*wide), 0), atol=tolerance)
  grads = jax.jit(jax.grad(loss(kernel), (0, 1, 2)))(q, k, v)
  expected = jax.grad(loss(reference), (0, 1, 2))(*wide)
  for name, g, e in zip("qkv", grads, expected):
    assert g.dtype == dtype
    scale = max(1.0, float(jnp.abs(e).max()))
    np.testing.assert_allclose(g.astype(jnp.float32), e, atol=tolerance * scale, err_msg=name)


@pytest.mark.parametrize("causal, window", [(False, 0), (True, 0), (False, 5), (True, 5),
                                            (False, 127), (True, None), (False, None)])
def test_masks_at_their_edges(causal, window):
  _check(causal, window)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_other_head_sizes(head_dim):
  _check(True, 20, head_dim=head_dim)


def test_bfloat16_with_a_window():
  _check(True, 20, head_dim=64, dtype=jnp.bfloat16, tolerance=2e-2)


def test_a_row_of_padding_only_gives_finite_values():
  q_ids, kv_ids = _ids()
  x = jnp.ones((3, 2, BLOCK, 16), jnp.float32)
  out, grads = jax.value_and_grad(lambda q: block_attention.block_attention(
      q, x, x, q_ids, kv_ids, False, None, True).sum())(x)
  assert np.isfinite(out) and np.isfinite(grads).all()


@pytest.mark.parametrize("shapes, says", [
    (((1, 1, 64, 16),) * 3 + ((1, 64),) * 2, "rows of 128 tokens"),
    (((1, 1, 128, 16), (1, 1, 128, 32), (1, 1, 128, 16)) + ((1, 128),) * 2, "rows of 128"),
    (((1, 1, 128, 16),) * 3 + ((1, 64),) * 2, "segment ids"),
])
def test_other_shapes_are_refused(shapes, says):
  arrays = [jnp.zeros(shape, jnp.int32 if len(shape) == 2 else jnp.float32)
            for shape in shapes]
  with pytest.raises(ValueError, match=says):
    block_attention.block_attention(*arrays, False, None, True)
