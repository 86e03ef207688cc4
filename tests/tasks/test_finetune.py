"""The fine-tuning loop's step count and batches, against run_classifier.py's."""

import numpy as np
import pytest

from bertjax.tasks import finetune


@pytest.mark.parametrize("examples,batch,epochs,steps", [
    (3668, 32, 3.0, 343),      # MRPC: 343.875 (3668 // 32 * 3 would be 342)
    (392702, 32, 3.0, 36815),  # MNLI: 36815.8
    (2490, 32, 3.0, 233),      # RTE: 233.4
    (87599, 32, 3.0, 8212),    # SQuAD v1.1 questions, not their windows: 8212.4
    (130319, 48, 2.0, 5429),   # SQuAD v2.0: 5429.96
    (100, 32, 2.5, 7),         # 7.8
])
def test_steps_are_run_classifiers(examples, batch, epochs, steps):
  # run_classifier.py / run_squad.py, worked out by hand:
  # num_train_steps = int(len(train_examples) / FLAGS.train_batch_size * FLAGS.num_train_epochs)
  assert finetune.num_train_steps(examples, batch, epochs) == steps


def _features(count):
  return {"input_ids": np.arange(count)[:, None] * np.ones((1, 4), int),
          "labels": np.arange(count)}


def test_batches_are_one_stream_of_reshuffled_epochs():
  """As `d.repeat()` then `d.batch(drop_remainder=True)` over each epoch's
  shuffle: consecutive slices of the epochs' permutations laid end to end."""
  count, batch, epochs, seed = 50, 8, 3.0, 7
  steps = finetune.num_train_steps(count, batch, epochs)  # int(18.75) = 18
  stream = np.concatenate([np.random.default_rng([seed, e]).permutation(count)
                           for e in range(4)])
  got = [b["labels"] for b in finetune.train_batches(_features(count), batch, seed, 0, steps)]
  assert len(got) == steps == 18
  for k, rows in enumerate(got):
    np.testing.assert_array_equal(rows, stream[k * batch:(k + 1) * batch])
  seen = np.bincount(np.concatenate(got), minlength=count)
  # 144 rows: every example twice (two whole epochs), 44 of them a third time;
  # the batch at step 6 spans epochs 0 and 1: nothing is dropped at an epoch's end.
  assert seen.min() == 2 and seen.sum() == 144 and (seen == 3).sum() == 44
  assert set(got[6][:2]) <= set(stream[:50]) and set(got[6][2:]) <= set(stream[50:100])
  # Starting at any step gives the same batches (no state but the step).
  later = list(finetune.train_batches(_features(count), batch, seed, 11, 14))
  for k, b in zip(range(11, 14), later):
    np.testing.assert_array_equal(b["labels"], got[k])
    np.testing.assert_array_equal(b["input_ids"][:, 0], got[k])


def test_mrpc_trains_the_originals_343_steps():
  assert finetune.num_train_steps(3668, 32, 3.0) == 343  # not 3668 // 32 * 3 = 342


def test_epoch_ends_and_small_sets():
  assert [finetune.epoch_end_step(50, 8, e) for e in range(3)] == [6, 12, 18]
  # Fewer examples than a batch: a batch takes them from several epochs.
  rows = next(finetune.train_batches(_features(5), 12, 0, 0, 1))["labels"]
  assert sorted(rows) == sorted(list(range(5)) * 2 + list(rows[10:]))
  recipe = finetune.Recipe(learning_rate=1e-5, batch_size=32, epochs=3.0)
  assert finetune.run_steps(11, "training examples", recipe) == 1
  with pytest.raises(ValueError, match="10 training examples x train.epochs=3.0 make no "
                     "batch of train.batch_size=32"):
    finetune.run_steps(10, "training examples", recipe)


def _bundle(task="sequence_classification", labels=("a", "b", "c")):
  """A tiny random model (L2/H32, float32, no dropout) in a task model."""
  import flax.linen as nn
  import jax

  from bertjax.models import EncoderConfig, build_model, init_params
  from bertjax.pretrained import Pretrained

  config = EncoderConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=32, dtype="float32",
                      hidden_dropout_prob=0.0, attention_dropout_prob=0.0,
                      attention_impl="xla")
  model = build_model(config, task, num_labels=3)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  return Pretrained(config, params, None, task, list(labels) if labels else None)


@pytest.mark.parametrize("kind,task,examples", [
    ("classification", "sequence_classification", 21),
    ("multiple_choice", "multiple_choice", 19),
])
def test_packed_predictions_come_back_in_the_examples_order(kind, task, examples):
  """The fine-tuner's own batching: several prediction batches, the last one
  short, packed into one row count over the 8 devices; the same outputs as
  unpacked rows."""
  from bertjax import metrics
  from bertjax.configs import glue
  from tests.data.test_example_packing import _features

  labels = ["a", "b", "c"] if kind == "classification" else None
  bundle = _bundle(task, labels)
  run_config = glue.get_config("mrpc")  # over the 8 devices: rows in eights
  recipe = finetune.Recipe(learning_rate=1e-5, batch_size=8, epochs=1.0, eval_batch_size=16)
  sequences = examples * (4 if kind == "multiple_choice" else 1)
  features = _features(kind, np.random.default_rng(3).integers(3, 32, sequences))
  writer = metrics.MetricWriter("/tmp/unused", enabled=False)
  outputs = {packed: finetune.FineTuner(bundle, kind, recipe, 1, run_config, writer,
                                        packed=packed).predict(features)["logits"]
             for packed in (False, True)}
  assert outputs[True].shape == outputs[False].shape == (examples, 3 if labels else 4)
  np.testing.assert_allclose(outputs[True], outputs[False], rtol=1e-4, atol=1e-5)


