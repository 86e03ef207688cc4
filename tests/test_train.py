"""The train step: sharding-invariance, exact accumulation, skips, the loss itself."""

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import optim, sharding, train
from bertjax.models import EncoderConfig
from bertjax.configs.common import LOGICAL_AXIS_RULES

CONFIG = EncoderConfig(vocab_size=120, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=48, max_position_embeddings=32, scan_layers=True)


def _batch(seed=0, batch=8, length=24, predictions=4, vocab=120):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(12, length + 1, batch)
  ids = rng.integers(5, vocab, (batch, length)).astype(np.int32)
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  ids = ids * mask
  positions = np.sort(np.stack([rng.choice(np.arange(1, 11), predictions, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)
  weights = np.ones((batch, predictions), np.float32)
  weights[0, -1] = 0  # a padded prediction
  return {
      "input_ids": ids, "attention_mask": mask,
      "token_type_ids": (np.arange(length)[None] >= lengths[:, None] // 2).astype(np.int32) * mask,
      "masked_positions": positions * (weights > 0),
      "masked_ids": np.take_along_axis(ids, positions, axis=1) * (weights > 0),
      "masked_weights": weights,
      "next_sentence_labels": rng.integers(0, 2, batch).astype(np.int32),
  }


def _run(config, mesh_sizes, steps=3, accumulation=1, batches=None):
  devices = jax.devices()[:int(np.prod(mesh_sizes))]
  mesh = sharding.make_mesh(mesh_sizes, devices)
  model = train.pretraining_model(config, "mlm_nsp")
  schedule = optim.learning_rate_schedule(1e-3, 2, 10)
  optimizer = optim.create_optimizer("adamw", schedule)
  with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_AXIS_RULES):
    abstract = train.abstract_train_state(model, optimizer, 0)
    shardings = train.state_shardings(abstract, mesh, LOGICAL_AXIS_RULES)
    state = train.init_train_state(model, optimizer, 0, shardings)
    step, _ = train.jit_steps(model, optimizer, schedule, "mlm_nsp", accumulation, shardings,
                              sharding.batch_sharding(mesh), sharding.replicated(mesh))
    history = []
    for i in range(steps):
      batch = jax.device_put((batches or [_batch(i)])[i % len(batches or [0])],
                             sharding.batch_sharding(mesh))
      state, metrics = step(state, batch)
      history.append({k: float(v) for k, v in metrics.items()})
    return jax.device_get(state), history


@pytest.fixture(scope="module")
def single_device_run():
  return _run(CONFIG, (1, 1, 1))


@pytest.mark.parametrize("mesh_sizes", [(2, 2, 2), (8, 1, 1), (1, 2, 4)])
def test_sharded_runs_match_one_device(single_device_run, mesh_sizes):
  _, expected = single_device_run
  _, got = _run(CONFIG, mesh_sizes)
  for a, b in zip(got, expected):
    # Same math, other reduction orders: float32 rounding only.
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=2e-6)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=2e-5)


def test_accumulation_computes_the_full_batch_gradient():
  config = CONFIG.replace(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  full_state, full = _run(config, (1, 1, 1), steps=2)
  micro_state, micro = _run(config, (1, 1, 1), steps=2, accumulation=4)
  for a, b in zip(micro, full):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6)
    np.testing.assert_allclose(a["mlm_accuracy"], b["mlm_accuracy"], rtol=1e-6)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7),
               micro_state.params, full_state.params)
  # Sharded too: micro-batches keep each device's rows.
  _, sharded = _run(config, (4, 1, 2), steps=2, accumulation=2)
  np.testing.assert_allclose([m["loss"] for m in sharded], [m["loss"] for m in full], rtol=2e-6)


def test_non_finite_steps_are_skipped_and_counted():
  good = _batch(0)
  bad = dict(good, masked_weights=np.full_like(good["masked_weights"], np.nan))
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  model = train.pretraining_model(CONFIG, "mlm_nsp")
  schedule = optim.learning_rate_schedule(1e-3, 2, 10)
  optimizer = optim.create_optimizer("adamw", schedule)
  state = jax.jit(lambda: nn.meta.unbox(train.create_train_state(model, optimizer, 0)))()
  step = jax.jit(functools.partial(train.train_step, model=model, optimizer=optimizer,
                                   learning_rate_fn=schedule, objective="mlm_nsp"))
  with jax.set_mesh(mesh):
    after_bad, metrics = step(state, bad)
    assert int(metrics["skipped"]) == 1 and int(after_bad.consecutive_skipped) == 1
    jax.tree.map(np.testing.assert_array_equal, after_bad.params, state.params)
    jax.tree.map(np.testing.assert_array_equal, after_bad.opt_state, state.opt_state)
    after_bad2, _ = step(after_bad, bad)
    assert int(after_bad2.consecutive_skipped) == 2 and int(after_bad2.skipped) == 2
    after_good, metrics = step(after_bad2, good)
    assert int(metrics["skipped"]) == 0 and int(after_good.consecutive_skipped) == 0
    assert int(after_good.skipped) == 2 and int(after_good.step) == 3
    # The schedule saw only the real update (its warmup starts at 0, so that
    # one moves nothing); the next one moves the weights.
    assert int(train.optimizer_step(after_good.opt_state)) == 1
    after_more, _ = step(after_good, good)
  assert not np.array_equal(after_more.params["nsp"]["kernel"], state.params["nsp"]["kernel"])


