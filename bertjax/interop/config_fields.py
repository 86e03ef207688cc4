"""Reference `config.json` keys read into `EncoderConfig` fields, shared by each
family's translation (`bertjax.interop.hf`, `bertjax.interop.modernbert`)."""

from __future__ import annotations

from typing import Any

from bertjax import errors

# Reference activation names -> `EncoderConfig.hidden_act`.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu", "silu": "silu", "swish": "silu"}
ACTIVATION_NAMES = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}

# The sizes every family's config names alike: key -> (EncoderConfig field, type,
# required).
SIZE_KEYS = {
    "vocab_size": ("vocab_size", int, True),
    "hidden_size": ("hidden_size", int, True),
    "num_hidden_layers": ("num_layers", int, True),
    "num_attention_heads": ("num_heads", int, True),
    "intermediate_size": ("intermediate_size", int, True),
}


def read_fields(values: dict[str, Any], keys: dict[str, tuple[str, type, bool]],
                 source: str) -> dict[str, Any]:
  """The `EncoderConfig` fields `keys` (reference key -> (field, type, required))
  name, each checked for its type."""
  fields = {}
  for key, (field, kind, required) in keys.items():
    if key not in values or (values[key] is None and not required):
      if required:
        raise errors.UsageError(f"{source}: required key {key!r} is missing")
      continue
    value = values[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
      raise errors.UsageError(f"{source}: key {key!r} must be an integer, got {value!r}")
    if kind is float and (not isinstance(value, (int, float)) or isinstance(value, bool)):
      raise errors.UsageError(f"{source}: key {key!r} must be a number, got {value!r}")
    if kind is str and not isinstance(value, str):
      raise errors.UsageError(f"{source}: key {key!r} must be a string, got {value!r}")
    fields[field] = float(value) if kind is float else value
  return fields
