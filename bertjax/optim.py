"""Optimizers as in the paper: AdamW with weight decay off LayerNorm and biases."""

from __future__ import annotations

from typing import Any

import jax
import optax


def decay_mask(params: Any) -> Any:
  """True for weights that decay: kernels and embeddings, not biases or LayerNorm.

  The original code excludes every variable named `bias` or `LayerNorm`; here
  those are the leaves named `bias` and `scale`.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, _: path[-1].key not in ("bias", "scale"), params)


def adamw(learning_rate: optax.ScalarOrSchedule, weight_decay: float = 0.01,
          b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
          max_grad_norm: float | None = 1.0) -> optax.GradientTransformation:
  """The paper's optimizer: global-norm clipping, then AdamW with masked decay."""
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  chain.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps,
                           weight_decay=weight_decay, mask=decay_mask))
  return optax.chain(*chain)
