r"""Each attention kernel this device runs, against plain float32 softmax attention.

  python benchmarks/attention_numerics.py            # the kernels of this platform

Prints one JSON line per (kernel, layout, causal, window): the largest absolute
difference of the output (at real tokens) and of the gradients of query, key
and value from `bertjax.models.attention.reference`, on inputs in the compute
dtype (bfloat16 on accelerators). On a GPU that checks cuDNN's kernel, which CI
(CPU only) can only trace; on a TPU the splash kernel compiled, not
interpreted. `window` 64 is a ModernBERT local layer (keys at most 64
positions away); a combination a kernel refuses prints what it said
(`refused`: cuDNN's local attention on packed rows).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax.models import attention


def _segments(batch: int, length: int, packed: bool) -> attention.Segments:
  rng = np.random.default_rng(1)
  if not packed:
    lengths = rng.integers(length // 4, length + 1, batch)
    lengths[0] = length
    return attention.Segments.unpacked(
        jnp.asarray(np.arange(length)[None] < lengths[:, None], jnp.int32))
  ids = np.zeros((batch, length), np.int32)
  for row in range(batch):
    start, segment = 0, 1
    while start < length - 8 and segment <= 3:
      n = int(rng.integers(8, length - start + 1))
      ids[row, start:start + n] = segment
      start, segment = start + n, segment + 1
  return attention.Segments.from_ids(jnp.asarray(ids))


def check(implementation: str, packed: bool, causal: bool, dtype, window: int | None = None,
          batch=4, length=256, heads=8, head_dim=64) -> dict:
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), dtype)
             for _ in range(3))
  segments = _segments(batch, length, packed)
  real = segments.real_queries()[:, :, None, None]
  weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

  def loss(kernel):
    return lambda q, k, v: (jnp.where(real, kernel(q, k, v).astype(jnp.float32), 0)
                            * weights).sum()

  fused = lambda q, k, v: attention.fused(implementation, q, k, v, segments, causal, window)
  exact = lambda q, k, v: attention.reference(q, k, v, segments, causal, window)
  out = jax.jit(fused)(q, k, v).astype(jnp.float32)
  grads = jax.jit(jax.grad(loss(fused), (0, 1, 2)))(q, k, v)
  expected = exact(q, k, v)
  expected_grads = jax.grad(loss(exact), (0, 1, 2))(q, k, v)
  error = lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
  return {"kernel": implementation, "packed": packed, "causal": causal, "window": window,
          "dtype": jnp.dtype(dtype).name, "device_kind": jax.devices()[0].device_kind,
          "output_max_error": error(jnp.where(real, out, 0), expected),
          "output_max_abs": float(jnp.max(jnp.abs(expected))),
          **{f"d{name}_max_error": error(g, e) for name, g, e in zip("qkv", grads,
                                                                     expected_grads)},
          "grad_max_abs": max(float(jnp.max(jnp.abs(e))) for e in expected_grads)}


def main():
  platform = jax.devices()[0].platform
  kernels = {"gpu": ["cudnn", "dot_product"], "tpu": ["splash", "dot_product"]}.get(
      platform, ["dot_product", "splash"])
  dtype = jnp.float32 if platform == "cpu" else jnp.bfloat16
  for implementation in kernels:
    for window in (None, 64):
      for packed in (False, True):
        for causal in (False, True):
          case = {"kernel": implementation, "packed": packed, "causal": causal,
                  "window": window}
          try:
            print(json.dumps(check(implementation, packed, causal, dtype, window)), flush=True)
          except errors.UsageError as e:
            print(json.dumps({**case, "refused": str(e)}), flush=True)
          except Exception as e:  # pylint: disable=broad-except
            print(json.dumps({**case, "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)


if __name__ == "__main__":
  main()
