"""The data of a pre-training run: each phase's loader settings (the phases:
`bertjax.phases`), and the prepared data checked (or built) before the first
step.

The prepared documents are built first when the config says how
(`data.build_from`, the demo), checked for documents in every process's splits
and against the model's vocabulary, and given each phase's statically masked
instances when `data.static` asks for them.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from absl import logging
import jax
import ml_collections

from bertjax import errors, files, hosts, paths
from bertjax.phases import Phase, phases
from bertjax.data import instances, loader, shards
from bertjax.data.masking import MaskingConfig


def stream_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The settings whose stream a loader position is a position in, by their
  flag names (saved beside the position): the seed and objective, the
  documents each host reads (the held-out share, the host sharding), static
  instances or not, and the windows of the shuffle and the packing."""
  return {"seed": config.seed, "objective": config.objective,
          # The loader's batches are the warmup's first batch (when it has one).
          "train.batch_ramp_start": (config.train.get("batch_ramp_start", 0)
                                     if config.train.get("batch_ramp_steps", 0) > 0 else 0),
          **{f"data.{name}": config.data[name]
             for name in ("eval_percent", "host_sharding", "static", "shuffle_window",
                          "max_sequences_per_row", "packing_window", "truncate_documents")}}


def check_stream(saved: dict[str, Any] | None, current: dict[str, Any]) -> None:
  """Refuses to resume a loader position in the stream of other settings (it
  would resume at another place, or fail in the loader)."""
  if saved is None:  # checkpoints from before the settings were saved
    return
  packs = max(saved.get("data.max_sequences_per_row", 1),
              current.get("data.max_sequences_per_row", 1)) > 1
  changed = {name: value for name, value in saved.items() if current.get(name) != value
             and (packs or name != "data.packing_window")}  # read only when packing
  if changed:
    was = ", ".join(f"--config.{name}={value}" for name, value in changed.items())
    now = ", ".join(f"{name}={current.get(name)}" for name in changed)
    raise errors.UsageError(
        f"the checkpoint's data position is in the stream of {was}, not of this "
        f"run's {now}: resume with {was}, or start a new --workdir")


def data_identity(config: ml_collections.ConfigDict, data_dir: str) -> str:
  """What a run's losses are measured on, as a short digest: the prepared
  documents (their `dataset_info.json`: the input and its files, the tokenizer,
  the shards), the instances made of them and how they are masked. The
  divergence guard's range is of one (`bertjax.divergence`): a run resumed on
  other data starts it anew. It is process 0's, so that every host's guard
  decides alike."""
  data = config.data
  described = {"documents": shards.read_info(data_dir), "objective": config.objective,
               **{name: data[name] for name in (
                   "short_seq_prob", "static", "max_sequences_per_row", "masked_lm_prob",
                   "mask_rate", "random_rate", "whole_word_masking", "masking_specials",
                   "masking", "truncate_documents")}}
  digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode())
  return f"{hosts.from_process_0(int(digest.hexdigest()[:7], 16)):07x}"


def masking_config(config: ml_collections.ConfigDict, max_predictions: int,
                   split: str = "train") -> MaskingConfig:
  """The masking of `split`: the held-out documents are masked at
  `eval.masked_lm_prob` where it is set (ModernBERT evaluates at 15%)."""
  rate = config.data.masked_lm_prob
  if split == "eval" and config.eval.masked_lm_prob > 0:
    rate = config.eval.masked_lm_prob
  return MaskingConfig(masked_lm_prob=rate,
                       max_predictions=max_predictions,
                       mask_rate=config.data.mask_rate,
                       random_rate=config.data.random_rate,
                       whole_word=config.data.whole_word_masking,
                       specials=config.data.masking_specials,
                       rule=config.data.masking)


# Shards whose counts estimate a corpus's document length (a sample: on GCS
# each is a read).
_SAMPLED_SHARDS = 16


