"""Rotary position embeddings (Su et al., 2021), as ModernBERT applies them.

Each head's vector is split into halves (x1, x2) and rotated pairwise,
`x * cos + rotate_half(x) * sin` with `rotate_half(x) = (-x2, x1)`: the
non-interleaved layout of GPT-NeoX, transformers and ModernBERT's own code, so
checkpoints convert without permuting any weight. Angles are `position *
theta ** (-2i / head_dim)`, computed in float32; queries and keys are rotated
in float32 and cast back to the compute dtype.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
  """float32 [head_dim / 2]: theta ** (-2i / head_dim), i = 0 .. head_dim / 2 - 1.

  Computed in float64 and rounded once, the same on every platform.
  (transformers computes them in float32, whose `pow` may land one unit in the
  last place away: at position 8,191 that moves an angle by up to 2e-4.)
  """
  exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
  return (1.0 / (float(theta) ** exponents)).astype(np.float32)


@flax.struct.dataclass
class Rotary:
  """The cos and sin of every token's angles: float32 [batch, length, head_dim]."""

  cos: Array
  sin: Array

  @classmethod
  def at(cls, positions: Array, head_dim: int, theta: float) -> Rotary:
    """The rotation of tokens at `positions` [batch, length] (int)."""
    frequencies = jnp.asarray(inverse_frequencies(head_dim, theta))  # [head_dim / 2]
    angles = positions.astype(jnp.float32)[..., None] * frequencies  # [b, t, head_dim / 2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [b, t, head_dim]
    return cls(jnp.cos(angles), jnp.sin(angles))

  def apply(self, x: Array) -> Array:
    """Rotates x [batch, length, heads, head_dim]; same shape and dtype."""
    cos, sin = self.cos[:, :, None], self.sin[:, :, None]  # [b, t, 1, head_dim]
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)
