"""The train state and the pure, jitted pre-training and evaluation steps.

`train_step(state, batch)` and `eval_step(params, batch)` are module-level pure
functions; the trainer binds their static settings with `functools.partial`
and jits them once, with shardings and the state donated. The state is built
abstract-first and initialised directly sharded, from a fresh model
(`init_train_state`) or from given parameters (`train_state_from`, the
fine-tuner's); both through `initial_train_state`, and every step of
pre-training and fine-tuning updates it through `apply_gradients`.

Losses follow the paper: masked LM, the mean cross-entropy over the real masked
positions of the whole batch, plus next-sentence prediction. Gradient
accumulation splits the batch into micro-batches inside the step (`lax.scan`)
and normalises each by the whole batch's counts, so it computes the full
batch's gradient. A step whose loss or gradients are not finite leaves the
parameters and optimizer state as they were and is counted.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import errors, flops
from bertjax.models import EncoderConfig, BertForMaskedLM, BertForPreTraining, family, init_params

Array = jax.Array
Batch = dict[str, Array]


@flax.struct.dataclass
class TrainState:
  """Everything a step changes; checkpointed whole.

  Attributes:
    step: Steps taken (skipped ones included), int32.
    params: Model parameters.
    opt_state: Optimizer state (its step count drives the schedule).
    rng: Raw PRNG key data (uint32[2]); dropout keys fold in the step.
    skipped: Steps skipped for non-finite loss or gradients, in total.
    consecutive_skipped: Of those, how many in a row up to now.
  """

  step: Array
  params: Any
  opt_state: Any
  rng: Array
  skipped: Array
  consecutive_skipped: Array


OBJECTIVES = ("mlm_nsp", "mlm_pairs", "mlm", "ltr")


def pretraining_model(config: EncoderConfig, objective: str) -> nn.Module:
  """The model of an objective: MLM + NSP heads, MLM only, or a causal LM."""
  if objective in OBJECTIVES:
    family.of(config).check_objective(objective)
  if objective == "mlm_nsp":
    return BertForPreTraining(config)
  if objective in ("mlm", "mlm_pairs"):
    return BertForMaskedLM(config)
  if objective == "ltr":
    return BertForMaskedLM(config.replace(causal=True))
  raise errors.UsageError(f"objective must be one of {OBJECTIVES}, got {objective!r}")


# Batch fields the models take; packed rows (`bertjax.data.packing`) bring
# segment and position ids, and the [CLS] of each pair with mlm_nsp.
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "masked_positions",
                 "position_ids", "segment_ids", "nsp_positions")


def _model_inputs(batch: Batch) -> dict[str, Array]:
  return {name: batch[name] for name in _MODEL_INPUTS if name in batch}


def _nsp_weights(batch: Batch) -> Array:
  """float32 [batch] (or [batch, pairs] in packed rows): which NSP labels are real."""
  labels = batch["next_sentence_labels"]
  return batch.get("nsp_weights", jnp.ones(labels.shape, jnp.float32)).astype(jnp.float32)


def batch_work(batch: Batch, objective: str, window: int | None = None) -> dict[str, Array]:
  """The useful work of a batch, counted on device: real tokens, sequences,
  (query, key) pairs attended within each sequence (and within a local
  `window`, ModernBERT's), real predictions and NSP pairs
  (`bertjax.flops.model_flops` turns them into FLOPs)."""
  ids = batch["segment_ids"] if "segment_ids" in batch else batch["attention_mask"]
  length = ids.shape[1]
  # Tokens of each sequence of a row: [batch, length] (ids 1..length).
  sizes = jax.vmap(lambda row: jnp.bincount(row, length=length + 1))(
      ids.astype(jnp.int32))[:, 1:].astype(jnp.float32)
  causal = objective == "ltr"
  weights = batch["lm_weights"] if causal else batch["masked_weights"]
  pairs = (sizes * (sizes + 1) / 2 if causal else sizes * sizes).sum()
  return {
      "real_tokens": sizes.sum(),
      "sequences": (sizes > 0).sum().astype(jnp.float32),
      "token_pairs": pairs,
      "local_token_pairs": pairs if window is None else flops.local_pairs(sizes, window).sum(),
      "predictions": weights.astype(jnp.float32).sum(),
      "nsp_pairs": (_nsp_weights(batch).sum() if objective == "mlm_nsp"
                    else jnp.zeros((), jnp.float32)),
  }


def _seed_keys(seed: int) -> tuple[Array, Array]:
  """(initialisation key, dropout key) of a run's seed."""
  init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
  return init_rng, dropout_rng


def initial_train_state(params: Any, optimizer: optax.GradientTransformation,
                        seed: int) -> TrainState:
  """The state before step 1 over `params`: a fresh optimizer state, no step
  skipped, and the dropout key of `seed` (the one state constructor of
  pre-training and fine-tuning)."""
  zero = jnp.zeros((), jnp.int32)
  return TrainState(step=zero, params=params, opt_state=optimizer.init(params),
                    rng=jax.random.key_data(_seed_keys(seed)[1]), skipped=zero,
                    consecutive_skipped=zero)


def create_train_state(model: nn.Module, optimizer: optax.GradientTransformation,
                       seed: int) -> TrainState:
  """A fresh state (parameters boxed with their logical axes)."""
  return initial_train_state(init_params(model, _seed_keys(seed)[0]), optimizer, seed)


def abstract_train_state(model: nn.Module, optimizer: optax.GradientTransformation,
                         seed: int = 0) -> TrainState:
  """Shapes, dtypes and logical axes of the state (boxed), computed without FLOPs."""
  return jax.eval_shape(lambda: create_train_state(model, optimizer, seed))


def state_shardings(abstract_state: TrainState, mesh, rules) -> TrainState:
  """NamedShardings of every state leaf from the logical axes of the parameters
  (the optimizer's moments inherit them); scalars and the key are replicated."""
  from bertjax import sharding

  return sharding.logical_shardings(abstract_state, mesh, rules)


def init_train_state(model: nn.Module, optimizer: optax.GradientTransformation, seed: int,
                     shardings: TrainState) -> TrainState:
  """The fresh state, initialised directly in its shardings (never on one device)."""
  create = lambda: nn.meta.unbox(create_train_state(model, optimizer, seed))
  return jax.jit(create, out_shardings=shardings)()


def train_state_from(params: Any, optimizer: optax.GradientTransformation, seed: int,
                     shardings: TrainState) -> TrainState:
  """A state over given host parameters (a pretrained model's, unboxed), placed
  directly in its shardings: each device reads only its shard of each array."""
  placed = jax.tree.map(
      lambda value, target: jax.make_array_from_callback(
          np.shape(value), target, lambda index, value=value: np.asarray(value)[index]),
      params, shardings.params)
  create = functools.partial(initial_train_state, optimizer=optimizer, seed=seed)
  return jax.jit(create, in_shardings=(shardings.params,), out_shardings=shardings)(placed)


def _losses(model: nn.Module, params: Any, batch: Batch, objective: str, deterministic: bool,
            rng: Array | None) -> dict[str, Array]:
  """Loss sums and counts of a (micro-)batch, float32."""
  out = model.apply({"params": params}, **_model_inputs(batch), deterministic=deterministic,
                    rngs=None if rng is None else {"dropout": rng})
  logits = out["mlm_logits"]  # [batch, predictions|length, vocab]
  if objective == "ltr":
    labels, weights = batch["lm_labels"], batch["lm_weights"]
  else:
    labels, weights = batch["masked_ids"], batch["masked_weights"]
  weights = weights.astype(jnp.float32)
  token_losses, correct = cross_entropy_and_correct(logits, labels)
  sums = {
      "mlm_loss": (token_losses * weights).sum(),
      "mlm_correct": (correct * weights).sum(),
      "mlm_count": weights.sum(),
  }
  if objective == "mlm_nsp":
    nsp_logits, nsp_labels = out["nsp_logits"], batch["next_sentence_labels"]
    nsp_weights = _nsp_weights(batch)
    sums["nsp_loss"] = (optax.softmax_cross_entropy_with_integer_labels(
        nsp_logits, jnp.maximum(nsp_labels, 0)) * nsp_weights).sum()
    sums["nsp_correct"] = ((nsp_logits.argmax(-1) == nsp_labels) * nsp_weights).sum()
    sums["nsp_count"] = nsp_weights.sum()
  return sums


def cross_entropy_and_correct(logits: Array, labels: Array) -> tuple[Array, Array]:
  """Softmax cross-entropy of integer labels, float32 [...], and whether each
  label's logit is the largest, bool [...].

  "Correct" is `argmax(logits) == labels` but for exact ties (counted right
  here, so a row of equal logits, which no trained or freshly initialised
  model gives, counts as correct; a NaN counts as wrong): the row's maximum,
  which the cross-entropy needs anyway, replaces argmax's (value, index)
  reduction over the vocabulary, and ties are not counted to refuse them: both
  cost measurable time on the step (docs/benchmarks.md#pre-training-step-on-cpu).
  """
  top = jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True))
  chosen = jnp.take_along_axis(logits, labels[..., None], axis=-1)
  log_normalizer = jnp.log(jnp.exp(logits - top).sum(axis=-1, keepdims=True)) + top
  return (log_normalizer - chosen)[..., 0], (chosen >= top)[..., 0]