def sequences_per_row(config: ml_collections.ConfigDict, data_dir: str, length: int) -> float:
  """The sequences a packed row of `length` tokens holds on average, for
  sizing the loader (`throughput.loader_workers`). With one sequence a
  document (`data.truncate_documents`), as many as documents of the prepared
  data's mean length fill (its shards' counts), at most
  `data.max_sequences_per_row`; otherwise (a document's sequences fill rows
  of their own but its last) and for data without counts, the most a row may
  hold."""
  most = config.data.max_sequences_per_row
  if most <= 1 or config.data.static or not config.data.get("truncate_documents", False):
    return float(most)
  try:
    stats = shards.read_stats(data_dir, limit=_SAMPLED_SHARDS)
  except (OSError, errors.Error) as e:
    logging.warning("Sizing the loader for %d sequences a row: %s's counts are unreadable "
                    "(%s)", most, data_dir, e)
    return float(most)
  if not stats.documents_used:
    return float(most)
  mean = min(stats.tokens / stats.documents_used + 2, length)  # with [CLS] and [SEP]
  return min(float(most), length / mean)


def loader_config(config: ml_collections.ConfigDict, data_dir: str, phase: Phase,
                  split: str, batch_size: int, seed_offset: int = 0,
                  worker_count: int = 0) -> loader.LoaderConfig:
  data = config.data
  return loader.LoaderConfig(
      data_dir, objective=config.objective, max_seq_length=phase.max_seq_length,
      batch_size=batch_size // jax.process_count(),
      masking=masking_config(config, phase.max_predictions, split),
      short_seq_prob=data.short_seq_prob, seed=config.seed + 1000 * phase.index + seed_offset,
      shuffle_window=data.shuffle_window, worker_count=worker_count, split=split,
      eval_percent=data.eval_percent, host_sharding=data.host_sharding,
      static=data.static and split == "train",
      max_sequences_per_row=data.max_sequences_per_row, packing_window=data.packing_window,
      read_ahead=data.read_ahead, truncate_documents=data.truncate_documents)


