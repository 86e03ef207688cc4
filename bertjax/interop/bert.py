"""BERT in transformers' format: its classes and `BertConfig`, translated to
and from bertjax's `EncoderConfig` (the weights' names: `bertjax.interop.mapping`).
`bertjax.interop.hf` reads and writes the directories and asks this module
(or another family's, `interop/modernbert.py`) for the family's part."""

from __future__ import annotations

from typing import Any

import numpy as np

from bertjax import errors
from bertjax.interop.config_fields import ACTIVATION_NAMES, ACTIVATIONS, SIZE_KEYS, read_fields
from bertjax.models import EncoderConfig

# bertjax task <-> reference class.
TASK_TO_CLASS = {
    "encoder": "BertModel",
    "pretraining": "BertForPreTraining",
    "masked_lm": "BertForMaskedLM",
    "next_sentence": "BertForNextSentencePrediction",
    "sequence_classification": "BertForSequenceClassification",
    "question_answering": "BertForQuestionAnswering",
    "multiple_choice": "BertForMultipleChoice",
    "token_classification": "BertForTokenClassification",
}
CLASS_TO_TASK = {v: k for k, v in TASK_TO_CLASS.items()}
# The reference's masked-LM class for decoders shares our weights; its causal
# mask is `EncoderConfig.causal`.
CLASS_TO_TASK["BertLMHeadModel"] = "masked_lm"
PREFIX = "bert."  # of the encoder's weights in a task model's file
MODEL_INPUT_NAMES = None  # the tokenizer's default: token types too


def class_name(task: str) -> str:
  """transformers' BERT class of a bertjax task model."""
  return TASK_TO_CLASS[task]


# Reference config key -> (EncoderConfig field, type, required).
_CONFIG_KEYS = {
    **SIZE_KEYS,
    "max_position_embeddings": ("max_position_embeddings", int, True),
    "type_vocab_size": ("type_vocab_size", int, True),
    "hidden_act": ("hidden_act", str, False),
    "hidden_dropout_prob": ("hidden_dropout_prob", float, False),
    "attention_probs_dropout_prob": ("attention_dropout_prob", float, False),
    "classifier_dropout": ("classifier_dropout", float, False),
    "layer_norm_eps": ("layer_norm_eps", float, False),
    "initializer_range": ("initializer_range", float, False),
    "pad_token_id": ("pad_token_id", int, False),
}


def config_from_dict(values: dict[str, Any], source: str) -> EncoderConfig:
  """An `EncoderConfig` from transformers' `BertConfig` (Google's `bert_config.json`:
  `bertjax.interop.google_tf.config_from_dict`)."""
  model_type = values.get("model_type", "bert")
  architectures = values.get("architectures") or []
  if model_type != "bert" or any(a not in CLASS_TO_TASK for a in architectures):
    raise errors.UsageError(
        f"{source}: unsupported architecture (model_type={model_type!r}, "
        f"architectures={architectures}); bertjax reads BERT checkpoints "
        f"({', '.join(sorted(CLASS_TO_TASK))})")
  if values.get("position_embedding_type", "absolute") != "absolute":
    raise errors.UsageError(f"{source}: position_embedding_type="
                            f"{values['position_embedding_type']!r} is not supported (only "
                            "'absolute', the paper's learned positions)")
  if values.get("add_cross_attention"):
    raise errors.UsageError(f"{source}: add_cross_attention=true (an encoder-decoder BERT) is "
                            "not supported")
  fields = read_fields(values, _CONFIG_KEYS, source)
  if "hidden_act" in fields:
    if fields["hidden_act"] not in ACTIVATIONS:
      raise errors.UsageError(f"{source}: hidden_act={fields['hidden_act']!r} is not supported; "
                              f"supported: {sorted(ACTIVATIONS)}")
    fields["hidden_act"] = ACTIVATIONS[fields["hidden_act"]]
  if values.get("is_decoder"):
    fields["causal"] = True
  try:
    return EncoderConfig(**fields)
  except ValueError as e:
    raise errors.UsageError(f"{source}: {e}") from None


def config_to_dict(config: EncoderConfig, task: str) -> dict[str, Any]:
  """transformers' `BertConfig` for `config` and a task model."""
  return {
      # A causal masked LM is the reference's decoder class.
      "architectures": ["BertLMHeadModel" if task == "masked_lm" and config.causal
                        else TASK_TO_CLASS[task]],
      "model_type": "bert",
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size,
      "hidden_act": ACTIVATION_NAMES[config.hidden_act],
      "hidden_dropout_prob": config.hidden_dropout_prob,
      "attention_probs_dropout_prob": config.attention_dropout_prob,
      "classifier_dropout": config.classifier_dropout,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size,
      "initializer_range": config.initializer_range,
      "layer_norm_eps": config.layer_norm_eps,
      "pad_token_id": config.pad_token_id,
      "position_embedding_type": "absolute",
      "is_decoder": config.causal,
      "tie_word_embeddings": True,
      "dtype": "float32",
  }


def canonical_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The names of a task model's file: the `bert.` prefix (the bare encoder
  class saves its weights without it) and weight/bias leaf names (TF's
  gamma/beta in old PyTorch files)."""
  renamed = {}
  for name, value in tensors.items():
    name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
        "LayerNorm.beta", "LayerNorm.bias")
    if name.split(".")[0] in ("embeddings", "encoder", "pooler"):
      name = "bert." + name  # saved by the bare encoder class
    renamed[name] = value
  return renamed


def detect_task(names: set[str], architectures: list[str]) -> str:
  """The task model that holds all the heads of a reference checkpoint.

  Weights with both pre-training heads load as "pretraining" whatever class the
  config names (Google's bert-base-uncased says BertForMaskedLM but carries
  the next-sentence head too); otherwise the named class decides, and without
  one the heads present.
  """
  if {"cls.predictions.bias", "cls.seq_relationship.weight"} <= names:
    return "pretraining"
  if architectures:
    return CLASS_TO_TASK[architectures[0]]
  if "cls.seq_relationship.weight" in names:
    return "next_sentence"
  if "cls.predictions.bias" in names:
    return "masked_lm"
  if "qa_outputs.weight" in names:
    return "question_answering"
  if "classifier.weight" in names:
    return "sequence_classification"
  return "encoder"


def check_tied_decoder(tensors: dict[str, np.ndarray], source: str) -> None:
  """Checks the MLM decoder is tied, as bertjax (and BERT) ties it.

  Takes the output bias from `cls.predictions.decoder.bias` when only that is
  stored.
  """
  embeddings = tensors.get("bert.embeddings.word_embeddings.weight")
  decoder = tensors.get("cls.predictions.decoder.weight")
  if decoder is not None and embeddings is not None and not np.array_equal(decoder,
                                                                           embeddings):
    raise errors.UsageError(f"{source}: cls.predictions.decoder.weight differs from the word "
                            "embeddings; bertjax ties them, as BERT does")
  bias, decoder_bias = (tensors.get("cls.predictions.bias"),
                        tensors.get("cls.predictions.decoder.bias"))
  if bias is None and decoder_bias is not None:
    tensors["cls.predictions.bias"] = decoder_bias
  elif bias is not None and decoder_bias is not None and not np.array_equal(bias,
                                                                            decoder_bias):
    raise errors.UsageError(f"{source}: cls.predictions.decoder.bias differs from "
                            "cls.predictions.bias; they are one tensor in BERT")


def token_ids(tokenizer) -> dict[str, int]:
  """The config's special-token ids: BERT's config has the padding id only."""
  del tokenizer
  return {}