def _objective_loss(sums: dict[str, Array], totals: dict[str, Array]) -> Array:
  """MLM mean over the whole batch's masked positions, plus NSP mean."""
  loss = sums["mlm_loss"] / jnp.maximum(totals["mlm_count"], 1.0)
  if "nsp_loss" in sums:
    loss = loss + sums["nsp_loss"] / jnp.maximum(totals["nsp_count"], 1.0)
  return loss


def _micro_batches(batch: Batch, steps: int) -> Batch:
  """[batch, ...] -> [steps, batch / steps, ...], rows strided so that every
  device keeps its own rows (no data moves between devices)."""

  def split(x):
    x = x.reshape(x.shape[0] // steps, steps, *x.shape[1:])
    return jnp.swapaxes(x, 0, 1)

  return jax.tree.map(split, batch)


def apply_gradients(state: TrainState, loss: Array, grads: Any, *,
                    optimizer: optax.GradientTransformation, learning_rate_fn: Callable
                    ) -> tuple[TrainState, dict[str, Array]]:
  """The next state: the optimizer's update of `grads`, or none at all when
  the loss or the gradients are not finite (the update rule of pre-training
  and fine-tuning).

  A skipped step leaves the parameters and the optimizer state (so the
  schedule's count) as they were; it still advances `step`, and counts in
  `skipped` and `consecutive_skipped`. (`optax.apply_if_finite` checks the
  gradients only, and keeps its counters inside the optimizer state.)

  Returns:
    The next state and the update's metrics (device scalars): `learning_rate`
    (the schedule's value at the optimizer's count, the one this update
    uses), `grad_norm` (global, before clipping), `skipped` (1 if this step's
    update was not applied), `skipped_total` and `consecutive_skipped`.
  """
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  skipped = (~finite).astype(jnp.int32)
  new_state = state.replace(
      step=state.step + 1, params=keep(params, state.params),
      opt_state=keep(opt_state, state.opt_state), skipped=state.skipped + skipped,
      consecutive_skipped=jnp.where(finite, 0, state.consecutive_skipped + 1))
  return new_state, {
      "learning_rate": learning_rate_fn(optimizer_step(state.opt_state)),
      "grad_norm": grad_norm,
      "skipped": skipped,
      "skipped_total": new_state.skipped,
      "consecutive_skipped": new_state.consecutive_skipped,
  }


def train_step(state: TrainState, batch: Batch, *, model: nn.Module,
               optimizer: optax.GradientTransformation, learning_rate_fn: Callable,
               objective: str, accumulation_steps: int = 1
               ) -> tuple[TrainState, dict[str, Array]]:
  """One optimizer step on `batch` (all of it, in `accumulation_steps` parts).

  Returns the new state and the step's metrics (device scalars), with the
  batch's useful work (`batch_work`) and its model FLOPs.
  """
  weights = batch["lm_weights"] if objective == "ltr" else batch["masked_weights"]
  totals = {"mlm_count": weights.astype(jnp.float32).sum()}
  if objective == "mlm_nsp":
    totals["nsp_count"] = _nsp_weights(batch).sum()
  step_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

  def loss_fn(params, micro, rng):
    sums = _losses(model, params, micro, objective, deterministic=False, rng=rng)
    return _objective_loss(sums, totals), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if accumulation_steps == 1:
    (loss, sums), grads = grad_fn(state.params, batch, step_rng)
  else:
    def accumulate(carry, inputs):
      index, micro = inputs
      (loss, sums), grads = grad_fn(state.params, micro, jax.random.fold_in(step_rng, index))
      return jax.tree.map(jnp.add, carry, (loss, sums, grads)), None

    micro = _micro_batches(batch, accumulation_steps)
    zero_sums = jax.tree.map(jnp.zeros_like, jax.eval_shape(
        lambda: _losses(model, state.params, jax.tree.map(lambda x: x[0], micro), objective,
                        True, None)))
    zero = (jnp.zeros((), jnp.float32), zero_sums, jax.tree.map(jnp.zeros_like, state.params))
    (loss, sums, grads), _ = jax.lax.scan(
        accumulate, zero, (jnp.arange(accumulation_steps), micro))

  new_state, metrics = apply_gradients(state, loss, grads, optimizer=optimizer,
                                       learning_rate_fn=learning_rate_fn)
  metrics.update({
      "loss": loss,
      "mlm_loss": sums["mlm_loss"] / jnp.maximum(sums["mlm_count"], 1.0),
      "mlm_accuracy": sums["mlm_correct"] / jnp.maximum(sums["mlm_count"], 1.0),
  })
  if objective == "mlm_nsp":
    metrics["nsp_loss"] = sums["nsp_loss"] / jnp.maximum(sums["nsp_count"], 1.0)
    metrics["nsp_accuracy"] = sums["nsp_correct"] / jnp.maximum(sums["nsp_count"], 1.0)
  config = model.config
  work = batch_work(batch, objective, family.of(config).local_window(config))
  metrics.update(work)
  metrics["model_flops"] = flops.model_flops(config, work["real_tokens"], work["token_pairs"],
                                             work["predictions"], work["nsp_pairs"],
                                             local_token_pairs=work["local_token_pairs"])
  return new_state, metrics


def optimizer_step(opt_state: Any) -> Array:
  """The update count held by the optimizer state (what the schedule sees)."""
  counts = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
            if getattr(path[-1], "name", None) == "count"]
  return counts[0] if counts else jnp.zeros((), jnp.int32)


