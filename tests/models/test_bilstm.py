"""The feature-based tagger: padding never changes a real word's logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.bilstm import BiLSTMTagger


@pytest.mark.parametrize("combination", ["select", "concat", "weighted_sum"])
def test_padding_does_not_change_real_words(combination):
  model = BiLSTMTagger(5, combination, hidden_size=8, num_layers=2)
  layers = 1 if combination == "select" else 3
  rng = np.random.default_rng(0)
  short = jnp.asarray(rng.normal(size=(1, 4, layers, 6)), jnp.float32)
  padded = jnp.concatenate([short, jnp.asarray(rng.normal(size=(1, 3, layers, 6)),
                                               jnp.float32)], axis=1)
  params = model.init(jax.random.key(0), padded, jnp.ones((1, 7)))
  alone = model.apply(params, short, jnp.ones((1, 4)))
  with_padding = model.apply(params, padded, jnp.array([[1, 1, 1, 1, 0, 0, 0]]))
  np.testing.assert_allclose(with_padding[:, :4], alone, atol=1e-5)
  # Both directions see every real word: changing the last word changes the first.
  changed = short.at[0, 3].add(1.0)
  assert not np.allclose(model.apply(params, changed, jnp.ones((1, 4)))[0, 0], alone[0, 0])
