"""Fine-tuning examples packed several to a row: the same losses, gradients and
predictions as the unpacked rows, from the same model."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.data import example_packing
from bertjax.models import EncoderConfig, build_model, init_params
from bertjax.tasks import finetune

LENGTH = 32


def _features(kind, lengths, seed=0):
  """Padded examples as the task modules make them: [CLS] ... [SEP], two segments."""
  rng = np.random.default_rng(seed)
  count = len(lengths)
  features = {"input_ids": np.zeros((count, LENGTH), np.int32),
              "attention_mask": np.zeros((count, LENGTH), np.int32),
              "token_type_ids": np.zeros((count, LENGTH), np.int32),
              "weights": np.ones(count, np.float32)}
  for row, size in enumerate(lengths):
    features["input_ids"][row, :size] = rng.integers(5, 99, size)
    features["attention_mask"][row, :size] = 1
    features["token_type_ids"][row, size // 2:size] = 1
  if kind == "classification":
    features["labels"] = rng.integers(0, 3, count).astype(np.int32)
  elif kind == "multiple_choice":  # consecutive sequences are an example's choices
    choices = 4
    features = {name: value.reshape(count // choices, choices, LENGTH)
                for name, value in features.items() if name != "weights"}
    features["labels"] = rng.integers(0, choices, count // choices).astype(np.int32)
    features["weights"] = np.ones(count // choices, np.float32)
  elif kind == "regression":
    features["labels"] = rng.uniform(0, 5, count).astype(np.float32)
  else:
    features["labels"] = rng.integers(0, 3, (count, LENGTH)).astype(np.int32)
    features["label_weights"] = (features["attention_mask"]
                                 * rng.integers(0, 2, (count, LENGTH))).astype(np.float32)
  return features


def test_first_fit_puts_the_longest_first_into_the_first_row_with_room():
  assert example_packing.first_fit(np.array([10, 20, 5, 30, 2]), 32) == [[3, 4], [1, 0], [2]]
  with pytest.raises(ValueError, match="an example of 40 tokens does not fit rows of 32"):
    example_packing.first_fit(np.array([10, 40]), 32)


def test_the_row_shape_holds_every_batch_and_divides_over_the_shards():
  batches = [np.array([30, 30, 30]), np.array([4, 4, 4, 4, 4, 4, 4, 4])]
  assert example_packing.row_shape(batches, 32) == example_packing.RowShape(3, 8)
  assert example_packing.row_shape(batches, 32, multiple=4) == example_packing.RowShape(4, 8)


@pytest.mark.parametrize("kind", ["classification", "token"])
def test_a_packed_batch_lays_out_each_example_and_reads_back(kind):
  features = _features(kind, [12, 20, 7, 30, 9])
  packed, where = example_packing.pack(features, kind, example_packing.RowShape(4, 3))
  # Rows: [30], [20, 12] (first fit, longest first), then [9, 7].
  np.testing.assert_array_equal(packed["segment_ids"][1], [1] * 20 + [2] * 12)
  np.testing.assert_array_equal(packed["segment_ids"][3], 0)  # an empty row
  assert (where.row.tolist(), where.offset.tolist()) == ([1, 1, 2, 0, 2], [20, 0, 9, 0, 0])
  for example in range(5):
    row, offset, size = where.row[example], where.offset[example], where.length[example]
    np.testing.assert_array_equal(packed["input_ids"][row, offset:offset + size],
                                  features["input_ids"][example, :size])
    np.testing.assert_array_equal(packed["token_type_ids"][row, offset:offset + size],
                                  features["token_type_ids"][example, :size])
  if kind == "classification":
    np.testing.assert_array_equal(packed["pool_positions"][1, :2], [0, 20])
    assert packed["weights"].sum() == 5 and packed["weights"][3].sum() == 0
    slots = example_packing.unpack({"labels": packed["labels"]}, kind, where, LENGTH)
    np.testing.assert_array_equal(slots["labels"], features["labels"])
  else:
    tokens = example_packing.unpack({"labels": packed["labels"],
                                     "label_weights": packed["label_weights"]},
                                    kind, where, LENGTH)
    np.testing.assert_array_equal(tokens["labels"] * features["attention_mask"],
                                  features["labels"] * features["attention_mask"])
    np.testing.assert_array_equal(tokens["label_weights"], features["label_weights"])


def test_a_batch_beyond_its_shape_is_refused():
  features = _features("classification", [30, 30, 30])
  with pytest.raises(ValueError, match="packs into 3 rows"):
    example_packing.pack(features, "classification", example_packing.RowShape(2, 4))


@pytest.mark.parametrize("kind,task,labels,causal", [
    ("classification", "sequence_classification", 3, False),
    ("classification", "sequence_classification", 3, True),  # pools the last token
    ("regression", "sequence_classification", 1, False),
    ("token", "token_classification", 3, False),
    ("multiple_choice", "multiple_choice", 1, False),
])
def test_packed_rows_give_the_unpacked_losses_gradients_and_predictions(kind, task, labels,
                                                                          causal):
  config = EncoderConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=LENGTH, dtype="float32",
                      hidden_dropout_prob=0.0, attention_dropout_prob=0.0,
                      attention_impl="xla", causal=causal)
  model = build_model(config, task, num_labels=labels)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  features = _features(kind, [12, 20, 7, 30, 9, 3, 17, 25], seed=1)
  packed, where = example_packing.pack(features, kind, example_packing.RowShape(6, 4),
                                       pool_last=causal, examples=4)
  assert len(where.row) == 8 and where.row.max() < 6
  if kind == "multiple_choice":  # two examples, padded to four of weight 0
    assert packed["choice_slots"].shape == (4, 4) and packed["weights"].tolist() == [1, 1, 0, 0]
    features = {name: np.concatenate([value, np.zeros_like(value)]) for name, value in
                features.items()}  # the same two examples, then two of weight 0

  def loss(params, batch):
    outputs = model.apply({"params": params}, **finetune._model_inputs(batch),
                          deterministic=True)
    sums = finetune.loss_sums(kind, outputs, batch)
    return sums["loss"] / sums["count"], (sums, outputs)

  gradient = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (plain_loss, (plain_sums, plain_out)), plain_grads = gradient(params, features)
  (packed_loss, (packed_sums, packed_out)), packed_grads = gradient(params, packed)
  np.testing.assert_allclose(packed_loss, plain_loss, rtol=2e-5)
  assert float(packed_sums["count"]) == float(plain_sums["count"])
  assert float(packed_sums["correct"]) == float(plain_sums["correct"])
  for plain, other in zip(jax.tree.leaves(plain_grads), jax.tree.leaves(packed_grads)):
    np.testing.assert_allclose(other, plain, rtol=2e-4, atol=2e-6)
  read_back = example_packing.unpack({"logits": np.asarray(packed_out["logits"])}, kind, where,
                                     LENGTH)["logits"]
  plain_logits = np.asarray(plain_out["logits"])
  if kind == "token":  # padding positions are zero when read back
    plain_logits = plain_logits * features["attention_mask"][..., None]
  if kind == "multiple_choice":  # the examples of weight 0 score nothing in particular
    read_back, plain_logits = read_back[:2], plain_logits[:2]
  np.testing.assert_allclose(read_back, plain_logits, rtol=1e-4, atol=1e-5)
