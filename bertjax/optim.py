"""Optimizers and learning-rate schedules: the paper's, and ModernBERT's.

AdamW with weight decay off LayerNorm and biases, global-norm clipping, and the
original code's schedule: linear warmup to the peak, and `peak * (1 - step /
total)` after it (the decay is measured from step 0, as in
`optimization.py`). LAMB (You et al., 2019) for large batches.

ModernBERT's recipe: StableAdamW (Wortsman et al., 2023, as ModernBERT's
`optimi`-based code runs it; `scale_by_stable_adam`) with fully decoupled
weight decay, no gradient clipping, and a warmup-stable-decay schedule
(`warmup_stable_decay`) whose plateau and weight decay can change part-way
(`Restart`: ModernBERT's `restart_override`).

The original's `AdamWeightDecayOptimizer` leaves out Adam's bias correction
(`m / (1 - b1^t)`, `v / (1 - b2^t)`): with b1 = 0.9 and b2 = 0.999 its update
is `(1 - b1^t) / sqrt(1 - b2^t)` times Adam's for the same moments, 3.16x on
step 1, 3.2x on step 100, 1.26x on step 1,000 and 1.0 by step 10,000, which is
most of a GLUE run. `bias_correction=False` computes the original's update (the
paper's configs); True is optax's Adam. The optimizer state is the same either
way, so a checkpoint restores under both.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from bertjax import errors

OPTIMIZERS = ("adamw", "lamb", "stableadamw")
SCHEDULES = ("linear", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")


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


class Restart(NamedTuple):
  """From `step` on, the plateau is `learning_rate` and the weight decay
  `weight_decay`; the optimizer's moments and count go on (ModernBERT's
  `restart_override`, which resumes a checkpoint with a new learning rate and
  weight decay and keeps the rest of the optimizer's state)."""
  step: int
  learning_rate: float
  weight_decay: float


def parse_restarts(value: Any, warmup_steps: int, total_steps: int) -> list[Restart]:
  """`optimizer.restarts` as `Restart`s: a sequence of `(step, learning_rate,
  weight_decay)`, steps rising, after the warmup and before the end."""
  key = "optimizer.restarts"
  example = "((100000, 5e-05, 1e-06),)"
  if value is None or value == () or value == []:
    return []
  if not isinstance(value, (tuple, list)) or any(
      not isinstance(entry, (tuple, list)) for entry in value):
    raise errors.UsageError(f"{key}={value!r}: write each restart as (step, learning_rate, "
                            f"weight_decay) inside a tuple, e.g. {key}='{example}'")
  restarts = []
  for i, entry in enumerate(value):
    if len(entry) != 3 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                  for x in entry):
      raise errors.UsageError(f"{key}[{i}]={tuple(entry)!r} is not (step, learning_rate, "
                              f"weight_decay), e.g. {key}='{example}'")
    step, learning_rate, weight_decay = entry
    if step != int(step):
      raise errors.UsageError(f"{key}[{i}]: the step {step!r} is not a whole number")
    restart = Restart(int(step), float(learning_rate), float(weight_decay))
    if not warmup_steps <= restart.step < total_steps:
      raise errors.UsageError(f"{key}[{i}]: step {restart.step} must be in [warmup_steps, "
                              f"total_steps) = [{warmup_steps}, {total_steps})")
    if restarts and restart.step <= restarts[-1].step:
      raise errors.UsageError(f"{key}[{i}]: step {restart.step} does not come after "
                              f"{key}[{i - 1}]'s {restarts[-1].step}")
    if restart.learning_rate <= 0 or restart.weight_decay < 0:
      raise errors.UsageError(f"{key}[{i}]: need learning_rate > 0 and weight_decay >= 0, got "
                              f"{restart.learning_rate:g} and {restart.weight_decay:g}")
    restarts.append(restart)
  return restarts