def test_loss_matches_the_reference_pretraining_loss(tmp_path):
  """Our MLM + NSP loss equals transformers' BertForPreTraining loss."""
  import torch
  import transformers

  import bertjax
  from tests import reference

  hf_config = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=48, max_position_embeddings=32)
  model_hf = reference.reference_model("BertForPreTraining", seed=3, **hf_config)
  model_hf.save_pretrained(tmp_path)
  bundle = bertjax.load_pretrained(tmp_path)
  batch = _batch(5)
  batch["masked_weights"][:] = 1  # the reference scores every labelled position
  batch["masked_positions"] = np.stack([np.sort(np.random.default_rng(r).choice(
      np.arange(1, 11), 4, replace=False)) for r in range(8)]).astype(np.int32)
  batch["masked_ids"] = np.take_along_axis(batch["input_ids"], batch["masked_positions"], 1)
  evaluate = jax.jit(functools.partial(train.eval_step, model=bundle.model(),
                                       objective="mlm_nsp"))
  sums = evaluate(bundle.params, batch)
  ours = float(sums["mlm_loss"] / sums["mlm_count"] + sums["nsp_loss"] / sums["nsp_count"])

  labels = np.full(batch["input_ids"].shape, -100)
  np.put_along_axis(labels, batch["masked_positions"], batch["masked_ids"], axis=1)
  with torch.no_grad():
    out = model_hf(input_ids=torch.tensor(batch["input_ids"]).long(),
                   attention_mask=torch.tensor(batch["attention_mask"]).long(),
                   token_type_ids=torch.tensor(batch["token_type_ids"]).long(),
                   labels=torch.tensor(labels).long(),
                   next_sentence_label=torch.tensor(batch["next_sentence_labels"]).long())
  np.testing.assert_allclose(ours, out.loss.item(), rtol=1e-5)


def test_cross_entropy_and_correct_are_optax_and_argmax():
  import optax

  rng = np.random.default_rng(0)
  logits = (rng.normal(size=(4, 5, 300)) * 4).astype(np.float32)
  labels = rng.integers(0, 300, (4, 5)).astype(np.int32)
  labels[0, :3] = logits[0, :3].argmax(-1)  # some right
  losses, correct = jax.jit(train.cross_entropy_and_correct)(logits, labels)
  np.testing.assert_allclose(
      losses, optax.softmax_cross_entropy_with_integer_labels(logits, labels), rtol=1e-6)
  np.testing.assert_array_equal(correct, logits.argmax(-1) == labels)
  grad = jax.grad(lambda x: train.cross_entropy_and_correct(x, labels)[0].sum())(logits)
  want = jax.grad(lambda x: optax.softmax_cross_entropy_with_integer_labels(x, labels).sum())(
      logits)
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_a_tie_for_the_largest_logit_counts_as_correct_and_nan_as_wrong():
  """Where "correct" departs from argmax (documented): a label tied for the
  row's maximum is counted right (argmax takes the first of the tied); a row
  with a NaN is wrong."""
  logits = np.array([[0.0, 2.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, np.nan, 0.0, 0.0]],
                    np.float32)
  labels = np.array([2, 3, 0], np.int32)
  _, correct = jax.jit(train.cross_entropy_and_correct)(logits, labels)
  np.testing.assert_array_equal(correct, [True, True, False])
  assert not (logits.argmax(-1) == labels)[:2].any()


def test_summarize_eval():
  values = train.summarize_eval({"mlm_loss": 20.0, "mlm_correct": 3.0, "mlm_count": 10.0,
                                 "nsp_loss": 3.0, "nsp_correct": 4.0, "nsp_count": 5.0})
  assert values["mlm_loss"] == 2.0 and values["mlm_accuracy"] == 0.3
  np.testing.assert_allclose(values["mlm_perplexity"], np.exp(2.0))
  assert values["nsp_accuracy"] == 0.8 and values["nsp_loss"] == 0.6


def test_no_nsp_objectives_train_the_masked_lm_alone():
  """"No NSP" in both readings: no next-sentence head and no NSP loss; the
  loss is the masked LM's mean over the predictions."""
  from bertjax.configs import base_pretrain
  from bertjax.models import BertForMaskedLM

  assert base_pretrain.get_config("no_nsp").objective == "mlm_pairs"  # the paper's reading
  assert base_pretrain.get_config("no_nsp_packed").objective == "mlm"
  with pytest.raises(ValueError, match="choose one of the ablations"):
    base_pretrain.get_config("no_nsp,no_nsp_packed")
  batch = {k: v for k, v in _batch().items() if k != "next_sentence_labels"}
  model = train.pretraining_model(CONFIG, "mlm_pairs")
  assert isinstance(model, BertForMaskedLM)
  optimizer = optim.create_optimizer("adamw", 0.0)
  state = jax.jit(lambda: nn.meta.unbox(train.create_train_state(model, optimizer, 0)))()
  step = jax.jit(functools.partial(train.train_step, model=model, optimizer=optimizer,
                                   learning_rate_fn=lambda step: 0.0, objective="mlm_pairs"))
  _, metrics = step(state, batch)
  assert "nsp_loss" not in metrics
  np.testing.assert_allclose(metrics["loss"], metrics["mlm_loss"], rtol=1e-6)