def eval_step(params: Any, batch: Batch, *, model: nn.Module,
              objective: str) -> dict[str, Array]:
  """Loss sums, correct predictions and counts of an evaluation batch."""
  return _losses(model, params, batch, objective, deterministic=True, rng=None)


def summarize_eval(sums: dict[str, float]) -> dict[str, float]:
  """Evaluation metrics from summed `eval_step` outputs."""
  import math

  mlm_loss = sums["mlm_loss"] / max(sums["mlm_count"], 1.0)
  metrics = {"mlm_loss": mlm_loss, "mlm_perplexity": math.exp(min(mlm_loss, 50.0)),
             "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_count"], 1.0)}
  if "nsp_count" in sums:
    metrics["nsp_loss"] = sums["nsp_loss"] / max(sums["nsp_count"], 1.0)
    metrics["nsp_accuracy"] = sums["nsp_correct"] / max(sums["nsp_count"], 1.0)
  return metrics


def jit_steps(model: nn.Module, optimizer: optax.GradientTransformation,
              learning_rate_fn: Callable, objective: str, accumulation_steps: int,
              shardings: TrainState, batch_sharding, replicated) -> tuple[Callable, Callable]:
  """(train_step, eval_step) jitted with shardings; the state is donated.

  Each compiles once per batch shape (once per sequence length).
  """
  step = jax.jit(
      functools.partial(train_step, model=model, optimizer=optimizer,
                        learning_rate_fn=learning_rate_fn, objective=objective,
                        accumulation_steps=accumulation_steps),
      in_shardings=(shardings, batch_sharding), out_shardings=(shardings, replicated),
      donate_argnums=0)
  evaluate = jax.jit(functools.partial(eval_step, model=model, objective=objective),
                     in_shardings=(shardings.params, batch_sharding), out_shardings=replicated)
  return step, evaluate
