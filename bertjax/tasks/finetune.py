"""Fine-tuning: a pretrained encoder and one output layer, trained end to end.

The task modules (`glue`, and the span, choice and token tasks) turn their data
into fixed-shape numpy features and read the predictions back; this module
holds what they share: the loss of each kind of output layer, the pure jitted
train and predict steps, the sharded state, and epoch batching.

The recipe is the original `run_classifier.py`'s: AdamW (weight decay 0.01,
not on LayerNorm and biases, epsilon 1e-6, no bias correction), linear warmup over
`warmup_proportion` of the steps then linear decay to 0, global-norm clipping
at 1, dropout as pre-trained, and its step count, `int(examples / batch *
epochs)`. Training batches are cut from one stream of the epochs, each
reshuffled from the seed, so no example is dropped (a batch may span two
epochs, as the original's repeated dataset's); prediction pads the last batch
with rows of weight 0 (packed, with empty rows and slots). Batches may be
packed, several examples a row (`bertjax.data.example_packing`), the batch
still counted in examples.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Iterator, Mapping

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import divergence, errors, metrics, optim, sharding, train
from bertjax.data import example_packing
from bertjax.pretrained import Pretrained, load_pretrained

Array = jax.Array
Features = dict[str, np.ndarray]  # name -> [examples, ...]

# How the output layer is trained; each names the labels its features carry.
KINDS = ("classification", "regression", "multiple_choice", "span", "token")
# The attention implementations that apply attention dropout (`models.attention.choose`).
_WITH_ATTENTION_DROPOUT = ("auto", "xla")
# What the task models read of a batch (packed rows: segment ids and pooled positions).
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "segment_ids",
                 "pool_positions", "choice_slots")


def _model_inputs(batch: Mapping[str, Array]) -> dict[str, Array]:
  return {name: batch[name] for name in _MODEL_INPUTS if name in batch}


def _cross_entropy(logits: Array, labels: Array) -> Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def loss_sums(kind: str, outputs: Mapping[str, Array], batch: Mapping[str, Array]
              ) -> dict[str, Array]:
  """Loss sum, correct predictions and the weight they are averaged over.

  `batch["weights"]` [batch] is 1 for real examples and 0 for padding rows
  ([rows, slots] for the pooled kinds' packed rows, `example_packing`).
  """
  weights = batch["weights"].astype(jnp.float32)
  if kind in ("classification", "multiple_choice"):
    logits, labels = outputs["logits"], batch["labels"]  # [..., classes|choices], [...]
    losses = _cross_entropy(logits, labels)
    correct = (logits.argmax(-1) == labels).astype(jnp.float32)
  elif kind == "regression":
    predictions = outputs["logits"][..., 0].astype(jnp.float32)  # [...]
    losses = jnp.square(predictions - batch["labels"])
    correct = jnp.zeros_like(losses)
  elif kind == "span":
    starts, ends = batch["start_positions"], batch["end_positions"]  # [b]
    losses = (_cross_entropy(outputs["start_logits"], starts)
              + _cross_entropy(outputs["end_logits"], ends)) / 2
    correct = ((outputs["start_logits"].argmax(-1) == starts)
               & (outputs["end_logits"].argmax(-1) == ends)).astype(jnp.float32)
  elif kind == "token":
    logits, labels = outputs["logits"], batch["labels"]  # [b, t, n], [b, t]
    token_weights = batch["label_weights"].astype(jnp.float32) * weights[:, None]
    token_losses = _cross_entropy(logits, labels)
    return {"loss": (token_losses * token_weights).sum(), "count": token_weights.sum(),
            "correct": ((logits.argmax(-1) == labels) * token_weights).sum()}
  else:
    raise errors.UsageError(f"kind must be one of {KINDS}, got {kind!r}")
  return {"loss": (losses * weights).sum(), "count": weights.sum(),
          "correct": (correct * weights).sum()}


# What the fine-tuner logs of `train.apply_gradients`'s metrics (the totals of
# skipped steps, not each step's flag).
_UPDATE_METRICS = ("learning_rate", "grad_norm", "skipped_total", "consecutive_skipped")


def finetune_step(state: train.TrainState, batch: dict[str, Array], *, model: nn.Module,
                  optimizer: optax.GradientTransformation, learning_rate_fn: Callable,
                  kind: str) -> tuple[train.TrainState, dict[str, Array]]:
  """One optimizer step on a batch: the mean loss over its real examples."""
  step_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

  def loss_fn(params):
    outputs = model.apply({"params": params}, **_model_inputs(batch), deterministic=False,
                          rngs={"dropout": step_rng})
    sums = loss_sums(kind, outputs, batch)
    return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums

  (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  new_state, update = train.apply_gradients(state, loss, grads, optimizer=optimizer,
                                            learning_rate_fn=learning_rate_fn)
  step_metrics = {"loss": loss, **{name: update[name] for name in _UPDATE_METRICS}}
  if kind != "regression":
    step_metrics["accuracy"] = sums["correct"] / jnp.maximum(sums["count"], 1.0)
  return new_state, step_metrics


def predict_step(params: Any, batch: dict[str, Array], *, model: nn.Module
                 ) -> dict[str, Array]:
  """The model's outputs (float32) for a batch, without dropout."""
  outputs = model.apply({"params": params}, **_model_inputs(batch), deterministic=True)
  return jax.tree.map(lambda x: x.astype(jnp.float32), outputs)


def load_model(config: ml_collections.ConfigDict, task: str,
               labels: list[str] | None = None) -> Pretrained:
  """The pretrained bundle of `config.init_checkpoint` in a task model.

  The computation dtype and the dropout given in `config.model` (negative:
  the checkpoint's) apply. Attention dropout needs an attention kernel that
  has it: a checkpoint that names a fused kernel without it (splash, cuDNN)
  runs "auto", which picks XLA's attention while dropout is on. The bundle
  must bring its tokenizer, and the checkpoint's position table must cover
  `config.max_seq_length`.
  """
  if not config.init_checkpoint:
    raise errors.UsageError("config.init_checkpoint is empty: give the pre-trained model to "
                            "fine-tune (a pre-training workdir, a bertjax, Hugging Face or Google "
                            "TF directory)")
  dropout = {name: config.model[name] for name in ("hidden_dropout_prob",
                                                   "attention_dropout_prob")
             if config.model[name] >= 0}
  bundle = load_pretrained(config.init_checkpoint, task=task, labels=labels, seed=config.seed,
                           dtype=config.model.dtype, **dropout)
  if (bundle.config.attention_dropout_prob > 0
      and bundle.config.attention_impl not in _WITH_ATTENTION_DROPOUT):
    logging.info("attention_impl %r has no attention dropout: fine-tuning runs 'auto' (XLA's "
                 "attention while dropout is on)", bundle.config.attention_impl)
    bundle.config = bundle.config.replace(attention_impl="auto")
  if bundle.tokenizer is None:
    raise errors.UsageError(f"{config.init_checkpoint}: no tokenizer (vocab.txt) beside the "
                            "weights; fine-tuning needs the one the model was pre-trained with")
  if config.max_seq_length > bundle.config.max_position_embeddings:
    raise errors.UsageError(f"max_seq_length={config.max_seq_length} is above the checkpoint's "
                            f"max_position_embeddings={bundle.config.max_position_embeddings}")
  return bundle


def num_train_steps(num_examples: int, batch_size: int, epochs: float) -> int:
  """`run_classifier.py`'s count: `int(num_examples / batch_size * epochs)`.

  The epochs' examples form one stream cut into batches, so a partial batch at
  an epoch's end takes the next epoch's first examples and none is dropped.
  `run_squad.py` counts questions here, not their windows.
  """
  return int(num_examples / batch_size * epochs)


def run_steps(count: int, what: str, recipe: Recipe) -> int:
  """`num_train_steps` of a run, or an error naming what is too small.

  Args:
    count: The examples counted (`what`: "training examples", "questions").
    recipe: The run's batch size and epochs.
  """
  steps = num_train_steps(count, recipe.batch_size, recipe.epochs)
  if steps < 1:
    raise errors.UsageError(f"{count} {what} x train.epochs={recipe.epochs} make no batch of "
                            f"train.batch_size={recipe.batch_size}")
  return steps


def epoch_end_step(num_examples: int, batch_size: int, epoch: int) -> int:
  """The step after which `epoch` (0-based) has been trained on, in the stream."""
  return num_train_steps(num_examples, batch_size, epoch + 1)


def stream_rows(count: int, batch_size: int, seed: int, start: int, stop: int
                ) -> Iterator[np.ndarray]:
  """The rows of each training batch of steps [start, stop): consecutive slices
  of one stream that holds every epoch's permutation of the rows in turn (as
  the original's `repeat()` before `batch()`), each epoch's permutation drawn
  from (seed, epoch). Batch `k` is rows `k * batch_size` to `(k + 1) *
  batch_size - 1` of the stream, whatever step the run starts from.
  """
  permutations: dict[int, np.ndarray] = {}

  def permutation(epoch: int) -> np.ndarray:
    if epoch not in permutations:
      permutations.clear()  # batches move forward: two epochs at most at a time
      permutations[epoch] = np.random.default_rng([seed, epoch]).permutation(count)
    return permutations[epoch]

  for step in range(start, stop):
    positions = step * batch_size + np.arange(batch_size)
    epochs, offsets = np.divmod(positions, count)
    yield np.concatenate([permutation(int(e))[offsets[epochs == e]] for e in np.unique(epochs)])


def train_batches(features: Features, batch_size: int, seed: int, start: int, stop: int
                  ) -> Iterator[Features]:
  """The training batches of steps [start, stop) (`stream_rows`)."""
  for rows in stream_rows(len(features["input_ids"]), batch_size, seed, start, stop):
    yield {name: value[rows] for name, value in features.items()}


def prediction_batches(features: Features, batch_size: int) -> Iterator[Features]:
  """Batches in order; the last one is padded with copies of row 0 of weight 0."""
  count = len(features["input_ids"])
  for start in range(0, count, batch_size):
    rows = np.arange(start, start + batch_size)
    real = rows < count
    rows = np.where(real, rows, 0)
    batch = {name: value[rows] for name, value in features.items()}
    batch["weights"] = batch["weights"] * real
    yield batch


@dataclasses.dataclass
class Recipe:
  """The optimisation settings of a fine-tuning run (`config.train`)."""

  learning_rate: float
  batch_size: int
  epochs: float
  warmup_proportion: float = 0.1
  weight_decay: float = 0.01
  eps: float = 1e-6
  max_grad_norm: float = 1.0
  bias_correction: bool = False
  eval_batch_size: int = 64

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Recipe:
    """The settings of `config.train`, each one required (no silent default)."""
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in config.train]
    if missing:
      raise errors.UsageError(f"config.train is missing {', '.join(missing)} (the task "
                              "configs in configs/ set every one)")
    return cls(**{f.name: config.train[f.name] for f in dataclasses.fields(cls)})

  def make_optimizer(self, total_steps: int) -> tuple[optax.GradientTransformation,
                                                      optax.Schedule]:
    """(optimizer, learning-rate schedule) of a run of `total_steps`, as
    `optim.make_optimizer` builds the pre-training run's: AdamW with Adam's
    moments as in the original (b1 0.9, b2 0.999), every other setting this
    recipe's, the warmup `warmup_proportion` of the steps."""
    schedule = optim.learning_rate_schedule(
        self.learning_rate, int(self.warmup_proportion * total_steps), total_steps)
    optimizer = optim.create_optimizer(
        "adamw", schedule, weight_decay=self.weight_decay, b1=0.9, b2=0.999, eps=self.eps,
        max_grad_norm=self.max_grad_norm, bias_correction=self.bias_correction)
    return optimizer, schedule