def _train(optimizer, opt_state, params, steps=4):
  """`params` after `steps` updates of fixed gradients whose global norms
  (5, 0.2, 2, 0.05) vary, so that clipping at 0.5 or at 1 changes the ratios
  Adam sees; returned flat, float64 [parameters]."""
  import jax
  import jax.numpy as jnp
  import optax

  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(0)
  for norm in (5.0, 0.2, 2.0, 0.05)[:steps]:
    grads = [rng.normal(size=np.shape(leaf)).astype(np.float32) for leaf in leaves]
    scale = norm / np.sqrt(sum(np.square(g).sum() for g in grads))
    grads = jax.tree.unflatten(tree, [jnp.asarray(g * scale) for g in grads])
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
  return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(params)]).astype(np.float64)


# Every optimisation setting of a fine-tuning config, each unlike the shipped one.
_CHANGED_SETTINGS = {"learning_rate": 3e-2, "warmup_proportion": 0.3, "weight_decay": 0.3,
                     "eps": 1e-3, "max_grad_norm": 0.5, "bias_correction": True}


@pytest.mark.parametrize("changed", [False, True], ids=["shipped", "changed"])
def test_the_fine_tuners_optimizer_follows_every_setting_of_its_config(changed):
  """The FineTuner's own optimizer and schedule (what its step runs), built
  from the shipped config and from one whose every optimisation setting
  differs, update as AdamW with the config's settings; with any one setting
  taken from the other config (a fine-tuner that ignores the config and fixes
  it, at whichever value) they would update otherwise."""
  import jax
  import jax.numpy as jnp

  from bertjax import metrics, optim
  from bertjax.configs import glue

  total_steps = 10
  config = glue.get_config("mrpc")
  shipped = {name: config.train[name] for name in _CHANGED_SETTINGS}
  assert all(shipped[name] != value for name, value in _CHANGED_SETTINGS.items())
  settings, other = ((_CHANGED_SETTINGS, shipped) if changed else (shipped, _CHANGED_SETTINGS))
  config.train.update(settings)
  config.train.batch_size = config.train.eval_batch_size = 8
  recipe = finetune.Recipe.from_config(config)
  writer = metrics.MetricWriter("/tmp/unused", enabled=False)
  tuner = finetune.FineTuner(_bundle(), "classification", recipe, total_steps, config, writer)
  params = jax.tree.map(jnp.asarray, tuner.params())
  got = _train(tuner.optimizer, jax.tree.map(jnp.asarray, jax.device_get(tuner.state.opt_state)),
               params)

  def adamw(settings):
    schedule = optim.learning_rate_schedule(
        settings["learning_rate"], int(settings["warmup_proportion"] * total_steps), total_steps)
    optimizer = optim.create_optimizer(
        "adamw", schedule, weight_decay=settings["weight_decay"], b1=0.9, b2=0.999,
        eps=settings["eps"], max_grad_norm=settings["max_grad_norm"],
        bias_correction=settings["bias_correction"])
    return optimizer, schedule

  optimizer, schedule = adamw(settings)
  np.testing.assert_allclose(got, _train(optimizer, optimizer.init(params), params),
                             rtol=1e-6, atol=1e-9)
  steps = np.arange(total_steps + 1)
  np.testing.assert_allclose(tuner.learning_rate_fn(steps), schedule(steps), rtol=1e-6)
  start = np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(params)])
  for name in settings:
    ignored, _ = adamw(dict(settings, **{name: other[name]}))
    moved = np.abs(_train(ignored, ignored.init(params), params) - got).max()
    assert moved > 1e-3 * np.abs(got - start).max(), name


def test_the_fine_tuners_step_skips_a_non_finite_loss_as_pre_training_does():
  """`train.apply_gradients` in the fine-tuner's step: the state and optimizer
  kept, the step counted, the metrics named as before."""
  import jax

  from bertjax import metrics
  from bertjax.configs import glue
  from tests.data.test_example_packing import _features

  config = glue.get_config("mrpc")
  config.train.batch_size = config.train.eval_batch_size = 8
  recipe = finetune.Recipe.from_config(config)
  writer = metrics.MetricWriter("/tmp/unused", enabled=False)
  tuner = finetune.FineTuner(_bundle(), "classification", recipe, 10, config, writer)
  good = _features("classification", np.random.default_rng(1).integers(3, 32, 8))
  bad = dict(good, weights=np.full(8, np.nan, np.float32))

  def step(batch):
    with tuner._axis_rules():
      tuner.state, step_metrics = tuner._train_step(tuner.state, tuner._global(batch))
    return jax.device_get(tuner.state), {k: float(v) for k, v in step_metrics.items()}

  before = jax.device_get(tuner.state)
  after, step_metrics = step(bad)
  assert set(step_metrics) == {"loss", "learning_rate", "grad_norm", "skipped_total",
                               "consecutive_skipped", "accuracy"}
  assert step_metrics["skipped_total"] == step_metrics["consecutive_skipped"] == 1
  assert int(after.step) == 1
  jax.tree.map(np.testing.assert_array_equal, after.params, before.params)
  jax.tree.map(np.testing.assert_array_equal, after.opt_state, before.opt_state)
  after, step_metrics = step(good)
  assert step_metrics["skipped_total"] == 1 and step_metrics["consecutive_skipped"] == 0
  # The rate logged is the one the update used: the optimizer's count, which
  # the skipped step left at 0.
  assert step_metrics["learning_rate"] == float(tuner.learning_rate_fn(0))
  assert int(after.step) == 2 and int(after.skipped) == 1
