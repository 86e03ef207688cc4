"""ModernBERT in transformers' format: its classes and `ModernBertConfig`,
translated to and from a ModernBERT `EncoderConfig` (the weights' names:
`bertjax.interop.mapping`). `bertjax.interop.hf` reads and writes the
directories and asks this module for the family's config."""

from __future__ import annotations

from typing import Any

import numpy as np

from bertjax import errors
from bertjax.interop.config_fields import ACTIVATION_NAMES, ACTIVATIONS, SIZE_KEYS, read_fields
from bertjax.models import EncoderConfig

# transformers' ModernBERT classes (it has no next-sentence head).
TASK_TO_CLASS = {
    "encoder": "ModernBertModel",
    "masked_lm": "ModernBertForMaskedLM",
    "sequence_classification": "ModernBertForSequenceClassification",
    "question_answering": "ModernBertForQuestionAnswering",
    "multiple_choice": "ModernBertForMultipleChoice",
    "token_classification": "ModernBertForTokenClassification",
}
CLASS_TO_TASK = {v: k for k, v in TASK_TO_CLASS.items()}
PREFIX = "model."  # of the encoder's weights in a task model's file
# As ModernBERT's own tokenizer says: its models take no token types.
MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]


def class_name(task: str) -> str:
  """transformers' ModernBERT class of a bertjax task model."""
  if task not in TASK_TO_CLASS:
    raise errors.UsageError(f"transformers has no ModernBERT class for the {task} task")
  return TASK_TO_CLASS[task]


# transformers' ModernBertConfig key -> (EncoderConfig field, type, required).
_CONFIG_KEYS = {
    **SIZE_KEYS,
    "max_position_embeddings": ("max_position_embeddings", int, False),
    "hidden_activation": ("hidden_act", str, False),
    "embedding_dropout": ("hidden_dropout_prob", float, False),
    "attention_dropout": ("attention_dropout_prob", float, False),
    # bertjax's own key: transformers applies `attention_dropout` to the
    # attention probabilities and output alike; ModernBERT's training code,
    # and bertjax, set the output's apart (0.1 on it alone in the recipe).
    "attention_output_dropout": ("attention_output_dropout_prob", float, False),
    "mlp_dropout": ("mlp_dropout_prob", float, False),
    "classifier_dropout": ("classifier_dropout", float, False),
    "classifier_pooling": ("classifier_pooling", str, False),
    "norm_eps": ("layer_norm_eps", float, False),
    "initializer_range": ("initializer_range", float, False),
    "pad_token_id": ("pad_token_id", int, False),
    "local_attention": ("local_attention", int, False),
}
# ModernBertConfig options bertjax builds one way only: key -> the value it must have.
_FIXED = {"norm_bias": False, "attention_bias": False, "mlp_bias": False,
                 "decoder_bias": True, "classifier_bias": False, "tie_word_embeddings": True}


def config_from_dict(values: dict[str, Any], source: str) -> EncoderConfig:
  """A ModernBERT `EncoderConfig` from transformers' `ModernBertConfig` (the
  layer_types and rope_parameters of transformers 5, or the
  global_attn_every_n_layers and *_rope_theta of the original release)."""
  architectures = values.get("architectures") or []
  unknown = [a for a in architectures if a not in CLASS_TO_TASK]
  if unknown:
    raise errors.UsageError(f"{source}: unsupported architecture {unknown}; bertjax reads "
                            f"{', '.join(sorted(CLASS_TO_TASK))}")
  for key, needed in _FIXED.items():
    if key in values and values[key] != needed:
      raise errors.UsageError(f"{source}: {key}={values[key]!r} is not supported (bertjax "
                              f"builds ModernBERT with {key}={needed}, as released)")
  fields = {"family": "modernbert", "layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
            "hidden_dropout_prob": 0.0, "attention_dropout_prob": 0.0, "classifier_dropout": 0.0,
            **read_fields(values, _CONFIG_KEYS, source)}
  activation = fields.get("hidden_act", "gelu")
  if activation not in ACTIVATIONS:
    raise errors.UsageError(f"{source}: hidden_activation={activation!r} is not supported; "
                            f"supported: {sorted(ACTIVATIONS)}")
  fields["hidden_act"] = ACTIVATIONS[activation]
  head_activation = values.get("classifier_activation", activation)
  if ACTIVATIONS.get(head_activation) != fields["hidden_act"]:
    raise errors.UsageError(f"{source}: classifier_activation={head_activation!r} differs from "
                            f"hidden_activation={activation!r}; bertjax uses one activation")
  fields["global_attention_every"] = _global_every(values, fields["num_layers"], source)
  fields.update(_rope_thetas(values, source))
  try:
    return EncoderConfig(**fields)
  except ValueError as e:
    raise errors.UsageError(f"{source}: {e}") from None