class FineTuner:
  """A pretrained bundle's task model, sharded on the mesh, with its optimizer.

  Args:
    bundle: From `bertjax.load_pretrained(..., task=...)`.
    kind: How its output layer is trained (see `KINDS`).
    recipe: The optimisation settings.
    total_steps: Optimizer steps of the whole run (sets the schedule).
    config: The run's config (mesh, logical axis rules, seed, logging).
    writer: Where metrics go.
    packed: Train and predict on rows of several examples each
      (`bertjax.data.example_packing`; every kind but span).
  """

  def __init__(self, bundle: Pretrained, kind: str, recipe: Recipe, total_steps: int,
               config: ml_collections.ConfigDict, writer: metrics.MetricWriter,
               packed: bool = False):
    if kind not in KINDS:
      raise errors.UsageError(f"kind must be one of {KINDS}, got {kind!r}")
    if packed and kind not in example_packing.KINDS:
      raise errors.UsageError(f"data.pack_examples: {kind} examples are not packed (packing "
                              f"serves {', '.join(example_packing.KINDS)}); set it to False")
    self.kind, self.recipe, self.config, self.writer = kind, recipe, config, writer
    self.packed = packed
    self._pool_last = bundle.config.causal  # a causal model's summary: its last token
    self._train_shape: example_packing.RowShape | None = None
    self.total_steps = max(total_steps, 1)
    self.guard = divergence.DivergenceGuard.from_config(config.divergence)
    self.mesh = sharding.make_mesh([config.mesh.data, config.mesh.fsdp, config.mesh.tensor])
    shards = sharding.batch_shards(self.mesh)
    self._row_multiple = math.lcm(shards, jax.process_count())  # packed rows divide over both
    for name, size in (("train.batch_size", recipe.batch_size),
                       ("train.eval_batch_size", recipe.eval_batch_size)):
      if size % shards or size % jax.process_count():
        raise errors.UsageError(f"{name}={size} does not divide over the {shards} data shards "
                                f"and {jax.process_count()} processes")
    self.rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
    self.model = bundle.model()
    self.optimizer, self.learning_rate_fn = recipe.make_optimizer(self.total_steps)
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    replicated = sharding.replicated(self.mesh)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      abstract = train.abstract_train_state(self.model, self.optimizer, config.seed)
      self.shardings = train.state_shardings(abstract, self.mesh, self.rules)
      self.state = train.train_state_from(bundle.params, self.optimizer, config.seed,
                                          self.shardings)
    self._train_step = jax.jit(
        functools.partial(finetune_step, model=self.model, optimizer=self.optimizer,
                          learning_rate_fn=self.learning_rate_fn, kind=kind),
        in_shardings=(self.shardings, self.batch_sharding),
        out_shardings=(self.shardings, replicated), donate_argnums=0)
    self._predict_step = jax.jit(functools.partial(predict_step, model=self.model),
                                 in_shardings=(self.shardings.params, self.batch_sharding),
                                 out_shardings=replicated)

  def _axis_rules(self):
    """The mesh and logical-axis rules the model's sharding constraints resolve
    against (active while steps are traced and run)."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.mesh))
    stack.enter_context(nn.logical_axis_rules(self.rules))
    return stack

  def _global(self, batch: Features) -> dict[str, Array]:
    """This process's rows of a global batch, assembled into global arrays
    (each array's own: packed multiple choice holds rows and examples)."""
    def local(value: np.ndarray) -> np.ndarray:
      rows = len(value) // jax.process_count()
      return value[jax.process_index() * rows:(jax.process_index() + 1) * rows]

    return {name: jax.make_array_from_process_local_data(self.batch_sharding, local(value))
            for name, value in batch.items()}

  def train_epoch(self, features: Features, epoch: int) -> None:
    """Trains up to the end of `epoch` in the stream of epochs (`train_batches`),
    at most to the run's last step, logging every `log_every_steps`."""
    log_every = self.config.log_every_steps
    step = int(self.state.step)  # counted here, so the host never waits on the device
    stop = min(self.total_steps,
               epoch_end_step(len(features["input_ids"]), self.recipe.batch_size, epoch))
    window = (time.perf_counter(), step)
    pending = None
    for batch in train_batches(features, self.recipe.batch_size, self.config.seed, step,
                               stop):
      if self.packed:
        batch, _ = example_packing.pack(batch, self.kind, self._packed_train_shape(features),
                                        self._pool_last)
      with self._axis_rules():
        self.state, step_metrics = self._train_step(self.state, self._global(batch))
      step += 1
      if pending is not None:
        window = self._report(*pending, window, log_every)
      pending = (step, step_metrics)
    if pending is not None:
      self._report(*pending, window, 1)
    if step >= self.total_steps:
      # The model is saved after the last step, by the rule of any step: with
      # no step after it, losses out of range are judged now.
      self.guard.conclude(self._advice, "the run ended there: its model is not saved")

  def _packed_train_shape(self, features: Features) -> example_packing.RowShape:
    """The rows every training batch of the run packs into (one compiled shape)."""
    if self._train_shape is None:
      lengths = example_packing.lengths_of(features)
      batches = [lengths[rows] for rows in stream_rows(
          len(lengths), self.recipe.batch_size, self.config.seed, 0, self.total_steps)]
      length = features["input_ids"].shape[-1]
      self._train_shape = shape = example_packing.row_shape(batches, length, self._row_multiple)
      tokens = sum(float(batch.sum()) for batch in batches)
      logging.info("Packed rows: %d examples a step in %d rows of %d (at most %d sequences a "
                   "row); padding %.1f%% of the token slots, %.1f%% unpacked",
                   self.recipe.batch_size, shape.rows, length, shape.slots,
                   100 * (1 - tokens / (len(batches) * shape.rows * length)),
                   100 * (1 - tokens / (len(batches) * self.recipe.batch_size * length)))
    return self._train_shape

  def _advice(self) -> str:
    """What to do when the loss diverged."""
    return ("nothing was saved: lower train.learning_rate (now "
            f"{self.recipe.learning_rate:g}) and rerun (the bound: --config.divergence.factor)")

  def _report(self, step: int, device_metrics, window, log_every: int):
    values = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
    # The loss of the weights before the step, whether its update was skipped or not.
    self.guard.update(step, values["loss"], self._advice, values["grad_norm"])
    if values["consecutive_skipped"] >= self.config.max_consecutive_skips:
      raise errors.TrainingStoppedError(
          f"{int(values['consecutive_skipped'])} consecutive steps had a non-finite loss or "
          f"gradients (up to step {step}); lower train.learning_rate or check the data")
    if step % log_every and step != self.total_steps:
      return window
    now = time.perf_counter()
    seconds_per_step = max(now - window[0], 1e-9) / max(step - window[1], 1)
    values["examples_per_s"] = self.recipe.batch_size / seconds_per_step
    # The training steps left; the evaluations between epochs are not in it.
    values["eta_s"] = seconds_per_step * (self.total_steps - step)
    if jax.process_index() == 0:
      metrics.log(metrics.format_line(step, self.total_steps, values))
    self.writer.write(step, values, "train/")
    return now, step

  def predict(self, features: Features, description: str = "predict") -> dict[str, np.ndarray]:
    """The model's outputs for every feature row, in order (float32 numpy)."""
    count = len(features["input_ids"])
    batch_size = self.recipe.eval_batch_size
    length = features["input_ids"].shape[-1]
    batches = ((batch, None) for batch in prediction_batches(features, batch_size))
    if self.packed:  # (packed batch, where its examples went)
      lengths = example_packing.lengths_of(features)
      shape = example_packing.row_shape(
          (lengths[start:start + batch_size] for start in range(0, count, batch_size)),
          length, self._row_multiple)
      batches = (example_packing.pack({name: value[start:start + batch_size]
                                       for name, value in features.items()}, self.kind, shape,
                                      self._pool_last, examples=batch_size)
                 for start in range(0, count, batch_size))
    outputs: dict[str, list[np.ndarray]] = {}
    total_batches = -(-count // batch_size)
    started = time.perf_counter()
    for index, (batch, where) in enumerate(batches):
      with self._axis_rules():
        result = jax.device_get(self._predict_step(self.state.params, self._global(batch)))
      result = {name: np.asarray(value) for name, value in result.items()}
      if where is not None:
        result = example_packing.unpack(result, self.kind, where, length)
      for name, value in result.items():
        outputs.setdefault(name, []).append(value)
      if jax.process_index() == 0 and (index + 1) % 50 == 0:
        logging.info("%s: %d/%d batches, %.0f s", description, index + 1, total_batches,
                     time.perf_counter() - started)
    return {name: np.concatenate(parts)[:count] for name, parts in outputs.items()}

  def params(self) -> Any:
    """The current parameters as host numpy arrays (every process)."""
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(self.state.params, tiled=True)
    return jax.tree.map(np.asarray, gathered)
