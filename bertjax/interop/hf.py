"""Hugging Face BERT directories: `config.json`, `model.safetensors`, `vocab.txt`.

Each family's classes and config are translated in its own module
(`interop/bert.py`, `interop/modernbert.py`), which `FAMILIES` names by the
config's `model_type`. Reading needs neither torch nor transformers: safetensors files are parsed here
(float32, float16 and bfloat16, sharded or not), and the weights map onto
bertjax through `bertjax.interop.mapping`. `.bin` pickles are read only through
`torch.load(weights_only=True)`, when torch is installed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

from bertjax import errors
from bertjax.files import read_json
from bertjax.interop import bert, modernbert
from bertjax.models import EncoderConfig
from bertjax.models import family as model_family

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Each family's translation, by `model_type` (`EncoderConfig.family`): its
# module has TASK_TO_CLASS, CLASS_TO_TASK, PREFIX, MODEL_INPUT_NAMES,
# class_name(task), config_from_dict(values, source), config_to_dict(config,
# task), canonical_names(tensors), detect_task(names, architectures),
# check_tied_decoder(tensors, source) and token_ids(tokenizer).
FAMILIES = {"bert": bert, "modernbert": modernbert}


def class_name(config: EncoderConfig, task: str) -> str:
  """transformers' class of a bertjax task model."""
  return FAMILIES[config.family].class_name(task)

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def config_from_dict(values: dict[str, Any], source: str) -> EncoderConfig:
  """An `EncoderConfig` from a reference `config.json`, by its family's module
  (`model_type`; Google's `bert_config.json`:
  `bertjax.interop.google_tf.config_from_dict`)."""
  return FAMILIES.get(values.get("model_type", "bert"), bert).config_from_dict(values, source)


def config_to_dict(config: EncoderConfig, task: str, labels: list[str] | None) -> dict[str, Any]:
  """The reference `config.json` for `config` and a task model."""
  values = FAMILIES[config.family].config_to_dict(config, task)
  if labels is not None:
    values["id2label"] = {str(i): label for i, label in enumerate(labels)}
    values["label2id"] = {label: i for i, label in enumerate(labels)}
  return values


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a safetensors file, as numpy arrays (bfloat16 included).

  Raises:
    ValueError naming the file, and the tensor when its header entry is at
    fault (an unknown dtype, a negative or fractional size, offsets outside the
    file's data or not matching the shape), for a truncated or malformed file.
  """
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    prefix = f.read(8)
    if len(prefix) < 8:
      raise errors.UsageError(f"{path}: truncated safetensors file ({size} bytes, no header)")
    (header_size,) = struct.unpack("<Q", prefix)
    if header_size > size - 8:
      raise errors.UsageError(f"{path}: truncated safetensors file (header of {header_size} "
                              f"bytes, file of {size})")
    try:
      header = json.loads(f.read(header_size))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise errors.UsageError(f"{path}: malformed safetensors header ({e})") from None
  if not isinstance(header, dict):
    raise errors.UsageError(f"{path}: malformed safetensors header (not a JSON object)")
  header.pop("__metadata__", None)
  data_start = 8 + header_size
  buffer = np.memmap(path, dtype=np.uint8, mode="r")
  tensors = {}
  for name, info in header.items():
    dtype, shape, begin, end = _tensor_entry(path, name, info, data_start, size)
    raw = buffer[data_start + begin:data_start + end]
    tensors[name] = np.frombuffer(raw, dtype).reshape(shape)
  return tensors


def _is_count(value: Any) -> bool:
  """Whether a header value is a whole number of at least 0 (JSON `true` is not)."""
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_entry(path: str, name: str, info: Any, data_start: int,
                  size: int) -> tuple[np.dtype, tuple[int, ...], int, int]:
  """(dtype, shape, begin, end) of a safetensors header entry, each checked:
  the data of a tensor lies within the file's data, after the header, and holds
  exactly its shape's elements."""
  if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
    raise errors.UsageError(
        f"{path}: tensor {name} has a malformed header entry {info!r} (it needs "
        "dtype, shape and data_offsets)")
  if not isinstance(info["dtype"], str) or info["dtype"] not in _SAFETENSORS_DTYPES:
    raise errors.UsageError(
        f"{path}: tensor {name} has dtype {info['dtype']!r}, which bertjax does "
        f"not read ({', '.join(_SAFETENSORS_DTYPES)}); convert it to F32")
  dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
  shape, offsets = info["shape"], info["data_offsets"]
  if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
    raise errors.UsageError(f"{path}: tensor {name} has shape {shape!r}, not a list of sizes of at "
                            "least 0; the file is corrupt, download or export it again")
  if (not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets))
      or offsets[0] > offsets[1]):
    raise errors.UsageError(
        f"{path}: tensor {name} has data_offsets {offsets!r}, not [begin, end] "
        "with 0 <= begin <= end; the file is corrupt, download or export it again")
  begin, end = offsets
  if data_start + end > size:
    raise errors.UsageError(f"{path}: truncated safetensors file: tensor {name} needs bytes "
                            f"up to {data_start + end}, the file has {size}")
  if end - begin != math.prod(shape) * dtype.itemsize:
    raise errors.UsageError(f"{path}: tensor {name} of shape {tuple(shape)} and dtype "
                            f"{info['dtype']} does not match its {end - begin} bytes")
  return dtype, tuple(shape), begin, end