def prepare_data(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The prepared data directory the run reads: built first when the config
  says how (the demo; a build cut short is completed), checked for documents
  in every process's splits, then given each phase's statically masked
  instances when `data.static` asks for them.

  A directory on gs:// is read as `data.read_mode` says
  (`shards.reading_directory`): streamed, the URL itself (the default, unless
  this host holds a complete copy already), or this host's copy."""
  data_dir = config.data.dir or files.join(workdir, "data")
  if config.data.build_from:
    if not config.data.dir:
      _check_built_from(config, workdir, data_dir)
    if not _complete(data_dir):  # the builder keeps the shards already finished
      _build_documents(config, workdir, data_dir)
    else:
      error = None
      if jax.process_index() == 0:
        try:
          _check_still_built_from(config, workdir, data_dir)
        except Exception as e:  # every host stops with it (none waits)
          error = e
      hosts.agree(error, "checking the data against its vocabulary")
  mode = config.data.read_mode
  local, error = None, None
  try:
    shards.complete_shards(data_dir)  # a clear error if it is not there
    local = shards.reading_directory(data_dir, mode)  # checked as this host reads it
    check_splits(config, local)  # before the (expensive) static instances
  except Exception as e:  # every host stops with it (none waits in a collective)
    error = e
  hosts.agree(error, "reading the prepared data")
  if config.data.static:
    _build_static(config, data_dir)
    local = shards.reading_directory(data_dir, mode)
  if local != data_dir:
    logging.info("Reading %s from this host's copy, %s", data_dir, local)
  elif files.is_remote(data_dir):
    ahead = config.data.read_ahead
    logging.info("Streaming %s: each document a ranged read, %d read ahead, nothing copied",
                 data_dir, ahead if ahead >= 0 else loader.STREAM_READ_AHEAD)
  return local


def _complete(data_dir: str) -> bool:
  try:
    shards.complete_shards(data_dir)
    return True
  except (OSError, ValueError):
    return False


# What the workdir's vocabulary and `<workdir>/data` are built from
# (`data.build_from`), written before they are.
_BUILT_FROM_FILE = "built_from.json"
# The vocabulary a run trains on `data.build_from`, by `data.tokenizer`.
VOCABULARY_FILES = {"wordpiece": "vocab.txt", "bpe": "tokenizer.json"}


def vocabulary_file(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The vocabulary a run that builds its data trains into its workdir."""
  kind = config.data.tokenizer
  if kind not in VOCABULARY_FILES:
    raise errors.UsageError(f"data.tokenizer={kind!r} is not one of "
                            f"{', '.join(map(repr, VOCABULARY_FILES))}")
  return files.join(workdir, VOCABULARY_FILES[kind])


def _built_from(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return {"build_from": config.data.build_from, "vocab_size": config.data.vocab_size,
          "tokenizer": config.data.tokenizer}


def _check_built_from(config: ml_collections.ConfigDict, workdir: str, data_dir: str) -> None:
  """Refuses to reuse a workdir's vocabulary and data built from other settings,
  and records these settings before anything is built."""
  path, wanted = files.join(workdir, _BUILT_FROM_FILE), _built_from(config)
  built = None
  if files.isfile(path):
    built = files.read_json(path)
  elif files.isfile(files.join(data_dir, shards.INFO_FILE)):  # built before the record was
    built = {"build_from": shards.read_info(data_dir).get("input"),
             "vocab_size": wanted["vocab_size"]}
  if built is not None:
    built.setdefault("tokenizer", "wordpiece")  # recorded before there was a choice
    changed = [f"data.{key}={built.get(key)!r} then, {wanted[key]!r} now" for key in wanted
               if (paths.resolve_inputs(str(built.get(key))) if key == "build_from"
                   else built.get(key))
               != (paths.resolve_inputs(wanted[key]) if key == "build_from" else wanted[key])]
    if changed:
      vocab = files.join(workdir, VOCABULARY_FILES.get(built["tokenizer"], "vocab.txt"))
      raise errors.UsageError(f"{data_dir} and {vocab} were built with other settings "
                              f"({', '.join(changed)}); give another --workdir, or delete both "
                              "to rebuild them here")
  if jax.process_index() == 0 and not files.isfile(path):
    files.makedirs(workdir)
    files.write_json(path, wanted)


def _check_still_built_from(config: ml_collections.ConfigDict, workdir: str,
                            data_dir: str) -> None:
  """A complete dataset that a run built: its vocabulary must be the run's
  (`vocabulary_file`), and a change of the input since is said (the run goes
  on with the data as built: another stream would not fit its checkpoints)."""
  from bertjax.data import builder
  from bertjax.data.tokenizers import tokenizer_from_vocab_file

  info = shards.read_info(data_dir)
  vocab = vocabulary_file(config, workdir)
  if files.isfile(vocab) and info.get("tokenizer_sha256") != builder.tokenizer_sha256(
      tokenizer_from_vocab_file(vocab, info["tokenizer"].get("do_lower_case"))):
    raise errors.CorruptFileError(
        f"{vocab} is not the vocabulary {data_dir} was built with (it was edited or "
        "replaced since); put the original back, or give a new --workdir to build both anew")
  changes = builder.input_changes(info)
  if changes:
    logging.warning("%s was built from %s as it was; since then: %s. This run goes on with the "
                    "data as built; a new --workdir trains on the input as it is now", data_dir,
                    info["input"], changes)


def check_splits(config: ml_collections.ConfigDict, data_dir: str) -> None:
  """Every process must find documents in the training split and, when the run
  evaluates, in the held-out split; decided on every host from the document
  count alone, so all of them stop together (none waits in a collective)."""
  num_documents = len(loader.DocumentSource(data_dir))
  processes = 1 if config.data.host_sharding == "rows" else jax.process_count()
  splits = ["train"] + (["eval"] if config.eval.every_steps > 0 else [])
  for split in splits:
    chosen = len(loader.split_documents(num_documents, split, config.data.eval_percent))
    if split == "train":  # sentence pairs draw random segments from other documents
      instances.check_pair_documents(data_dir, config.objective, chosen, split)
    if chosen < processes:
      advice = ("raise data.eval_percent" if split == "eval" else "lower data.eval_percent")
      raise errors.UsageError(
          f"{data_dir}: data.eval_percent={config.data.eval_percent} of {num_documents} "
          f"documents leaves {chosen} in the {split} split, fewer than the {processes} "
          f"process(es) that read it; {advice}, or use more data"
          + (" or data.host_sharding='rows'" if processes > 1 else ""))


def _build_static(config: ml_collections.ConfigDict, data_dir: str) -> None:
  """Each phase's statically masked instances (the original's regime: masked once,
  `data.static_dupe_factor` copies), built by every host for its shards unless
  there already with these settings."""
  from bertjax.data import static_instances

  for phase in phases(config):
    count, error = 0, None
    try:
      count = static_instances.prepare_static(
          data_dir, objective=config.objective, max_seq_length=phase.max_seq_length,
          masking=masking_config(config, phase.max_predictions),
          dupe_factor=config.data.static_dupe_factor,
          short_seq_prob=config.data.short_seq_prob, seed=config.seed + 1000 * phase.index,
          eval_percent=config.data.eval_percent, num_workers=os.cpu_count() or 1,
          num_hosts=jax.process_count(), host_index=jax.process_index(), show_progress=False,
          keep_local_copy=True)  # the next phase builds from it, data.read_mode="copy" reads it
    except Exception as e:  # every host learns of a failure on any (none waits)
      error = e
    hosts.agree(error, f"building the static instances of length {phase.max_seq_length}")
    logging.info("Static instances of length %d: %d on this host", phase.max_seq_length,
                 count)


def _build_documents(config: ml_collections.ConfigDict, workdir: str, data_dir: str) -> None:
  """Trains a vocabulary on `data.build_from` and prepares it into `data_dir` (host 0;
  the other hosts learn whether it worked, rather than wait for it forever)."""
  error = None
  if jax.process_index() == 0:
    try:
      _build_on_this_host(config, workdir, data_dir)
    except Exception as e:  # shared with the other hosts below, then re-raised
      error = e
  hosts.agree(error, "preparing the data")


def _build_on_this_host(config: ml_collections.ConfigDict, workdir: str, data_dir: str) -> None:
  from bertjax.data import builder, vocabulary
  from bertjax.data.tokenizers import tokenizer_from_vocab_file

  vocab = vocabulary_file(config, workdir)
  file_format = config.data.get("file_format", "") or None  # "": sentences, checked
  try:
    if not files.isfile(vocab):
      if file_format is None:  # refused before a vocabulary is trained on it
        builder.check_input(config.data.build_from)
      kind = config.data.tokenizer
      logging.info("Training a %d-token %s vocabulary on %s", config.data.vocab_size,
                   "WordPiece" if kind == "wordpiece" else "byte-level BPE",
                   config.data.build_from)
      vocabulary.train(config.data.build_from, vocab, model=kind,
                       vocab_size=config.data.vocab_size, show_progress=False)
    logging.info("Preparing %s into %s", config.data.build_from, data_dir)
    stats = builder.prepare(config.data.build_from, data_dir,
                            tokenizer_from_vocab_file(vocab), file_format=file_format,
                            num_shards=4, num_workers=1, show_progress=False,
                            keep_local_copy=config.data.static)  # the static build's input
  except builder.OneDocumentALineError as e:  # the run's setting, not the builder's flag
    raise errors.UsageError(e.message("--config.data.file_format")) from None
  except builder.DatasetMismatchError as e:  # the builder's advice is its own flags'
    raise errors.UsageError(
        f"{data_dir} (partly built) and {vocab} were built from {e.difference}; restore "
        "the input to finish them, or give a new --workdir to build both from the input as "
        "it is now") from None
  logging.info("Prepared data:\n%s", stats.summary())


def check_vocabulary(config: ml_collections.ConfigDict, data_dir: str) -> None:
  """The model's word embeddings must cover the data's token ids (a larger table,
  padded for sharding, is fine): an id past the table would be clamped by the
  lookup, silently."""
  data_vocab = shards.read_info(data_dir)["vocab_size"]
  if data_vocab > config.model.vocab_size:
    raise errors.UsageError(f"{data_dir} was prepared with a {data_vocab}-token vocabulary, larger "
                            f"than model.vocab_size={config.model.vocab_size}: set "
                            f"--config.model.vocab_size={data_vocab}")