def _plateau_changes(long_from_step: int, long_peak: float | None,
                     restarts: Sequence[Restart]) -> list[tuple[int, str, float]]:
  """(step, setting, learning rate) of each change of the plateau, in order;
  a restart wins a tie with the long phase."""
  changes = []
  if long_peak is not None and long_peak >= 0 and long_from_step >= 0:
    changes.append((long_from_step, "optimizer.long_learning_rate", long_peak))
  changes += [(restart.step, f"optimizer.restarts[{i}]'s learning rate", restart.learning_rate)
              for i, restart in enumerate(restarts)]
  return sorted(changes, key=lambda change: change[0])


def _piecewise(initial: float, changes: Sequence[tuple[int, float]]) -> optax.Schedule:
  """`initial`, then each change's value from its step on (later ones win)."""
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    value = jnp.asarray(initial, jnp.float32)
    for start, new in changes:  # in order of their steps
      value = jnp.where(step >= start, new, value)
    return value

  return schedule


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


def warmup_stable_decay(peak: float, warmup_steps: int, total_steps: int, decay_steps: int, *,
                        shape: str = "1-sqrt", final_fraction: float = 0.0,
                        long_from_step: int = -1, long_peak: float | None = None,
                        restarts: Sequence[Restart] = ()) -> optax.Schedule:
  """Warmup-stable-decay (trapezoidal): linear warmup to `peak`, constant, then
  a decay over the last `decay_steps` steps to `final_fraction` of the plateau.

  ModernBERT's decay is "1-sqrt": `plateau * (f + (1 - f) * (1 - sqrt(t / T)))`
  for t of T decay steps (its code's `one_minus_sqrt`); "linear" falls in a
  straight line. From `long_from_step` on (the context-extension phase) the
  plateau is `long_peak` (ModernBERT-base: 8e-4, then 3e-4 at 8,192 tokens),
  and from each restart's step on, the restart's learning rate (ModernBERT-
  large: 5e-4, then 5e-5); the decay starts from the plateau of its step.
  """
  if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
    raise errors.UsageError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps "
                            f"({total_steps}) and total_steps >= 1")
  if not 0 <= decay_steps <= total_steps - warmup_steps:
    raise errors.UsageError(f"optimizer.decay_steps={decay_steps} must be in [0, total_steps - "
                            f"warmup_steps = {total_steps - warmup_steps}]")
  if shape not in DECAY_SHAPES:
    raise errors.UsageError(f"optimizer.decay_shape={shape!r} is not one of {DECAY_SHAPES}")
  if not 0 <= final_fraction <= 1:
    raise errors.UsageError(f"optimizer.final_fraction={final_fraction} must be in [0, 1]")
  plateau_of = _piecewise(peak, [(start, rate) for start, _, rate in
                                 _plateau_changes(long_from_step, long_peak, restarts)])
  decay_start = total_steps - decay_steps

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    plateau = plateau_of(step)
    progress = jnp.clip((step - decay_start) / max(decay_steps, 1), 0.0, 1.0)
    left = 1.0 - (jnp.sqrt(progress) if shape == "1-sqrt" else progress)
    decayed = plateau * (final_fraction + (1.0 - final_fraction) * left)
    warmup = peak * step / max(warmup_steps, 1)
    return jnp.where(step < warmup_steps, warmup, jnp.where(step < decay_start, plateau, decayed))

  return schedule


