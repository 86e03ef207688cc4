"""One name table per family between bertjax parameters and the reference weights.

Every checkpoint format is read into the reference (Hugging Face PyTorch) naming,
e.g. `bert.encoder.layer.3.attention.self.query.weight` [out, in], then mapped
onto the bertjax parameter tree of a task model (looped layer layout), e.g.
`bert/layers_3/attention/query/kernel` [embed, heads, kv]. Export runs the same
table backwards, so import -> export -> import is exact. ModernBERT's table maps
transformers' `ModernBert*` names (`model.layers.3.attn.Wqkv.weight` [3 * heads
* kv, embed] <-> `bert/layers_3/attention/qkv/kernel` [embed, 3, heads, kv]) the
same way: every weight one to one, reshaped and transposed.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np

from bertjax import errors
from bertjax.models import EncoderConfig, build_model, init_params
from bertjax.models import family as model_family
from bertjax.models.bert import abstract_params

Params = dict[str, Any]

logger = logging.getLogger(__name__)

# (bertjax module path regex, reference module name template). The leaf name
# maps as kernel/scale/embedding -> weight, bias -> bias.
_MODULES = [
    (r"bert/embeddings/(word|position|token_type)_embeddings",
     r"bert.embeddings.\1_embeddings"),
    (r"bert/embeddings/layer_norm", r"bert.embeddings.LayerNorm"),
    (r"bert/layers_(\d+)/attention/(query|key|value)", r"bert.encoder.layer.\1.attention.self.\2"),
    (r"bert/layers_(\d+)/attention/output", r"bert.encoder.layer.\1.attention.output.dense"),
    (r"bert/layers_(\d+)/attention_layer_norm", r"bert.encoder.layer.\1.attention.output.LayerNorm"),
    (r"bert/layers_(\d+)/intermediate", r"bert.encoder.layer.\1.intermediate.dense"),
    (r"bert/layers_(\d+)/output", r"bert.encoder.layer.\1.output.dense"),
    (r"bert/layers_(\d+)/output_layer_norm", r"bert.encoder.layer.\1.output.LayerNorm"),
    (r"bert/pooler", r"bert.pooler.dense"),
    (r"mlm/transform", r"cls.predictions.transform.dense"),
    (r"mlm/transform_layer_norm", r"cls.predictions.transform.LayerNorm"),
    (r"mlm", r"cls.predictions"),
    (r"nsp", r"cls.seq_relationship"),
    (r"classifier", r"classifier"),
    (r"span", r"qa_outputs"),
]
# transformers' ModernBERT classes. Its heads' transform sits in the encoder
# here (`bert/head`), and the question-answering layer is its `classifier`.
_MODERN_MODULES = [
    (r"bert/embeddings/word_embeddings", r"model.embeddings.tok_embeddings"),
    (r"bert/embeddings/layer_norm", r"model.embeddings.norm"),
    (r"bert/layers_(\d+)/attention_norm", r"model.layers.\1.attn_norm"),
    (r"bert/layers_(\d+)/attention/qkv", r"model.layers.\1.attn.Wqkv"),
    (r"bert/layers_(\d+)/attention/output", r"model.layers.\1.attn.Wo"),
    (r"bert/layers_(\d+)/mlp_norm", r"model.layers.\1.mlp_norm"),
    (r"bert/layers_(\d+)/intermediate", r"model.layers.\1.mlp.Wi"),
    (r"bert/layers_(\d+)/output", r"model.layers.\1.mlp.Wo"),
    (r"bert/final_norm", r"model.final_norm"),
    (r"bert/head/dense", r"head.dense"),
    (r"bert/head/layer_norm", r"head.norm"),
    (r"mlm", r"decoder"),
    (r"classifier", r"classifier"),
    (r"span", r"classifier"),
]
_LEAVES = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}
# The word embedding table, whose rows past `vocab_size` (`vocab_pad_multiple`)
# are bertjax's: the reference holds `vocab_size` rows.
_WORD_EMBEDDINGS = ("bert", "embeddings", "word_embeddings", "embedding")

# Reference names that carry no information of their own.
_REDUNDANT = {
    "bert.embeddings.position_ids",     # a buffer of older checkpoints
    "cls.predictions.decoder.weight",   # tied to the word embeddings
    "cls.predictions.decoder.bias",     # the same tensor as cls.predictions.bias
    "decoder.weight",                   # ModernBERT's, tied to the word embeddings
}
# Where each family's encoder weights live in the reference naming.
ENCODER_PREFIXES = {"bert": ("bert.embeddings.", "bert.encoder."), "modernbert": ("model.",)}
_TABLES = {"bert": _MODULES, "modernbert": _MODERN_MODULES}


def reference_name(path: tuple[str, ...], family: str = "bert") -> str:
  """The reference weight name of a bertjax parameter path (looped layout)."""
  module, leaf = "/".join(path[:-1]), path[-1]
  for pattern, template in _TABLES[family]:
    if re.fullmatch(pattern, module):
      return f"{re.sub(pattern, template, module)}.{_LEAVES[leaf]}"
  raise KeyError(f"No reference name for parameter {'/'.join(path)}")


def _fan_in(path: tuple[str, ...], shape: tuple[int, ...]) -> int:
  # The attention output kernel is [heads, kv, embed]; every other kernel has
  # one input axis first ([embed, heads, kv], [embed, 3, heads, kv], [in, out]).
  if path[-3:] == ("attention", "output", "kernel"):
    return int(np.prod(shape[:-1]))
  return shape[0]


def to_reference(path: tuple[str, ...], value: np.ndarray) -> np.ndarray:
  """A bertjax parameter as the reference stores it (kernels [out, in])."""
  value = np.asarray(value)
  if path[-1] == "kernel":
    return np.ascontiguousarray(value.reshape(_fan_in(path, value.shape), -1).T)
  return value.reshape(-1) if value.ndim > 1 and path[-1] == "bias" else value


def from_reference(path: tuple[str, ...], value: np.ndarray,
                   shape: tuple[int, ...]) -> np.ndarray:
  """A reference weight reshaped into the bertjax parameter of `shape`."""
  if path[-1] == "kernel":
    value = value.T
  return np.ascontiguousarray(value.reshape(shape))


def _path_str(path) -> tuple[str, ...]:
  return tuple(p.key for p in path)


@dataclasses.dataclass
class LoadReport:
  """What an import took from the checkpoint and what it did not."""

  loaded: list[str] = dataclasses.field(default_factory=list)
  initialised: list[str] = dataclasses.field(default_factory=list)
  unused: list[str] = dataclasses.field(default_factory=list)

  def log(self, source: str) -> None:
    logger.info("%s: loaded %d tensors", source, len(self.loaded))
    if self.initialised:
      logger.warning("%s: not in the checkpoint, initialised randomly: %s", source,
                      ", ".join(self.initialised))
    if self.unused:
      logger.warning("%s: ignored %d tensors the model has no place for: %s", source,
                      len(self.unused), ", ".join(self.unused))


def params_from_reference(tensors: Mapping[str, np.ndarray], config: EncoderConfig, task: str,
                          num_labels: int, source: str, rng: jax.Array | None = None,
                          add_summary: bool | None = None) -> tuple[Params, LoadReport]:
  """Builds task-model parameters (looped layout, float32) from reference weights.

  Args:
    tensors: Reference name -> array, with the `bert.` prefix on encoder names.
    config: The architecture; shapes are checked against it.
    task: The task model to build (see `bertjax.models.TASK_MODELS`).
    num_labels: Outputs of the classification heads.
    source: File or directory named in errors and logs.
    rng: If given, parameters the checkpoint lacks outside the encoder's layers
      (a fine-tuning head, the pooler) are initialised from it and reported;
      otherwise a missing weight is an error.
    add_summary: Whether a task that does not need the pooler keeps one (None:
      if the checkpoint has it).

  Returns:
    The parameters and a `LoadReport`.
  """
  config = config.replace(scan_layers=False)
  family = config.family
  if add_summary is None:
    add_summary = model_family.of(config).summary_weight in tensors
  model = build_model(config, task, num_labels, add_summary)
  expected = nn.meta.unbox(abstract_params(model))
  report = LoadReport()
  missing = []

  def take(path, target):
    path = _path_str(path)
    name = reference_name(path, family)
    if name not in tensors:
      missing.append((path, name))
      return None
    value = np.asarray(tensors[name])
    needed = _reference_shape(path, target.shape)
    if path == _WORD_EMBEDDINGS and value.shape == (config.vocab_size, *needed[1:]):
      value = np.pad(value, ((0, needed[0] - value.shape[0]), (0, 0)))  # padding rows: 0
    if value.shape != needed:
      raise errors.UsageError(
          f"{source}: weight {name} has shape {tuple(value.shape)}, but the config "
          f"needs {needed} for {'/'.join(path)}")
    report.loaded.append(name)
    return from_reference(path, value, target.shape).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(take, expected)
  fresh = None
  for path, name in missing:
    if rng is None or (path[0] == "bert" and path[1] not in ("pooler", "head")):
      raise errors.UsageError(f"{source}: weight {name} (for {'/'.join(path)}) is missing from "
                              "the checkpoint")
    if fresh is None:
      fresh = nn.meta.unbox(init_params(model, rng))
    value = fresh
    for key in path:
      value = value[key]
    _set(params, path, np.asarray(value))
    report.initialised.append("/".join(path))
  report.unused = sorted(set(tensors) - set(report.loaded) - _REDUNDANT)
  stray = [name for name in report.unused if name.startswith(ENCODER_PREFIXES[family])]
  if stray:
    raise errors.UsageError(
        f"{source}: encoder weights the config has no place for: {', '.join(stray[:5])}"
        f"{' ...' if len(stray) > 5 else ''} (config: num_layers={config.num_layers}); "
        "the config and the weights describe different models")
  return params, report


def _reference_shape(path: tuple[str, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
  return to_reference(path, np.zeros(shape, np.int8)).shape


def _set(tree: Params, path: tuple[str, ...], value: Any) -> None:
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value


def params_to_reference(params: Params, vocab_size: int | None = None,
                        family: str = "bert") -> dict[str, np.ndarray]:
  """Reference name -> float32 array for task-model parameters (looped layout).

  Args:
    vocab_size: Keep only this many word embeddings (an export: the padding
      rows of `EncoderConfig.vocab_pad_multiple` are bertjax's); None keeps all.
    family: The parameters' `EncoderConfig.family`.
  """
  flat = {}
  for path, value in jax.tree_util.tree_leaves_with_path(params):
    path = _path_str(path)
    value = np.asarray(value, np.float32)
    if path == _WORD_EMBEDDINGS and vocab_size is not None:
      value = value[:vocab_size]
    flat[reference_name(path, family)] = to_reference(path, value)
  return flat
