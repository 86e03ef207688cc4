"""Text in, encoder activations out: the public entry for feature extraction."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import numpy as np

from bertjax import errors
from bertjax.models import EncoderConfig, family
from bertjax.models.bert import encoder, summary_name
from bertjax.pretrained import Pretrained

# Padded lengths are rounded up to this multiple, so that calls with slightly
# different text lengths share one compiled function.
_LENGTH_MULTIPLE = 8


@functools.lru_cache(maxsize=16)
def _encoder_fn(config: EncoderConfig, add_summary: bool) -> Callable:
  model = encoder(config, add_summary=add_summary)

  @jax.jit
  def apply(params, input_ids, attention_mask, token_type_ids):
    out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
    return jax.tree.map(lambda x: x.astype(np.float32), out)

  return apply


def encode(bundle: Pretrained, texts: str | Sequence[str],
           text_pairs: str | Sequence[str] | None = None, max_length: int = 512,
           batch_size: int = 32, output_hidden_states: bool = True) -> dict[str, np.ndarray]:
  """Tokenises and encodes texts (or text pairs) with a pretrained encoder.

  Args:
    bundle: From `bertjax.load_pretrained`; only its encoder is used.
    texts: A text or texts (segment A).
    text_pairs: Segment B for each text, or None.
    max_length: Most tokens per row (longer inputs are truncated), at most the
      model's `max_position_embeddings`.
    batch_size: Rows per device call.
    output_hidden_states: Also return every layer's output.

  Returns:
    numpy arrays, rows in input order, padded to a common length T:
    `input_ids`, `attention_mask`, `token_type_ids` (int32 [N, T]);
    `sequence_output` (float32 [N, T, H]); `pooled_output` (float32 [N, H],
    absent if the checkpoint has no pooler); `hidden_states` (float32
    [num_layers + 1, N, T, H]: the embedding output, then each layer's).
  """
  if bundle.tokenizer is None:
    raise errors.UsageError("This pretrained model has no tokenizer; encode needs one")
  texts = [texts] if isinstance(texts, str) else list(texts)
  if isinstance(text_pairs, str):
    text_pairs = [text_pairs]
  if (text_pairs is not None and family.of(bundle.config).token_types
      and bundle.config.type_vocab_size < 2):
    raise errors.UsageError(f"This model has type_vocab_size={bundle.config.type_vocab_size}: "
                            "it has no token type for a second segment")
  config = bundle.config.replace(return_hidden_states=output_hidden_states)
  max_length = min(max_length, config.max_position_embeddings)
  inputs = bundle.tokenizer.encode_batch(texts, text_pairs, max_length=max_length,
                                         pad_to_multiple_of=_LENGTH_MULTIPLE)
  # On the device once, not once per batch.
  encoder_params = jax.device_put(bundle.params["bert"])
  apply = _encoder_fn(config, add_summary=summary_name(config) in encoder_params)

  results: dict[str, list[np.ndarray]] = {}
  for start in range(0, len(texts), batch_size):
    rows = slice(start, start + batch_size)
    # Pad the last batch with empty rows so every call has the same shape.
    batch = {k: _pad_rows(v[rows], batch_size) for k, v in inputs.items()}
    out = jax.device_get(apply(encoder_params, batch["input_ids"],
                               batch["attention_mask"], batch["token_type_ids"]))
    real = min(batch_size, len(texts) - start)
    results.setdefault("sequence_output", []).append(out.sequence_output[:real])
    if out.pooled_output is not None:
      results.setdefault("pooled_output", []).append(out.pooled_output[:real])
    if out.hidden_states is not None:
      results.setdefault("hidden_states", []).append(out.hidden_states[:, :real])

  outputs = dict(inputs)
  for name, parts in results.items():
    outputs[name] = np.concatenate(parts, axis=1 if name == "hidden_states" else 0)
  return outputs


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
  return np.pad(array, [(0, rows - len(array))] + [(0, 0)] * (array.ndim - 1))
