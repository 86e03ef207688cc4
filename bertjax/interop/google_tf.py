"""Google's original TensorFlow BERT checkpoints (`bert_model.ckpt.*`).

Variable names are translated to the reference naming of
`bertjax.interop.mapping` (kernels transposed to [out, in]); the checkpoint is
read with `tf.train.load_checkpoint`, which needs the `[tf]` extra.
"""

from __future__ import annotations

import glob
import os
import re

import numpy as np

CONFIG_FILE = "bert_config.json"

# Optimizer slots and bookkeeping written next to the weights by the original
# training code.
_SKIPPED = re.compile(r"(^|/)(adam_m|adam_v|global_step|good_steps|bad_steps|loss_scale)($|/)")


def find_checkpoint(directory: str) -> str | None:
  """The checkpoint prefix in `directory` (`.../bert_model.ckpt`), or None."""
  preferred = os.path.join(directory, "bert_model.ckpt")
  if os.path.isfile(preferred + ".index"):
    return preferred
  indexes = sorted(glob.glob(os.path.join(directory, "*.ckpt*.index")))
  return indexes[-1][:-len(".index")] if indexes else None


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
    raise ImportError(f"{prefix} is a TensorFlow checkpoint; install the [tf] extra "
                      "(pip install 'bertjax[tf]') to read it") from None
  try:
    reader = tf.train.load_checkpoint(prefix)
  except Exception as e:  # TF raises several types for unreadable checkpoints.
    raise ValueError(f"{prefix}: cannot read the TensorFlow checkpoint ({e})") from None
  tensors = {}
  for variable in sorted(reader.get_variable_to_shape_map()):
    if _SKIPPED.search(variable):
      continue
    name, transpose = reference_name(variable)
    try:
      value = np.asarray(reader.get_tensor(variable), np.float32)
    except Exception as e:  # A truncated data file fails here, per tensor.
      raise ValueError(f"{prefix}: cannot read variable {variable} ({e})") from None
    tensors[name] = value.T if transpose else value
  return tensors
