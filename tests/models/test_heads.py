"""The output layers' own pieces."""

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models.heads import add_bias


def test_add_bias_has_the_gradient_of_a_plain_addition():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, 7)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(7,)), jnp.float32)
  weights = jnp.asarray(rng.normal(size=(3, 5, 7)), jnp.float32)
  loss = lambda add: lambda x, b: (jnp.tanh(add(x, b)) * weights).sum()
  np.testing.assert_array_equal(add_bias(x, bias), x + bias)
  got = jax.grad(loss(add_bias), (0, 1))(x, bias)
  expected = jax.grad(loss(lambda x, b: x + b), (0, 1))(x, bias)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
