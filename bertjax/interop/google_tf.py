"""Google's original TensorFlow BERT checkpoints (`bert_model.ckpt.*`).

Variable names are translated to the reference naming of
`bertjax.interop.mapping` (kernels transposed to [out, in]); the checkpoint is
read with `tf.train.load_checkpoint`, which needs the `[tf]` extra.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re

import numpy as np

from bertjax import errors
from bertjax.interop import hf
from bertjax.models.config import EncoderConfig

CONFIG_FILE = "bert_config.json"
# `bert_config.json`'s activation names -> `EncoderConfig.hidden_act`. The
# original `modeling.py` maps "gelu" to its `gelu`, the tanh approximation
# (0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))), not the exact erf form that
# Hugging Face's "gelu" means.
_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu"}

logger = logging.getLogger(__name__)

# The last part of every model variable's name; anything else (optimizer slots
# such as `kernel/adam_m` or `kernel/Adam`, moving averages, `global_step`) is
# training state, skipped and counted.
_MODEL_LEAVES = ("kernel", "bias", "gamma", "beta", "word_embeddings",
                 "position_embeddings", "token_type_embeddings", "output_weights",
                 "output_bias")
# TF2 object-based checkpoints (TF Model Garden) name variables after objects.
_TF2_MARKERS = ("_CHECKPOINTABLE_OBJECT_GRAPH", ".ATTRIBUTES/VARIABLE_VALUE")


def config_from_dict(values: dict, source: str) -> EncoderConfig:
  """An `EncoderConfig` from a Google `bert_config.json`, in the original's meaning.

  Its keys are the reference's (`bertjax.interop.hf.config_from_dict`), but
  `hidden_act` names `modeling.py`'s functions: "gelu" is the tanh
  approximation there.
  """
  activation = values.get("hidden_act", "gelu")
  if activation not in _ACTIVATIONS:
    raise errors.UsageError(f"{source}: hidden_act={activation!r} is not supported; supported: "
                            f"{sorted(_ACTIVATIONS)}")
  config = hf.config_from_dict({**values, "hidden_act": "gelu"}, source)
  return dataclasses.replace(config, hidden_act=_ACTIVATIONS[activation])


def find_checkpoint(directory: str) -> str:
  """The checkpoint prefix in `directory` (`.../bert_model.ckpt`).

  Takes `bert_model.ckpt` (Google's releases), else the one the `checkpoint`
  state file names, else the only `*.ckpt*.index`; several without a state
  file is an error that lists them.
  """
  preferred = os.path.join(directory, "bert_model.ckpt")
  if os.path.isfile(preferred + ".index"):
    return preferred
  state = os.path.join(directory, "checkpoint")
  if os.path.isfile(state):
    with open(state, encoding="utf-8-sig") as f:  # a byte-order mark would hide line 1
      match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', f.read(), re.M)
    if match:
      named = os.path.join(directory, os.path.basename(match.group(1)))
      if os.path.isfile(named + ".index"):
        return named
  prefixes = sorted(p[:-len(".index")] for p in glob.glob(os.path.join(directory,
                                                                       "*.ckpt*.index")))
  if not prefixes:
    raise errors.MissingFileError(f"{directory}: no TensorFlow checkpoint (*.ckpt*.index)")
  if len(prefixes) > 1:
    raise errors.UsageError(f"{directory}: several checkpoints and no 'checkpoint' file saying "
                            f"which is latest: {[os.path.basename(p) for p in prefixes]}; pass "
                            "the prefix of the one to load (e.g. .../model.ckpt-10000)")
  return prefixes[0]


def reference_name(variable: str) -> tuple[str, bool]:
  """(reference name, whether to transpose) of a TF variable name."""
  special = {
      "cls/predictions/output_bias": "cls.predictions.bias",
      "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
      "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
      # run_classifier.py and run_squad.py add their output layers unscoped.
      "output_weights": "classifier.weight",
      "output_bias": "classifier.bias",
      "cls/squad/output_weights": "qa_outputs.weight",
      "cls/squad/output_bias": "qa_outputs.bias",
  }
  if variable in special:
    return special[variable], False
  name = re.sub(r"layer_(\d+)", r"layer.\1", variable).replace("/", ".")
  if name.endswith("_embeddings"):
    return name + ".weight", False
  for tf_leaf, leaf, transpose in ((".kernel", ".weight", True), (".gamma", ".weight", False),
                                   (".beta", ".bias", False)):
    if name.endswith(tf_leaf):
      return name[:-len(tf_leaf)] + leaf, transpose
  return name, False


def read_checkpoint(prefix: str) -> dict[str, np.ndarray]:
  """The model weights of a TF checkpoint, under reference names."""
  try:
    import tensorflow as tf
  except ImportError:
    raise errors.MissingDependencyError(
        f"{prefix} is a TensorFlow checkpoint; install the [tf] extra "
        "(pip install 'bertjax[tf]') to read it") from None
  try:
    reader = tf.train.load_checkpoint(prefix)
  except Exception as e:  # TF raises several types for unreadable checkpoints.
    raise errors.UsageError(f"{prefix}: cannot read the TensorFlow checkpoint ({e})") from None
  variables = sorted(reader.get_variable_to_shape_map())
  if any(marker in v for v in variables for marker in _TF2_MARKERS):
    raise errors.UsageError(f"{prefix}: a TF2 object-based checkpoint (e.g. TF Model Garden); "
                            "bertjax reads the original TF1 BERT checkpoints (bert_model.ckpt)")
  tensors, skipped = {}, 0
  for variable in variables:
    if variable.rsplit("/", 1)[-1] not in _MODEL_LEAVES:
      skipped += 1
      continue
    name, transpose = reference_name(variable)
    try:
      value = np.asarray(reader.get_tensor(variable), np.float32)
    except Exception as e:  # A truncated data file fails here, per tensor.
      raise errors.UsageError(f"{prefix}: cannot read variable {variable} ({e})") from None
    tensors[name] = value.T if transpose else value
  if skipped:
    logger.info("%s: skipped %d training-state variables (optimizer slots, step)",
                prefix, skipped)
  return tensors