def read_weights(directory: str) -> tuple[dict[str, np.ndarray], str]:
  """Reads the weights of a reference directory; returns (tensors, source file).

  Raises:
    ValueError: for a malformed weight file, or an index that names a shard
      outside `directory` (an absolute path, or one through `..`).
    FileNotFoundError: for a missing weight file or shard.
  """
  index = os.path.join(directory, SAFETENSORS_INDEX_FILE)
  single = os.path.join(directory, SAFETENSORS_FILE)
  if os.path.isfile(single):
    return read_safetensors(single), single
  if os.path.isfile(index):
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise errors.UsageError(f"{index}: no 'weight_map' object")
    tensors = {}
    shards = {_shard_file(index, tensor, shard) for tensor, shard in weight_map.items()}
    for shard in sorted(shards):
      shard_path = os.path.join(directory, shard)
      if not os.path.isfile(shard_path):
        raise errors.MissingFileError(f"{index}: shard {shard} is missing")
      tensors.update(read_safetensors(shard_path))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
      raise errors.UsageError(f"{index}: tensors listed but absent from the shards: {missing}")
    return tensors, index
  pickle = os.path.join(directory, PICKLE_FILE)
  if os.path.isfile(pickle):
    return _read_pickle(pickle), pickle
  raise errors.MissingFileError(f"{directory}: no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX_FILE} "
                                f"or {PICKLE_FILE}")


def _shard_file(index: str, tensor: str, shard: Any) -> str:
  """The file an index maps `tensor` to, which must lie in the index's
  directory: a relative name without `..` (an index could otherwise make the
  loader read any file)."""
  if not isinstance(shard, str) or not shard:
    raise errors.UsageError(
        f"{index}: tensor {tensor} is mapped to {shard!r}, not a shard file name")
  parts = shard.replace("\\", "/").split("/")  # a Windows-written name too
  if os.path.isabs(shard) or not parts[0] or ".." in parts:
    raise errors.UsageError(f"{index}: shard {shard!r} (of tensor {tensor}) is outside the model "
                            "directory; an index names its shards relative to its own directory, "
                            "without '..'")
  return shard


def _read_pickle(path: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    raise errors.MissingDependencyError(
        f"{path} is a PyTorch pickle; install torch to read it, or convert "
        "it to model.safetensors") from None
  logger.warning("%s: reading a PyTorch pickle with torch.load(weights_only=True); "
                 "prefer model.safetensors", path)
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises several types for unreadable pickles.
    raise errors.UsageError(f"{path}: cannot read the PyTorch pickle with weights_only=True "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                            ) from None
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                            for v in state.values()):
    raise errors.UsageError(f"{path}: expected a flat state dict of tensors (a model's "
                            "state_dict()), got something else")
  return {name: tensor.float().numpy() for name, tensor in state.items()}


def canonical_names(tensors: dict[str, np.ndarray],
                    family: str = "bert") -> dict[str, np.ndarray]:
  """The names of a task model's file, as the family writes them."""
  return FAMILIES[family].canonical_names(tensors)


def detect_task(tensors: dict[str, Any], config_values: dict[str, Any]) -> str:
  """The task model that holds all the heads of a reference checkpoint: its
  named class, else the heads present (by the config's family)."""
  module = FAMILIES.get(config_values.get("model_type", "bert"), bert)
  return module.detect_task(set(tensors), config_values.get("architectures") or [])


def resolve_tied_decoder(tensors: dict[str, np.ndarray], source: str) -> None:
  """Checks the MLM decoder is tied to the word embeddings, as bertjax ties it
  (each family's names; BERT's output bias is taken from
  `cls.predictions.decoder.bias` when only that is stored)."""
  for module in FAMILIES.values():
    module.check_tied_decoder(tensors, source)


