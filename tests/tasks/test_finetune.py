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