class ScaleByStableAdamState(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def _layer_axes(path, x) -> tuple[int, ...]:
  """The axes one layer's tensor spans: all of them, but the leading one of
  scanned layers (a subtree named `layers`), which stacks the layers."""
  keys = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
  return tuple(range(1 if "layers" in keys else 0, x.ndim))


def scale_by_stable_adam(b1: float = 0.9, b2: float = 0.98, eps: float = 1e-6,
                         decay: optax.ScalarOrSchedule = 0.0, decay_mask: Any = None
                         ) -> optax.GradientTransformation:
  """StableAdamW's update before the learning rate, as ModernBERT's optimizer.

  Moments with debiased betas `b^ = (b^t - b) / (b^t - 1)` (so that step 1
  gives m = g, v = g^2), `m = b1^ m + (1 - b1^) g`, `v = b2^ v + (1 - b2^) g^2`;
  each layer's tensor is then scaled by `1 / max(1, sqrt(mean(g^2 / max(v,
  eps^2))))` (update clipping, which stands in for gradient clipping), and so
  is its weight decay: `scale * (m / (sqrt(v) + eps) + decay * p)` for the
  weights `decay_mask` selects. A scanned layer stack is clipped layer by
  layer, as separate tensors would be.

  Args:
    b1, b2, eps: Adam's moments and epsilon.
    decay: Weight decay per unit of learning rate, or a schedule of the step
      (restarts): ModernBERT's fully decoupled decay `wd` at a peak `lr` is
      `decay = wd / lr` here, so that times the schedule it decays by `wd` a
      step at the peak.
    decay_mask: Which weights decay (`decay_mask`), a pytree or a function of
      the parameters.
  """
  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return ScaleByStableAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

  def update(updates, state, params=None):
    if params is None and decay:
      raise ValueError("scale_by_stable_adam with weight decay needs the parameters")
    decay_now = decay(state.count) if callable(decay) else decay
    count = optax.safe_int32_increment(state.count)
    t = count.astype(jnp.float32)
    debias = lambda b: (b ** t - b) / (b ** t - 1)
    b1_t, b2_t = debias(b1), debias(b2)
    mu = jax.tree.map(lambda m, g: b1_t * m + (1 - b1_t) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2_t * v + (1 - b2_t) * jnp.square(g), state.nu, updates)
    mask = (decay_mask(params) if callable(decay_mask) else decay_mask) if decay else None

    def step(path, g, m, v, p, decays):
      ratio = jnp.square(g) / jnp.maximum(v, eps * eps)
      axes = _layer_axes(path, g)
      rms = jnp.sqrt(jnp.mean(ratio, axis=axes, keepdims=True))
      out = m / (jnp.sqrt(v) + eps)
      if decay and decays:
        out = out + decay_now * p
      return out / jnp.maximum(1.0, rms)

    if mask is None:
      mask = jax.tree.map(lambda _: False, updates)
      params = updates
    scaled = jax.tree_util.tree_map_with_path(step, updates, mu, nu, params, mask)
    return scaled, ScaleByStableAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


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
                     weight_decay: optax.ScalarOrSchedule = 0.01, b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-6, max_grad_norm: float | None = 1.0,
                     bias_correction: bool = True,
                     peak_learning_rate: float | None = None) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW (the paper), LAMB or StableAdamW, decay masked.

  Args:
    name: "adamw", "lamb" or "stableadamw".
    learning_rate: A value or a schedule of the step.
    weight_decay: Decoupled weight decay of kernels and embeddings; a
      schedule of the step for StableAdamW only (restarts).
    b1, b2, eps: Adam's moments and epsilon (1e-6 in the original code).
    max_grad_norm: Clip the global gradient norm to this (None: no clipping).
    bias_correction: Adam's bias correction of the moments; the original
      code has none (`scale_by_adam`). StableAdamW debiases its betas instead.
    peak_learning_rate: StableAdamW: the learning rate at which the weights
      decay by `weight_decay` a step (fully decoupled; ModernBERT's). It stays
      the first peak through restarts, as ModernBERT's `max_lr` does: its
      optimizer takes it from the learning rate it was built with, and a
      restart restores it with the rest of the checkpoint.
  """
  if name not in OPTIMIZERS:
    raise errors.UsageError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
  if callable(weight_decay) and name != "stableadamw":
    raise ValueError(f"{name} takes a constant weight decay")
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  adam = scale_by_adam(b1, b2, eps, bias_correction=bias_correction)
  if name == "stableadamw":
    if not peak_learning_rate:
      raise errors.UsageError("stableadamw's fully decoupled weight decay needs the peak "
                              "learning rate")
    decay = (weight_decay / peak_learning_rate if not callable(weight_decay)
             else lambda count: weight_decay(count) / peak_learning_rate)
    chain += [scale_by_stable_adam(b1, b2, eps, decay, decay_mask),
              optax.scale_by_learning_rate(learning_rate)]
  elif name == "adamw":
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


def learning_rate_setting(config: Any, step: int) -> tuple[str, float]:
  """The setting that gives `step` its plateau, and its value: what to lower
  when a run diverges there."""
  opt = config.optimizer
  setting = ("optimizer.learning_rate", opt.learning_rate)
  if opt.get("schedule", "linear") != "wsd":
    return setting
  restarts = parse_restarts(opt.get("restarts", ()), opt.warmup_steps, config.train.total_steps)
  for start, name, rate in _plateau_changes(config.train.long_from_step,
                                            opt.get("long_learning_rate", -1.0), restarts):
    if step >= start:
      setting = (name, rate)
  return setting


def make_optimizer(config: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, learning-rate schedule) of a run's `config.optimizer` and
  `config.train.total_steps` (an `ml_collections.ConfigDict`)."""
  opt = config.optimizer
  if "bias_correction" not in opt:  # no silent default: the original runs without it
    raise errors.UsageError("config.optimizer.bias_correction is missing: False for the "
                            "original BERT's Adam (the paper's configs), True for optax's")
  schedule_name = opt.get("schedule", "linear")
  if schedule_name not in SCHEDULES:
    raise errors.UsageError(f"optimizer.schedule={schedule_name!r} is not one of {SCHEDULES}")
  if schedule_name != "wsd" and opt.get("long_learning_rate", -1.0) > 0:
    raise errors.UsageError(
        f"optimizer.long_learning_rate={opt.long_learning_rate:g} is read by the wsd schedule "
        f"only; with optimizer.schedule={schedule_name!r} the long phase keeps "
        "optimizer.learning_rate's schedule: set --config.optimizer.schedule=wsd, or leave "
        "long_learning_rate at -1")
  restarts = parse_restarts(opt.get("restarts", ()), opt.warmup_steps, config.train.total_steps)
  if restarts and schedule_name != "wsd":
    raise errors.UsageError(
        f"optimizer.restarts is read by the wsd schedule only; with optimizer.schedule="
        f"{schedule_name!r} set --config.optimizer.schedule=wsd, or leave restarts empty")
  for i, restart in enumerate(restarts):
    if opt.name != "stableadamw" and restart.weight_decay != opt.weight_decay:
      raise errors.UsageError(
          f"optimizer.restarts[{i}] changes the weight decay ({opt.weight_decay:g} to "
          f"{restart.weight_decay:g}), which stableadamw alone takes part-way; with "
          f"optimizer.name={opt.name!r} give each restart weight_decay={opt.weight_decay:g}")
  if schedule_name == "wsd":
    schedule = warmup_stable_decay(
        opt.learning_rate, opt.warmup_steps, config.train.total_steps, opt.decay_steps,
        shape=opt.decay_shape, final_fraction=opt.final_fraction,
        long_from_step=config.train.long_from_step, long_peak=opt.long_learning_rate,
        restarts=restarts)
  else:
    schedule = learning_rate_schedule(opt.learning_rate, opt.warmup_steps,
                                      config.train.total_steps)
  weight_decay = opt.weight_decay
  if any(restart.weight_decay != opt.weight_decay for restart in restarts):
    weight_decay = _piecewise(opt.weight_decay, [(r.step, r.weight_decay) for r in restarts])

  optimizer = create_optimizer(opt.name, schedule, weight_decay=weight_decay,
                               b1=opt.b1, b2=opt.b2, eps=opt.eps,
                               max_grad_norm=opt.max_grad_norm,
                               bias_correction=opt.bias_correction,
                               peak_learning_rate=opt.learning_rate)
  return optimizer, schedule