def labels_from_config(values: dict[str, Any], source: str) -> list[str] | None:
  """Label names in id order from `id2label` (or `num_labels`), if given."""
  id2label = values.get("id2label")
  if id2label:
    try:
      ids = sorted(int(i) for i in id2label)
    except ValueError:
      raise errors.UsageError(f"{source}: id2label keys must be integers, got "
                              f"{list(id2label)}") from None
    if ids != list(range(len(ids))):
      raise errors.UsageError(f"{source}: id2label ids must be 0..n-1, got {ids}")
    return [str(id2label[str(i)]) for i in ids]
  if "num_labels" in values:
    return [f"LABEL_{i}" for i in range(int(values["num_labels"]))]
  return None


def infer_lower_case(directory: str, tokens: list[str]) -> bool:
  """Whether a checkpoint without tokenizer settings is "uncased".

  Google's releases say it in the directory name (`uncased_L-12_H-768_A-12`);
  otherwise an uncased vocabulary has no upper-case letters outside [SPECIAL]
  tokens.
  """
  name = os.path.basename(os.path.normpath(directory)).lower()
  if "uncased" in name:
    return True
  if "cased" in name:
    return False
  return not any(any(c.isupper() for c in t) for t in tokens
                 if not (t.startswith("[") and t.endswith("]")))


def _bert_normalizer(tokenizer_json: dict[str, Any]) -> dict[str, Any]:
  """The BertNormalizer settings of a `tokenizer.json`, if it has one."""
  normalizer = tokenizer_json.get("normalizer") or {}
  candidates = normalizer.get("normalizers", [normalizer]) if isinstance(normalizer,
                                                                         dict) else []
  for candidate in candidates:
    if isinstance(candidate, dict) and candidate.get("type") == "BertNormalizer":
      return candidate
  return {}


def load_tokenizer(directory: str, do_lower_case: bool | None = None):
  """The tokenizer of a reference directory, or None if it has none.

  WordPiece from `vocab.txt` (or a WordPiece `tokenizer.json`), any other
  `tokenizer.json` as it is written (`JsonTokenizer`: ModernBERT's BPE), else
  SentencePiece from `spiece.model`. Casing: `do_lower_case` if given, else
  `tokenizer_config.json`, else the normaliser of `tokenizer.json`, else
  transformers' default (lower-case) when a `tokenizer_config.json` exists, else
  inferred from a Google directory name or the vocabulary. Special tokens in
  the text are read as such (unless `split_special_tokens` says otherwise); a
  directory with Hugging Face tokenizer files caps words at 100 characters as
  transformers does, a bare `vocab.txt` at the original's 200.
  """
  from bertjax.data.tokenizers import (JsonTokenizer, SentencePieceTokenizer,
                                       WordPieceTokenizer, read_vocab)

  vocab_file = os.path.join(directory, "vocab.txt")
  tokenizer_json_file = os.path.join(directory, "tokenizer.json")
  spiece_file = os.path.join(directory, "spiece.model")
  config_file = os.path.join(directory, TOKENIZER_CONFIG_FILE)
  settings = read_json(config_file) if os.path.isfile(config_file) else {}
  special_tokens = {}
  for role, default in (("unk", "[UNK]"), ("cls", "[CLS]"), ("sep", "[SEP]"),
                        ("pad", "[PAD]"), ("mask", "[MASK]")):
    token = settings.get(f"{role}_token", default)
    # Older files store special tokens as serialised AddedToken objects.
    special_tokens[role] = token.get("content", default) if isinstance(token, dict) else token

  tokenizer_json = read_json(tokenizer_json_file) if os.path.isfile(tokenizer_json_file) else {}
  model = tokenizer_json.get("model") or {}
  if os.path.isfile(vocab_file):
    tokens, source = read_vocab(vocab_file), vocab_file
  elif model and model.get("type") != "WordPiece":  # ModernBERT's BPE, and others
    return JsonTokenizer(tokenizer_json_file, special_tokens=special_tokens,
                         split_special_tokens=bool(settings.get("split_special_tokens")))
  elif model:
    if not isinstance(model.get("vocab"), dict):
      raise errors.UsageError(f"{tokenizer_json_file}: a WordPiece model without its vocab")
    tokens = [""] * (max(model["vocab"].values()) + 1)
    for token, index in model["vocab"].items():
      tokens[index] = token
    source = tokenizer_json_file
  elif os.path.isfile(spiece_file):
    if do_lower_case is None:
      do_lower_case = bool(settings.get("do_lower_case", False))
    return SentencePieceTokenizer(spiece_file, do_lower_case=do_lower_case,
                                  special_tokens=settings.get("special_tokens"))
  else:
    logger.warning("%s: no vocab.txt, tokenizer.json or spiece.model; loading without "
                   "a tokenizer", directory)
    return None

  normalizer = _bert_normalizer(tokenizer_json)
  if do_lower_case is None:
    do_lower_case = settings.get("do_lower_case", normalizer.get("lowercase"))
  if do_lower_case is None and settings:
    do_lower_case = True  # transformers' BertTokenizer default
  if do_lower_case is None:
    do_lower_case = infer_lower_case(directory, tokens)
    logger.info("%s: no casing setting; inferred do_lower_case=%s", directory,
                do_lower_case)
  # A special token typed in the text is that token, as for transformers'
  # tokenizer of the same weights (the Hub's copies of Google's checkpoints)
  # and every other tokenizer of bertjax; the word limit is each format's own.
  hugging_face = bool(settings or tokenizer_json)
  try:
    return WordPieceTokenizer(
        tokens, do_lower_case=bool(do_lower_case),
        strip_accents=settings.get("strip_accents", normalizer.get("strip_accents")),
        tokenize_chinese_chars=settings.get(
            "tokenize_chinese_chars", normalizer.get("handle_chinese_chars", True)),
        max_input_chars_per_word=model.get("max_input_chars_per_word", 100)
        if hugging_face else 200,
        special_tokens=special_tokens,
        special_tokens_in_text=not settings.get("split_special_tokens", False))
  except ValueError as e:
    raise errors.UsageError(f"{source}: {e}") from None


