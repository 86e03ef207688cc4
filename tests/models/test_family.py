"""A model family is data: a test-only family, registered as docs/architecture.md
says a new one is (a `Family` line, an interop module and its name table),
trains a step, converts to Hugging Face's format and back, and reports its
FLOPs through the code every family goes through."""

import dataclasses
import functools
import types

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import errors, flops, optim, pretrained, train
from bertjax.interop import bert as bert_interop
from bertjax.interop import hf, mapping
from bertjax.models import EncoderConfig, family


@pytest.fixture
def toy(monkeypatch):
  """"toy": BERT's encoder, without a next-sentence head, under a name of its
  own in every registry (and nowhere else)."""
  monkeypatch.setitem(family.FAMILIES, "toy", dataclasses.replace(
      family.FAMILIES["bert"], name="toy", title="Toy", objectives=("mlm",),
      objectives_said="masked LM only", next_sentence=False))
  interop = types.SimpleNamespace(**{name: getattr(bert_interop, name)
                                     for name in dir(bert_interop) if not name.startswith("_")})
  interop.config_from_dict = lambda values, source: dataclasses.replace(
      bert_interop.config_from_dict({**values, "model_type": "bert"}, source), family="toy")
  interop.config_to_dict = lambda config, task: {
      **bert_interop.config_to_dict(config, task), "model_type": "toy"}
  monkeypatch.setitem(hf.FAMILIES, "toy", interop)
  monkeypatch.setitem(mapping._TABLES, "toy", mapping._TABLES["bert"])
  monkeypatch.setitem(mapping.ENCODER_PREFIXES, "toy", mapping.ENCODER_PREFIXES["bert"])
  return EncoderConfig(family="toy", vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                    intermediate_size=48, max_position_embeddings=32, dtype="float32")


def test_a_registered_family_trains_converts_and_counts_its_flops(toy, tmp_path):
  with pytest.raises(errors.UsageError, match="'mlm_nsp' is not Toy's: Toy pre-trains with "
                     "masked LM only"):
    train.pretraining_model(toy, "mlm_nsp")

  model = train.pretraining_model(toy, "mlm")
  optimizer = optim.create_optimizer("adamw", 1e-3)
  state = jax.jit(lambda: nn.meta.unbox(train.create_train_state(model, optimizer, 0)))()
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 64, (4, 16)).astype(np.int32)
  batch = {"input_ids": ids, "attention_mask": np.ones_like(ids),
           "token_type_ids": np.zeros_like(ids),
           "masked_positions": np.tile(np.arange(1, 4, dtype=np.int32), (4, 1)),
           "masked_ids": ids[:, 1:4], "masked_weights": np.ones((4, 3), np.float32)}
  step = jax.jit(functools.partial(train.train_step, model=model, optimizer=optimizer,
                                   learning_rate_fn=lambda step: 1e-3, objective="mlm"))
  state, metrics = step(state, batch)
  assert np.isfinite(float(metrics["loss"])) and int(state.step) == 1

  bundle = pretrained.Pretrained(toy, jax.device_get(state.params), None, "masked_lm")
  pretrained.export_hf(bundle, str(tmp_path / "hf"))
  back = pretrained.load_pretrained(str(tmp_path / "hf"))
  assert back.config.family == "toy" and back.task == "masked_lm"
  jax.tree.map(np.testing.assert_array_equal, back.params, bundle.params)

  bert = dataclasses.replace(toy, family="bert")
  assert flops.flops_per_token(toy, 16, 3) < flops.flops_per_token(bert, 16, 3)  # no NSP head
  assert flops.model_flops(toy, 64, 256, 12, 0) == flops.model_flops(bert, 64, 256, 12, 0)