def _global_every(values: dict[str, Any], num_layers: int, source: str) -> int:
  """Every how many layers one attends globally, from `layer_types` (which must
  be that pattern from layer 0) or `global_attn_every_n_layers`."""
  layer_types = values.get("layer_types")
  if not layer_types:
    every = values.get("global_attn_every_n_layers", 3)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
      raise errors.UsageError(f"{source}: global_attn_every_n_layers must be a positive "
                              f"integer, got {every!r}")
    return every
  if len(layer_types) != num_layers:
    raise errors.UsageError(f"{source}: layer_types has {len(layer_types)} entries for "
                            f"num_hidden_layers={num_layers}")
  global_layers = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
  every = global_layers[1] if len(global_layers) > 1 else num_layers
  expected = ["sliding_attention" if i % every else "full_attention" for i in range(num_layers)]
  if layer_types != expected:
    raise errors.UsageError(f"{source}: layer_types {layer_types} is not global attention every "
                            "n-th layer from layer 0 (the one pattern bertjax builds)")
  return every


def _rope_thetas(values: dict[str, Any], source: str) -> dict[str, float]:
  """global_rope_theta and local_rope_theta, from `rope_parameters` or the
  original keys."""
  thetas = {"global_rope_theta": values.get("global_rope_theta", 160_000.0),
            "local_rope_theta": values.get("local_rope_theta", 10_000.0)}
  parameters = values.get("rope_parameters") or {}
  for kind, field in (("full_attention", "global_rope_theta"),
                      ("sliding_attention", "local_rope_theta")):
    entry = parameters.get(kind) or {}
    if entry.get("rope_type", "default") != "default":
      raise errors.UsageError(f"{source}: rope_parameters.{kind}.rope_type="
                              f"{entry['rope_type']!r} is not supported (only 'default')")
    if "rope_theta" in entry:
      thetas[field] = entry["rope_theta"]
  if values.get("rope_scaling"):
    raise errors.UsageError(f"{source}: rope_scaling is not supported")
  for field, value in thetas.items():
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
      raise errors.UsageError(f"{source}: {field} must be a positive number, got {value!r}")
  return {field: float(value) for field, value in thetas.items()}


def config_to_dict(config: EncoderConfig, task: str) -> dict[str, Any]:
  """transformers' `ModernBertConfig` for a ModernBERT `config`: transformers 5's
  keys, and the original release's (which transformers 4 reads)."""
  every = config.global_attention_every
  return {
      "architectures": [class_name(task)],
      "model_type": "modernbert",
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size,
      "hidden_activation": ACTIVATION_NAMES[config.hidden_act],
      "classifier_activation": ACTIVATION_NAMES[config.hidden_act],
      "max_position_embeddings": config.max_position_embeddings,
      "initializer_range": config.initializer_range,
      "norm_eps": config.layer_norm_eps,
      "pad_token_id": config.pad_token_id,
      "embedding_dropout": config.hidden_dropout_prob,
      "attention_dropout": config.attention_dropout_prob,
      # Set apart only where the model sets it (else it follows the above).
      **({"attention_output_dropout": config.attention_output_dropout_prob}
         if config.attention_output_dropout_prob >= 0 else {}),
      "mlp_dropout": config.mlp_dropout_prob,
      "classifier_dropout": config.head_dropout,
      "classifier_pooling": config.classifier_pooling,
      "local_attention": config.local_attention,
      "layer_types": ["full_attention" if config.is_global_layer(i) else "sliding_attention"
                      for i in range(config.num_layers)],
      "rope_parameters": {
          "full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
          "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta},
      },
      "global_attn_every_n_layers": every,
      "global_rope_theta": config.global_rope_theta,
      "local_rope_theta": config.local_rope_theta,
      **_FIXED,
      "dtype": "float32",
  }


def canonical_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The names of a task model's file: the bare encoder class saves its
  weights without the `model.` prefix."""
  return {(PREFIX + name if name.split(".")[0] in ("embeddings", "layers", "final_norm")
           else name): value for name, value in tensors.items()}


def detect_task(names: set[str], architectures: list[str]) -> str:
  """The task model of a checkpoint: its named class, else its heads."""
  if architectures:
    return CLASS_TO_TASK[architectures[0]]
  if "decoder.bias" in names:
    return "masked_lm"
  return "sequence_classification" if "classifier.weight" in names else "encoder"


def check_tied_decoder(tensors: dict[str, np.ndarray], source: str) -> None:
  """Refuses a masked-LM decoder that is not the word embeddings (bertjax ties
  them, as ModernBERT does)."""
  decoder = tensors.get("decoder.weight")
  embeddings = tensors.get(PREFIX + "embeddings.tok_embeddings.weight")
  if decoder is not None and embeddings is not None and not np.array_equal(decoder,
                                                                           embeddings):
    raise errors.UsageError(f"{source}: decoder.weight differs from the word embeddings; "
                            "bertjax ties them, as ModernBERT does")


def token_ids(tokenizer) -> dict[str, int]:
  """The config's special-token ids: the vocabulary's the model was trained
  with (the preset's are ModernBERT's own tokenizer's; transformers checks
  them against the embedding table)."""
  return dict(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id,
              bos_token_id=tokenizer.cls_id, sep_token_id=tokenizer.sep_id,
              eos_token_id=tokenizer.sep_id)