def write_directory(directory: str, config: EncoderConfig, reference_tensors: dict[str, np.ndarray],
                    task: str, labels: list[str] | None, tokenizer) -> None:
  """Writes a reference BERT directory (into an existing, empty `directory`)."""
  from safetensors.numpy import save_file

  from bertjax.data.tokenizers import JsonTokenizer, WordPieceTokenizer
  from bertjax.files import write_json

  tensors = dict(reference_tensors)
  if task == "encoder":
    # The bare encoder class saves its weights without the `bert.` (`model.`) prefix.
    prefix = FAMILIES[config.family].PREFIX
    tensors = {name.removeprefix(prefix): value for name, value in tensors.items()}
  values = config_to_dict(config, task, labels)
  if tokenizer is not None:
    values.update(FAMILIES[config.family].token_ids(tokenizer))
  write_json(os.path.join(directory, CONFIG_FILE), values)
  save_file(tensors, os.path.join(directory, SAFETENSORS_FILE), metadata={"format": "pt"})
  if tokenizer is None:
    return
  special = {f"{role}_token": token for role, token in tokenizer.special_tokens.items()}
  names = FAMILIES[config.family].MODEL_INPUT_NAMES
  inputs = {"model_input_names": names} if names else {}
  if isinstance(tokenizer, JsonTokenizer):
    tokenizer.save_tokenizer_json(os.path.join(directory, "tokenizer.json"),
                                  second_type_id=int(model_family.of(config).token_types))
    write_json(os.path.join(directory, TOKENIZER_CONFIG_FILE), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.max_position_embeddings, **inputs, **special,
        "split_special_tokens": tokenizer.split_special_tokens})
    write_json(os.path.join(directory, "special_tokens_map.json"), special)
    return
  if not isinstance(tokenizer, WordPieceTokenizer):
    logger.warning("transformers has no BERT tokenizer for SentencePiece models; "
                   "writing spiece.model for bertjax and your own loading code")
    saved = tokenizer.save(directory)
    write_json(os.path.join(directory, TOKENIZER_CONFIG_FILE), {
        "do_lower_case": saved["do_lower_case"], "special_tokens": saved["special_tokens"]})
    return
  tokenizer.save(directory)
  tokenizer.save_tokenizer_json(os.path.join(directory, "tokenizer.json"))
  write_json(os.path.join(directory, TOKENIZER_CONFIG_FILE), {
      **inputs,
      "tokenizer_class": "BertTokenizer",
      "do_lower_case": tokenizer.do_lower_case,
      "strip_accents": tokenizer.strip_accents,
      "tokenize_chinese_chars": tokenizer.tokenize_chinese_chars,
      "model_max_length": config.max_position_embeddings,
      # false (transformers' default) unless the tokenizer was told to split them.
      "split_special_tokens": not tokenizer.special_tokens_in_text,
      **special,
  })
  write_json(os.path.join(directory, "special_tokens_map.json"), special)
