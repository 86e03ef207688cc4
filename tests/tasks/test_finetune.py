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


@pytest.mark.parametrize("kind,task,examples", [
    ("classification", "sequence_classification", 21),
    ("multiple_choice", "multiple_choice", 19),
])
def test_packed_predictions_come_back_in_the_examples_order(kind, task, examples):
  """The fine-tuner's own batching: several prediction batches, the last one
  short, packed into one row count over the 8 devices; the same outputs as
  unpacked rows."""
  import flax.linen as nn
  import jax

  from bertjax import metrics
  from bertjax.configs import glue
  from bertjax.models import BertConfig, build_model, init_params
  from bertjax.pretrained import Pretrained
  from tests.data.test_example_packing import _features

  config = BertConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=32, dtype="float32",
                      hidden_dropout_prob=0.0, attention_dropout_prob=0.0,
                      attention_impl="xla")
  labels = ["a", "b", "c"] if kind == "classification" else None
  model = build_model(config, task, num_labels=3)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  bundle = Pretrained(config, params, None, task, labels)
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
