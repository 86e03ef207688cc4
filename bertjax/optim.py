"""Optimizers and the learning-rate schedule of the paper.

AdamW with weight decay off LayerNorm and biases, global-norm clipping, and the
original code's schedule: linear warmup to the peak, and `peak * (1 - step /
total)` after it (the decay is measured from step 0, as in
`optimization.py`). LAMB (You et al., 2019) for large batches.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adamw", "lamb")


def decay_mask(params: Any) -> Any:
  """True for weights that decay: kernels and embeddings, not biases or LayerNorm.

  The original code excludes every variable named `bias` or `LayerNorm`; here
  those are the leaves named `bias` and `scale`.
  """
  def decays(path, _) -> bool:
    # The last dict key names the leaf (boxed parameters add a `.value` step).
    name = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)][-1]
    return name not in ("bias", "scale")

  return jax.tree_util.tree_map_with_path(decays, params)


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """Linear warmup to `peak`, then linear decay to 0 at `total_steps`."""
  if total_steps < 1 or warmup_steps < 0 or warmup_steps > total_steps:
    raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps "
                     f"({total_steps}) and total_steps >= 1")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warmup = peak * step / max(warmup_steps, 1)
    decay = peak * jnp.maximum(0.0, 1.0 - step / total_steps)
    return jnp.where(step < warmup_steps, warmup, decay)

  return schedule


def create_optimizer(name: str, learning_rate: optax.ScalarOrSchedule, *,
                     weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-6, max_grad_norm: float | None = 1.0
                     ) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW (the paper) or LAMB, decay masked.

  Args:
    name: "adamw" or "lamb".
    learning_rate: A value or a schedule of the step.
    weight_decay: Decoupled weight decay of kernels and embeddings.
    b1, b2, eps: Adam's moments and epsilon (1e-6 in the original code).
    max_grad_norm: Clip the global gradient norm to this (None: no clipping).
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  if name == "adamw":
    chain.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps,
                             weight_decay=weight_decay, mask=decay_mask))
  else:
    # LAMB as in BERT's reference implementations: the layer-wise trust ratio,
    # like weight decay, leaves biases and LayerNorm out.
    chain += [optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
              optax.add_decayed_weights(weight_decay, mask=decay_mask),
              optax.masked(optax.scale_by_trust_ratio(), decay_mask),
              optax.scale_by_learning_rate(learning_rate)]
  return optax.chain(*chain)


def make_optimizer(config: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, learning-rate schedule) of a run's `config.optimizer` and
  `config.train.total_steps` (an `ml_collections.ConfigDict`)."""
  opt = config.optimizer
  schedule = learning_rate_schedule(opt.learning_rate, opt.warmup_steps,
                                    config.train.total_steps)
  optimizer = create_optimizer(opt.name, schedule, weight_decay=opt.weight_decay,
                               b1=opt.b1, b2=opt.b2, eps=opt.eps,
                               max_grad_norm=opt.max_grad_norm)
  return optimizer, schedule
