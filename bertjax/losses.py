"""Pre-training losses and accuracies, computed in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

Array = jax.Array


def masked_lm_loss(logits: Array, labels: Array, weights: Array) -> tuple[Array, Array]:
  """Mean cross-entropy and accuracy over the real masked positions.

  Args:
    logits: [batch, max_predictions, vocab] at the gathered positions.
    labels: [batch, max_predictions] original token ids.
    weights: [batch, max_predictions], 1 for real predictions, 0 for padding.

  Returns:
    (loss, accuracy), scalars.
  """
  weights = weights.astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  total = jnp.maximum(weights.sum(), 1.0)
  correct = (logits.argmax(-1) == labels).astype(jnp.float32)
  return (losses * weights).sum() / total, (correct * weights).sum() / total


def next_sentence_loss(logits: Array, labels: Array) -> tuple[Array, Array]:
  """Mean cross-entropy and accuracy of [batch, 2] logits (0 = "is next")."""
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  return losses.mean(), (logits.argmax(-1) == labels).mean()
