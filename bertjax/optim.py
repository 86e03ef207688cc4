"""Optimizers and the learning-rate schedule of the paper.

AdamW with weight decay off LayerNorm and biases, global-norm clipping, and the
original code's schedule: linear warmup to the peak, and `peak * (1 - step /
total)` after it (the decay is measured from step 0, as in
`optimization.py`). LAMB (You et al., 2019) for large batches.

The original's `AdamWeightDecayOptimizer` leaves out Adam's bias correction
(`m / (1 - b1^t)`, `v / (1 - b2^t)`): with b1 = 0.9 and b2 = 0.999 its update
is `(1 - b1^t) / sqrt(1 - b2^t)` times Adam's for the same moments, 3.16x on
step 1, 3.2x on step 100, 1.26x on step 1,000 and 1.0 by step 10,000, which is
most of a GLUE run. `bias_correction=False` computes the original's update (the
paper's configs); True is optax's Adam. The optimizer state is the same either
way, so a checkpoint restores under both.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertjax import errors

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
    raise errors.UsageError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps "
                            f"({total_steps}) and total_steps >= 1")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warmup = peak * step / max(warmup_steps, 1)
    decay = peak * jnp.maximum(0.0, 1.0 - step / total_steps)
    return jnp.where(step < warmup_steps, warmup, decay)

  return schedule


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, *,
                  bias_correction: bool = True) -> optax.GradientTransformation:
  """Adam's scaling `m / (sqrt(v) + eps)`, with or without bias correction.

  With `bias_correction=False` this is `optimization.py`'s
  `AdamWeightDecayOptimizer` before its weight decay and learning rate:
  `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`, update `m / (sqrt(v) + eps)`.
  The state is optax's `ScaleByAdamState` in both cases.
  """
  if bias_correction:
    return optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    scaled = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    count = optax.safe_int32_increment(state.count)
    return scaled, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def create_optimizer(name: str, learning_rate: optax.ScalarOrSchedule, *,
                     weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-6, max_grad_norm: float | None = 1.0,
                     bias_correction: bool = True) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW (the paper) or LAMB, decay masked.

  Args:
    name: "adamw" or "lamb".
    learning_rate: A value or a schedule of the step.
    weight_decay: Decoupled weight decay of kernels and embeddings.
    b1, b2, eps: Adam's moments and epsilon (1e-6 in the original code).
    max_grad_norm: Clip the global gradient norm to this (None: no clipping).
    bias_correction: Adam's bias correction of the moments; the original
      code has none (`scale_by_adam`).
  """
  if name not in OPTIMIZERS:
    raise errors.UsageError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  adam = scale_by_adam(b1, b2, eps, bias_correction=bias_correction)
  if name == "adamw":
    # optax.adamw's own chain (same state), with the Adam scaling chosen here.
    chain.append(optax.chain(adam, optax.add_decayed_weights(weight_decay, decay_mask),
                             optax.scale_by_learning_rate(learning_rate)))
  else:
    # LAMB as in BERT's reference implementations: the layer-wise trust ratio,
    # like weight decay, leaves biases and LayerNorm out.
    chain += [adam,
              optax.add_decayed_weights(weight_decay, mask=decay_mask),
              optax.masked(optax.scale_by_trust_ratio(), decay_mask),
              optax.scale_by_learning_rate(learning_rate)]
  return optax.chain(*chain)


def make_optimizer(config: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, learning-rate schedule) of a run's `config.optimizer` and
  `config.train.total_steps` (an `ml_collections.ConfigDict`)."""
  opt = config.optimizer
  if "bias_correction" not in opt:  # no silent default: the original runs without it
    raise errors.UsageError("config.optimizer.bias_correction is missing: False for the "
                            "original BERT's Adam (the paper's configs), True for optax's")
  schedule = learning_rate_schedule(opt.learning_rate, opt.warmup_steps,
                                    config.train.total_steps)
  optimizer = create_optimizer(opt.name, schedule, weight_decay=opt.weight_decay,
                               b1=opt.b1, b2=opt.b2, eps=opt.eps,
                               max_grad_norm=opt.max_grad_norm,
                               bias_correction=opt.bias_correction)
  return optimizer, schedule
