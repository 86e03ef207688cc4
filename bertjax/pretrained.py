"""Pretrained models: load from any supported format, save, export.

`load_pretrained` reads
- a bertjax model directory (`bertjax.json` + orbax `params/` + tokenizer files),
  as written by `save_pretrained`;
- a Hugging Face BERT directory (`config.json`, `model.safetensors` or its
  sharded index, or `pytorch_model.bin` through torch; `vocab.txt`,
  `tokenizer_config.json`);
- Google's original TF checkpoint directory (`bert_config.json`,
  `bert_model.ckpt.*`, `vocab.txt`), with the `[tf]` extra;
- a pre-training run's workdir (`python -m bertjax.main`): its latest
  checkpoint, with the tokenizer of its data.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bertjax import checkpoint, errors, files, paths, phases
from bertjax.data.tokenizers import Tokenizer, tokenizer_from_settings
from bertjax.files import atomic_directory, read_json, write_json
from bertjax.interop import google_tf, hf, mapping
from bertjax.models import EncoderConfig, build_model, family, init_params, to_layout
from bertjax.models.config import COMPUTATION_FIELDS
from bertjax.models.bert import (LABELLED_TASKS, OPTIONAL_POOLER_TASKS, TASK_MODELS, summary_name,
                                 abstract_params)

BERTJAX_FILE = "bertjax.json"
TRAINING_CHECKPOINTS = "checkpoints"  # in a `python -m bertjax.main` workdir
# Pre-training objective -> the task model holding its weights.
OBJECTIVE_TASKS = {"mlm_nsp": "pretraining", "mlm_pairs": "masked_lm", "mlm": "masked_lm",
                   "ltr": "masked_lm"}
FORMAT_VERSION = 1

Params = dict[str, Any]
logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Pretrained:
  """A model ready to use: architecture, weights, tokenizer and task.

  Attributes:
    config: The architecture and computation options.
    params: Parameters of the task model, in the layer layout of
      `config.scan_layers`, float32.
    tokenizer: The tokenizer the weights were trained with, or None.
    task: Which task model the weights belong to (a key of
      `bertjax.models.TASK_MODELS`); `params["bert"]` is always the encoder.
    labels: Label names in id order for classification tasks.
  """

  config: EncoderConfig
  params: Params
  tokenizer: Tokenizer | None
  task: str = "encoder"
  labels: list[str] | None = None

  @property
  def num_labels(self) -> int:
    return len(self.labels) if self.labels else 2

  @property
  def has_summary(self) -> bool:
    """Whether the encoder has its pooler (ModernBERT: its prediction head)."""
    return summary_name(self.config) in self.params["bert"]

  def model(self) -> nn.Module:
    """The Flax module these parameters belong to."""
    return build_model(self.config, self.task, self.num_labels, self.has_summary)


def load_pretrained(path: str, *, task: str | None = None, labels: list[str] | None = None,
                    do_lower_case: bool | None = None, seed: int = 0,
                    **config_overrides: Any) -> Pretrained:
  """Loads a pretrained BERT from a bertjax, Hugging Face or Google TF directory.

  Args:
    path: The directory (or, for Google checkpoints, the `bert_model.ckpt` prefix).
    task: The task model to load into. Default: the checkpoint's own (a
      checkpoint with both pre-training heads loads as "pretraining", whatever
      class it names). A head the checkpoint lacks (a new classifier on a
      pre-trained encoder) is initialised from `seed` and logged; the encoder
      weights must all be there.
    labels: Label names for the classification head (their number sets its
      width); default: the checkpoint's.
    do_lower_case: Override the tokenizer's casing. Without it: the saved
      setting, else (Google checkpoints) the directory name or vocabulary.
    seed: Seed of newly initialised heads.
    **config_overrides: How to compute (see `COMPUTATION_FIELDS`), e.g.
      `dtype="bfloat16"`, `scan_layers=True`, `attention_impl="cudnn"`.

  Returns:
    The `Pretrained` bundle.
  """
  path = os.fspath(path)
  fixed = sorted(set(config_overrides) - set(COMPUTATION_FIELDS))
  if fixed:
    raise errors.UsageError(f"load_pretrained cannot override {fixed}: the checkpoint fixes the "
                            f"architecture; overridable: {', '.join(COMPUTATION_FIELDS)}")
  path = resolve_location(paths.resolve_model(path))
  exists = lambda name: files.isfile(files.join(path, name))
  if exists(BERTJAX_FILE):
    bundle = _load_bertjax(path, do_lower_case)
  elif files.isdir(files.join(path, TRAINING_CHECKPOINTS)) and exists("config.json"):
    bundle = _load_training_run(path, do_lower_case)
  elif exists(hf.CONFIG_FILE):
    bundle = _load_reference(files.local_copy(path, _reference_files(path)), hf.CONFIG_FILE,
                             do_lower_case)
  elif exists(google_tf.CONFIG_FILE) or files.isfile(path + ".index"):
    if files.isfile(path + ".index"):  # a checkpoint prefix: its directory's files
      local = files.local_copy(os.path.dirname(path), _reference_files(os.path.dirname(path)))
      local = os.path.join(local, os.path.basename(path))
    else:
      local = files.local_copy(path, _reference_files(path))
    bundle = _load_reference(local, google_tf.CONFIG_FILE, do_lower_case)
  elif not files.exists(path):
    raise errors.MissingFileError(f"{path} does not exist")
  else:
    raise errors.UsageError(
        f"{path}: not a model directory; expected {BERTJAX_FILE} (bertjax), "
        f"{hf.CONFIG_FILE} (Hugging Face) or {google_tf.CONFIG_FILE} (Google TF)")

  if labels is not None and (task or bundle.task) not in LABELLED_TASKS:
    raise errors.UsageError(f"labels are for {' or '.join(LABELLED_TASKS)}, not the "
                            f"{task or bundle.task} task")
  if (task is not None and task != bundle.task) or labels is not None:
    bundle = _retarget(bundle, task or bundle.task, labels, seed, path)
  _check_vocabulary(bundle, path)
  bundle.config = bundle.config.replace(**config_overrides)
  bundle.params = to_layout(bundle.params, bundle.config.scan_layers, bundle.config)
  return bundle


# Weight files of other frameworks that a Hugging Face repository may carry
# beside the ones read here; not downloaded.
_OTHER_WEIGHTS = ("tf_model.h5", "flax_model.msgpack", "rust_model.ot", "model.onnx",
                  "coreml", "onnx")


def _reference_files(directory: str):
  """Which files of a Hugging Face or Google TF directory are needed to load it
  (a predicate on names): not other frameworks' weights, and no PyTorch pickle
  beside safetensors."""
  if not files.is_remote(directory):
    return None  # read in place
  has_safetensors = any(name.endswith(".safetensors") for name in files.listdir(directory))
  return lambda name: not (name.startswith(_OTHER_WEIGHTS) or name.endswith((".h5", ".msgpack"))
                           or (has_safetensors and name == hf.PICKLE_FILE))


def resolve_location(path: str) -> str:
  """A Hugging Face Hub id becomes its local snapshot (through `huggingface_hub`:
  its cache, a download unless `HF_HUB_OFFLINE=1`); anything else is returned
  as it is."""
  if not paths.is_hub_id(path):
    return path
  try:
    import huggingface_hub
  except ImportError:
    raise errors.UsageError(f"{path}: reading a Hugging Face Hub id needs huggingface_hub "
                            "(pip install huggingface_hub), or give a local path") from None
  patterns = ["*.json", "*.txt", "*.model", "*.safetensors"]
  try:
    local = huggingface_hub.snapshot_download(path, allow_patterns=patterns)
    if not any(name.endswith(".safetensors") for name in os.listdir(local)):
      local = huggingface_hub.snapshot_download(path, allow_patterns=patterns + ["*.bin"])
  except Exception as e:  # offline without a cached copy, an unknown id, no network
    raise errors.MissingFileError(
        f"{path}: not a local path, and no Hugging Face Hub snapshot of it could be had "
        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check the "
        "path, or the id and your network (HF_HUB_OFFLINE=1 reads only the cache)") from None
  logger.info("%s: the Hugging Face Hub snapshot in %s", path, local)
  return local


def _load_reference(path: str, config_file: str, do_lower_case: bool | None) -> Pretrained:
  """Hugging Face or Google TF directory -> bundle (looped layout)."""
  prefix = None
  if config_file == google_tf.CONFIG_FILE:
    if os.path.isfile(path + ".index"):
      prefix, path = path, os.path.dirname(path) or "."
    else:
      prefix = google_tf.find_checkpoint(path)
  config_path = os.path.join(path, config_file)
  values = read_json(config_path)
  reader = google_tf if config_file == google_tf.CONFIG_FILE else hf
  config = reader.config_from_dict(values, config_path)
  if prefix is None:
    tensors, source = hf.read_weights(path)
  else:
    tensors, source = google_tf.read_checkpoint(prefix), prefix
  tensors = hf.canonical_names(tensors, config.family)
  task = hf.detect_task(tensors, values)
  labels = hf.labels_from_config(values, config_path) if task in LABELLED_TASKS else None
  if task in LABELLED_TASKS and "classifier.weight" in tensors:
    width = tensors["classifier.weight"].shape[0]
    if labels is None:
      labels = [f"LABEL_{i}" for i in range(width)]
    elif len(labels) != width:
      raise errors.UsageError(f"{config_path}: {len(labels)} labels, but classifier.weight in "
                              f"{source} has {width} rows")
  hf.resolve_tied_decoder(tensors, source)
  params, report = mapping.params_from_reference(
      tensors, config, task, len(labels) if labels else 2, source)
  report.log(source)
  tokenizer = hf.load_tokenizer(path, do_lower_case)
  return Pretrained(config, params, tokenizer, task, labels)


def _retarget(bundle: Pretrained, task: str, labels: list[str] | None, seed: int,
              path: str) -> Pretrained:
  """Moves the weights into another task model, initialising a missing head.

  The encoder always carries over, and so do the masked-LM and next-sentence
  heads (shared by the pre-training tasks). A fine-tuned output layer carries
  over only into the same task with the same number of labels.
  """
  if task not in TASK_MODELS:
    raise errors.UsageError(f"Unknown task {task!r}; known tasks: {', '.join(TASK_MODELS)}")
  labels = labels if labels is not None else bundle.labels
  if task not in LABELLED_TASKS:
    labels = None
  if bundle.config.span_bilstm:
    raise errors.UsageError(f"{path}: a question-answering model with a span BiLSTM loads only as "
                            f"question_answering, not {task}")
  reference = mapping.params_to_reference(to_layout(bundle.params, False, bundle.config),
                                          family=bundle.config.family)
  same_head = task == bundle.task and (labels is None or bundle.labels is None
                                       or len(labels) == len(bundle.labels))
  if not same_head:
    reference = {name: value for name, value in reference.items()
                 if not name.startswith(("classifier.", "qa_outputs."))}
  # A prediction head as summary (ModernBERT's) is read by every task model
  # (new if the encoder lacks it); a pooler only by those that take one.
  reads_summary = family.of(bundle.config).summary == "head" and task != "encoder"
  add_summary = (bundle.has_summary if task in OPTIONAL_POOLER_TASKS and not reads_summary
                else True)
  params, report = mapping.params_from_reference(
      reference, bundle.config, task, len(labels) if labels else 2, path,
      rng=jax.random.key(seed), add_summary=add_summary)
  report.log(path)
  return Pretrained(bundle.config, params, bundle.tokenizer, task, labels)


def add_span_bilstm(bundle: Pretrained, seed: int = 0) -> Pretrained:
  """The question-answering bundle with a randomly initialised BiLSTM between
  its encoder and span layer (the paper's Table 5 "+ BiLSTM"; the other weights
  stay). A bundle that has one is returned as it is."""
  if bundle.task != "question_answering":
    raise errors.UsageError(f"a span BiLSTM is for question answering, not {bundle.task}")
  if bundle.config.span_bilstm:
    return bundle
  config = bundle.config.replace(span_bilstm=True)
  model = build_model(config.replace(scan_layers=False), bundle.task, bundle.num_labels,
                      bundle.has_summary)
  fresh = nn.meta.unbox(init_params(model, jax.random.key(seed)))
  looped = to_layout(jax.device_get(bundle.params), False)
  params = {**fresh, **looped}  # every trained weight kept; the BiLSTM's are new
  logger.info("initialised randomly: %s", ", ".join(
      jax.tree_util.keystr(path) for path, _ in
      jax.tree_util.tree_leaves_with_path(fresh["span_bilstm"])))
  return Pretrained(config, to_layout(params, config.scan_layers, config), bundle.tokenizer,
                    bundle.task, bundle.labels)


def _check_vocabulary(bundle: Pretrained, path: str) -> None:
  tokenizer = bundle.tokenizer
  if tokenizer is not None and tokenizer.vocab_size > bundle.config.vocab_size:
    raise errors.UsageError(
        f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
        f"vocab_size is {bundle.config.vocab_size}; ids beyond it would index past the "
        "embedding table (wrong vocabulary file?)")


def save_pretrained(bundle: Pretrained, out_dir: str, overwrite: bool = False) -> None:
  """Writes a bertjax model directory atomically (nothing partial on failure).

  Parameters are stored in the looped layout, so any `scan_layers` setting can
  read them back.
  """
  looped = _checked_looped_params(bundle)
  with atomic_directory(out_dir, overwrite, marker=BERTJAX_FILE) as staging:
    tokenizer_settings = bundle.tokenizer.save(staging) if bundle.tokenizer else None
    with _this_process_checkpointer() as checkpointer:
      checkpointer.save(os.path.join(staging, "params"), looped)
      checkpointer.wait_until_finished()
    write_json(os.path.join(staging, BERTJAX_FILE), {
        "format_version": FORMAT_VERSION,
        "config": bundle.config.to_dict(),
        "task": bundle.task,
        "labels": bundle.labels,
        "has_summary": bundle.has_summary,
        "tokenizer": tokenizer_settings,
    })


def _this_process_checkpointer():
  """An orbax checkpointer for host arrays that involves no other process: a
  model directory is written by one process (process 0 of a multi-host job)
  and read by each on its own."""
  import orbax.checkpoint as ocp

  me = jax.process_index()
  return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
      primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"process{me}"))


def _load_bertjax(path: str, do_lower_case: bool | None) -> Pretrained:
  meta_path = os.path.join(path, BERTJAX_FILE)
  meta = read_json(meta_path)
  for key in ("format_version", "config", "task"):
    if key not in meta:
      raise errors.UsageError(f"{meta_path}: required key {key!r} is missing")
  if meta["format_version"] != FORMAT_VERSION:
    raise errors.UsageError(f"{meta_path}: format_version {meta['format_version']} is not "
                            f"supported (this bertjax reads version {FORMAT_VERSION})")
  if not isinstance(meta["config"], dict):
    raise errors.UsageError(f"{meta_path}: 'config' must be an object")
  try:
    config = EncoderConfig.from_dict(meta["config"], meta_path).replace(scan_layers=False)
  except (TypeError, ValueError) as e:
    raise errors.UsageError(f"{meta_path}: {e}") from None
  task, labels = meta["task"], meta.get("labels")
  has_summary = meta.get("has_summary", meta.get("has_pooler"))  # earlier versions: has_pooler
  model = build_model(config, task, len(labels) if labels else 2, has_summary)
  target = nn.meta.unbox(abstract_params(model))
  with _this_process_checkpointer() as checkpointer:
    params = checkpointer.restore(os.path.join(path, "params"), target)
  tokenizer = None
  if meta.get("tokenizer"):
    settings = dict(meta["tokenizer"])
    if do_lower_case is not None:
      settings["do_lower_case"] = do_lower_case
    tokenizer = tokenizer_from_settings(path, settings, meta_path)
  return Pretrained(config, jax.tree.map(np.asarray, params), tokenizer, task, labels)


def _load_training_run(path: str, do_lower_case: bool | None) -> Pretrained:
  """The parameters of the latest checkpoint of a pre-training workdir."""
  from bertjax.data import shards

  config_path = files.join(path, "config.json")
  values = read_json(config_path)
  if values.get("task") != "pretrain" or "model" not in values:
    raise errors.UsageError(f"{config_path}: not the config of a pre-training run")
  run_config, step, params = checkpoint.params_from_run(path)
  config = EncoderConfig.from_run_config(run_config)
  # The model as the checkpoint's phase computes it (ModernBERT after its
  # context extension: the raised rotary base); dropout stays the run's own.
  config = phases.phase_at(run_config, step).trained_model(config)
  if run_config.objective == "ltr":
    config = config.replace(causal=True)
  logger.info("%s: parameters of step %d", path, step)
  data_dir = run_config.data.dir or files.join(path, "data")
  tokenizer = None
  try:
    info = shards.read_info(data_dir)
  except (OSError, ValueError) as e:  # the data was moved or deleted since
    logger.warning("%s: no tokenizer (%s)", path, e)
  else:
    shards.check_tokenizer(data_dir, info)  # the vocabulary the model was trained with
    settings = info["tokenizer"]
    if do_lower_case is not None:
      settings = {**settings, "do_lower_case": do_lower_case}
    tokenizer = tokenizer_from_settings(data_dir, settings)
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  return Pretrained(config, params, tokenizer, OBJECTIVE_TASKS[run_config.objective])


def export_hf(bundle: Pretrained, out_dir: str, overwrite: bool = False) -> None:
  """Writes a Hugging Face directory that `transformers` loads into the
  matching `Bert*` (or `ModernBert*`) class with no missing or unexpected keys.

  A pooler kept for `encode` in a task whose reference class has none (masked
  LM, span and token classification; ModernBERT's bare encoder) is left out,
  with a log line. The directory is written under a temporary name and renamed
  when complete.
  """
  if bundle.config.span_bilstm:
    raise errors.UsageError("export_hf: transformers' BertForQuestionAnswering has no BiLSTM "
                            "(span_bilstm); keep the bertjax format")
  if bundle.config.causal and bundle.task not in OPTIONAL_POOLER_TASKS:
    raise errors.UsageError(
        f"export_hf: a left-to-right (causal) {bundle.task} model pools its last token; "
        f"transformers' {hf.class_name(bundle.config, bundle.task)} pools [CLS] and would compute "
        "something else. Export the encoder (task='encoder') or keep the bertjax format")
  reference = mapping.params_to_reference(_checked_looped_params(bundle),
                                          bundle.config.vocab_size, bundle.config.family)
  hf.class_name(bundle.config, bundle.task)  # a task transformers has a class for
  if family.of(bundle.config).summary == "head" and bundle.task == "encoder":
    # The bare encoder class of such a family has no prediction head.
    head = [name for name in reference if name.startswith("head.")]
    if head:
      logger.info("export_hf: %s has no prediction head; leaving out %s",
                  hf.class_name(bundle.config, "encoder"), ", ".join(head))
      reference = {k: v for k, v in reference.items() if k not in head}
  elif bundle.task in OPTIONAL_POOLER_TASKS:
    pooler = [name for name in reference if name.startswith("bert.pooler.")]
    if bundle.task == "encoder" and not pooler:
      logger.warning("export_hf: this encoder has no pooler; transformers' BertModel will "
                     "initialise one (or load it with add_pooling_layer=False)")
    elif bundle.task != "encoder" and pooler:
      logger.info("export_hf: %s has no pooler; leaving out %s",
                  hf.class_name(bundle.config, bundle.task), ", ".join(pooler))
      reference = {k: v for k, v in reference.items() if k not in pooler}
  with atomic_directory(out_dir, overwrite, marker=hf.CONFIG_FILE) as staging:
    hf.write_directory(staging, bundle.config, reference, bundle.task, bundle.labels,
                       bundle.tokenizer)


def _checked_looped_params(bundle: Pretrained) -> Params:
  """`bundle.params` in the looped layout, checked against the model's shapes."""
  looped = to_layout(jax.device_get(bundle.params), False)
  model = build_model(bundle.config.replace(scan_layers=False), bundle.task,
                      bundle.num_labels, summary_name(bundle.config) in looped["bert"])
  expected = nn.meta.unbox(abstract_params(model))
  expected_shapes = {jax.tree_util.keystr(k): v.shape
                     for k, v in jax.tree_util.tree_leaves_with_path(expected)}
  shapes = {jax.tree_util.keystr(k): np.shape(v)
            for k, v in jax.tree_util.tree_leaves_with_path(looped)}
  if shapes != expected_shapes:
    problems = sorted(
        f"{k}: {shapes.get(k, 'missing')} (model needs {expected_shapes.get(k, 'nothing')})"
        for k in set(shapes) | set(expected_shapes) if shapes.get(k) != expected_shapes.get(k))
    raise errors.UsageError(f"The parameters do not fit the {bundle.task} model of this config: "
                            + "; ".join(problems[:10]))
  return looped
