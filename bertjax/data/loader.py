"""The pre-training input pipeline: prepared shards -> masked batches -> devices.

Per JAX process (host):

  document indices [process::processes] -> shuffle (per epoch) -> repeat
    -> read + split into sentences            (random access, any shard)
    -> instances: mlm_nsp pairs | packed sequences (mlm, ltr)
    -> window shuffle -> batch (padded to max_seq_length)
    -> masks (mlm objectives) or next-token targets (ltr)
    -> [worker processes] -> global jax.Arrays on the mesh, prefetched

With `max_sequences_per_row > 1` the shuffled instances are masked a window
at a time, packed into rows (`bertjax.data.packing`), then batched.

A prepared directory on `gs://` is read in place (`bertjax.data.streaming`:
each document a ranged read), with `read_ahead` documents read, and their
instances made, ahead of the pipeline by a pool of threads: the network's
latency overlaps with the work, and nothing else changes (the same batches and
iterator states as a local read).

Every step is deterministic for a seed, and the iterator's state (a small JSON
dict) restores it exactly: the batches after a restore are those that would
have come next, across epoch boundaries and with worker processes (for the same
worker count). Hosts read disjoint documents that together cover the dataset
once per epoch; random B segments of next-sentence pairs come from any document
of the same split (training or held-out evaluation).
"""

from __future__ import annotations

import dataclasses
import os
import struct
import sys
from typing import Any, Callable

import grain
import numpy as np

from bertjax import errors, files, worker_signals
from bertjax.data import instances, masking, packing, shards
# The pipeline's last stage (global batches on the mesh), where its callers find it.
from bertjax.data.device_iterator import DeviceIterator  # pylint: disable=unused-import
from bertjax.data.windows import WindowShuffle
from bertjax.data.tokenizers import tokenizer_from_settings

Batch = packing.Batch


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
  """What to stream from a prepared directory.

  Attributes:
    data_dir: A directory written by `bertjax.tools.prepare_pretraining_data`.
    objective: "mlm_nsp" (the paper), "mlm_pairs" (No NSP: its pairs, no NSP
      labels), "mlm" (No NSP on packed sequences) or "ltr" (LTR & No NSP: the
      No NSP pairs, next-token targets).
    max_seq_length: Tokens per sequence (128, then 512 in the paper).
    batch_size: Rows per batch on this process (a sequence each, unpacked).
    masking: Masking rates (ignored by "ltr").
    short_seq_prob: Probability of a shorter target length.
    seed: Seeds the order, the instances and the masks.
    num_epochs: Passes over the data; None repeats forever.
    shuffle_window: Instances shuffled together after instance creation. A
      document's instances come out together, so a small window puts several
      in a batch; the pre-training configs use 50,000
      (docs/benchmarks.md#shuffle-window-and-batch-independence).
    worker_count: Worker processes (0: in the calling process).
    static: Read the statically masked instances written with
      `--static_dupe_factor` instead of masking on the fly; `objective`,
      `max_seq_length` and `masking` must match what was written.
    drop_remainder: Drop a last, incomplete batch (static shapes for training).
    split: "all" documents, or "train" / "eval": a held-out `eval_percent` of
      the documents (chosen by a hash of their index) for evaluation.
    eval_percent: Size of the held-out split, in percent.
    host_sharding: "documents" (each process reads its own documents: the
      scalable default) or "rows" (every process runs the whole pipeline and
      keeps its rows of each global batch: global batches independent of the
      number of processes, for small runs and equivalence tests).
    max_sequences_per_row: 1: a sequence a row, padded. More: rows pack up to
      this many sequences that do not attend to each other
      (`bertjax.data.packing`); dynamic `mlm` and `ltr` sequences then stay
      within a document (static ones are packed as they were written).
      `batch_size` counts rows.
    packing_window: Sequences packed together (more: fuller rows).
    truncate_documents: Dynamic `mlm`: a document gives one sequence, its
      first `max_seq_length - 2` tokens, and the rest of it is left out
      (ModernBERT's rule: `instances.PackedSequences`).
    read_ahead: Documents (static instances) read ahead of the pipeline, with
      their instances made, by half as many threads (at most
      `MAX_READ_THREADS`): what hides a streamed read's latency. 0 reads each
      when it is needed; -1: `STREAM_READ_AHEAD` for a directory on `gs://`,
      else 0. Batches and iterator states do not depend on it.
  """

  data_dir: str
  objective: str = "mlm_nsp"
  max_seq_length: int = 128
  batch_size: int = 32
  masking: masking.MaskingConfig = masking.MaskingConfig()
  short_seq_prob: float = 0.1
  seed: int = 0
  num_epochs: int | None = None
  shuffle_window: int = 1000
  worker_count: int = 0
  static: bool = False
  drop_remainder: bool = True
  split: str = "all"
  eval_percent: float = 1.0
  host_sharding: str = "documents"
  max_sequences_per_row: int = 1
  packing_window: int = 2000
  read_ahead: int = -1
  truncate_documents: bool = False

  @property
  def packed(self) -> bool:
    return self.max_sequences_per_row > 1

  def __post_init__(self):
    if self.objective not in instances.OBJECTIVES:
      raise errors.UsageError(f"objective must be one of {instances.OBJECTIVES}, got "
                              f"{self.objective!r}")
    if self.max_seq_length < 8:
      raise errors.UsageError(f"max_seq_length={self.max_seq_length} is too short")
    if self.batch_size < 1:
      raise errors.UsageError(f"batch_size must be positive, got {self.batch_size}")
    if self.objective != "ltr":
      self.masking.check_length(self.max_seq_length)
    elif self.static:
      raise errors.UsageError("static masking is for the masked-LM objectives, not 'ltr'")
    if self.split not in ("all", "train", "eval"):
      raise errors.UsageError(f"split must be 'all', 'train' or 'eval', got {self.split!r}")
    if self.host_sharding not in ("documents", "rows"):
      raise errors.UsageError(f"host_sharding must be 'documents' or 'rows', got "
                              f"{self.host_sharding!r}")
    if self.read_ahead < -1:
      raise errors.UsageError(f"read_ahead must be >= -1, got {self.read_ahead}")
    if self.truncate_documents and (self.objective != "mlm" or self.static):
      raise errors.UsageError(
          "truncate_documents makes one sequence a document for the dynamic mlm objective; "
          f"objective={self.objective!r}{' with static instances' if self.static else ''} "
          "makes its own")
    if self.max_sequences_per_row < 1 or self.packing_window < 1:
      raise errors.UsageError(f"max_sequences_per_row={self.max_sequences_per_row} and "
                              f"packing_window={self.packing_window} must be >= 1")


class DocumentSource:
  """Random access to the tokenised documents of a prepared directory."""

  def __init__(self, data_dir: str):
    self.data_dir = data_dir
    self.info = shards.read_info(data_dir)
    shards.check_tokenizer(data_dir, self.info)  # the ids are of this vocabulary
    self._records = shards.open_records(data_dir, shards.complete_shards(data_dir))
    self._vocab_size = self.info["vocab_size"]

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, index: int) -> instances.Sentences:
    try:
      ids, offsets = shards.decode_document(self._records[index])
      if ids.size and (ids.max() >= self._vocab_size or ids.min() < 0):
        raise ValueError(f"token ids outside the {self._vocab_size}-token vocabulary")
    except (ValueError, struct.error) as e:
      if isinstance(e, errors.CorruptFileError):  # named already
        raise
      path, local = self._records.locate(index)
      raise errors.CorruptFileError(
          f"{path} is damaged: its document {local} does not decode ({e}); "
          f"{shards.rebuild_advice(self.data_dir, path)}") from None
    return [ids[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


# Documents read ahead of the pipeline from a directory on gs://, by half as
# many threads (each waits on one streamed read at a time: they bound the reads
# in flight). More reads documents long before they are needed, which a
# restore's first batch waits for (docs/benchmarks.md#a-restart-with-the-data-on-gcs);
# a network with a longer round trip than the test server's wants more.
STREAM_READ_AHEAD = 64
MAX_READ_THREADS = 128


def read_ahead(config: LoaderConfig) -> int:
  """The documents the loader reads ahead (`LoaderConfig.read_ahead` resolved)."""
  if config.read_ahead >= 0:
    return config.read_ahead
  return STREAM_READ_AHEAD if files.is_remote(config.data_dir) else 0


def read_options(config: LoaderConfig) -> grain.ReadOptions:
  """How the documents (static instances) enter the pipeline: each when it is
  needed, or read ahead in order by threads (`grain`'s prefetch keeps the
  order and the iterator state)."""
  ahead = read_ahead(config)
  threads = min(max(ahead // 2, 1), MAX_READ_THREADS) if ahead else 0
  return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=ahead)


class _NextSentenceInstances(grain.experimental.FlatMapTransform):
  """A document -> its sentence-pair instances (the original generator).

  Called on a `DocumentRef` where the documents are read (`document_stream`'s
  `prepare`), so that the random B segments of read-ahead documents are read
  ahead too; `_Instances` then hands them on.
  """

  def __init__(self, source: DocumentSource, config: LoaderConfig, cls_id: int, sep_id: int):
    self.source, self.config = source, config
    self.cls_id, self.sep_id = cls_id, sep_id
    # Random B segments come from the same split: an evaluation document never
    # shows up in a training instance, nor the reverse.
    self.candidates = split_documents(len(source), config.split, config.eval_percent)
    if config.split != "eval":  # (a held-out split of one document evaluates as it can)
      instances.check_pair_documents(config.data_dir, config.objective, len(self.candidates),
                                     config.split)
    # Part of grain's FlatMap interface; only its random-access flat map uses it.
    self.max_fan_out = 4 * config.max_seq_length

  def flat_map(self, document: instances.DocumentRef) -> list[instances.Instance]:
    rng = np.random.default_rng([self.config.seed, document.stream_index])
    return instances.create_instances_from_document(
        document.sentences, document.index, self.candidates, self.source.__getitem__,
        self.config.max_seq_length, self.config.short_seq_prob, self.cls_id, self.sep_id,
        rng, document.stream_index)

  __call__ = flat_map


class _Instances(grain.experimental.FlatMapTransform):
  """A document's instances, made where it was read -> one at a time."""

  def __init__(self, max_fan_out: int):
    self.max_fan_out = max_fan_out  # grain's interface (its random-access flat map)

  def flat_map(self, made: list[instances.Instance]) -> list[instances.Instance]:
    return made


class _Collate:
  """Instances -> a batch padded to `max_seq_length` (static shapes)."""

  def __init__(self, max_seq_length: int, pad_id: int):
    self.max_seq_length, self.pad_id = max_seq_length, pad_id

  def __call__(self, batch: list[instances.Instance]) -> Batch:
    size, length = len(batch), self.max_seq_length
    input_ids = np.full((size, length), self.pad_id, np.int32)
    token_type_ids = np.zeros((size, length), np.int32)
    lengths = np.zeros(size, np.int32)
    for row, instance in enumerate(batch):
      n = len(instance.token_ids)
      input_ids[row, :n] = instance.token_ids
      token_type_ids[row, instance.num_first:n] = 1
      lengths[row] = n
    return {
        "input_ids": input_ids,
        "attention_mask": (np.arange(length)[None] < lengths[:, None]).astype(np.int32),
        "token_type_ids": token_type_ids,
        "lengths": lengths,
        "keys": np.array([i.key for i in batch], np.uint64),
        "next_sentence_labels": np.array([i.next_sentence_label for i in batch], np.int32),
    }


class _Targets:
  """A collated batch -> model inputs and targets of the objective."""

  def __init__(self, config: LoaderConfig, masker: masking.Masker | None):
    self.objective, self.masker = config.objective, masker

  def __call__(self, batch: Batch) -> Batch:
    lengths, keys = batch.pop("lengths"), batch.pop("keys")
    labels = batch.pop("next_sentence_labels")
    if self.objective == "ltr":
      ids = batch["input_ids"]
      batch["lm_labels"] = np.concatenate([ids[:, 1:], np.zeros_like(ids[:, :1])], axis=1)
      batch["lm_weights"] = (np.arange(ids.shape[1])[None] < lengths[:, None] - 1).astype(
          np.float32)
      return batch
    batch.update(self.masker(batch["input_ids"], lengths, keys))
    if self.objective == "mlm_nsp":
      batch["next_sentence_labels"] = labels
    return batch


def split_documents(num_documents: int, split: str, eval_percent: float) -> np.ndarray:
  """Indices of the documents of a split; "eval" holds out a fixed hash-chosen share."""
  indices = np.arange(num_documents, dtype=np.uint64)
  if split == "all":
    return indices.astype(np.int64)
  held_out = masking.uniform(indices, np.zeros(1, np.int64), 7)[:, 0] < eval_percent / 100
  return np.flatnonzero(held_out if split == "eval" else ~held_out)


def document_order(documents: int | np.ndarray, process_index: int, process_count: int,
                   seed: int, num_epochs: int | None) -> grain.MapDataset:
  """The document indices one process reads, epoch after epoch.

  Processes take every `process_count`-th document (of `range(documents)` or
  of the given indices), so they read disjoint sets that together cover them;
  each epoch is shuffled anew.
  """
  if isinstance(documents, int):
    documents = np.arange(documents)
  indices = documents[process_index::process_count]
  return (grain.MapDataset.range(len(indices)).shuffle(seed=seed).repeat(num_epochs)
          .map(lambda position: int(indices[position])))


def document_stream(source: DocumentSource, config: LoaderConfig, process_index: int,
                    process_count: int,
                    prepare: Callable[[instances.DocumentRef], Any] | None = None
                    ) -> grain.IterDataset:
  """The `DocumentRef`s one process reads (before instances are made), or
  `prepare(ref)` of each (made where the document is read: read ahead, with
  `config.read_ahead`).

  A document's `stream_index` is `epoch * num_documents + index`: the same
  whichever process reads it, so its instances and masks depend only on the
  seed, the epoch and the document, not on the number of hosts.
  """
  num_documents = len(source)
  chosen = split_documents(num_documents, config.split, config.eval_percent)
  per_process = len(chosen[process_index::process_count])
  if per_process == 0:
    raise errors.UsageError(f"{config.data_dir}: {len(chosen)} documents ({config.split} split) "
                            f"leave process {process_index} of {process_count} none; use fewer "
                            "processes or more data")

  def reference(position: int, index: int) -> instances.DocumentRef:
    epoch = position // per_process
    return instances.DocumentRef(epoch * num_documents + index, index, source[index])

  documents = document_order(chosen, process_index, process_count, config.seed,
                             config.num_epochs).map_with_index(reference)
  if prepare is not None:
    documents = documents.map(prepare)
  return documents.to_iter_dataset(read_options(config))


def make_dataset(config: LoaderConfig, process_index: int = 0,
                 process_count: int = 1) -> grain.IterDataset:
  """The pipeline of one process; iterate it, or `iter()` it for a checkpointable
  iterator (`get_state()` / `set_state()`)."""
  if not 0 <= process_index < process_count:
    raise errors.UsageError(f"process_index={process_index} not in [0, {process_count})")
  if config.host_sharding == "rows" and process_count > 1:
    # The whole pipeline at the global batch size; this process keeps its rows.
    whole = dataclasses.replace(config, batch_size=config.batch_size * process_count,
                                host_sharding="documents")
    rows = slice(process_index * config.batch_size, (process_index + 1) * config.batch_size)
    return make_dataset(whole).map(lambda batch: {k: v[rows] for k, v in batch.items()})
  if config.static:
    return _static_dataset(config, process_index, process_count)
  source = DocumentSource(config.data_dir)
  info = source.info
  tokenizer = tokenizer_from_settings(config.data_dir, info["tokenizer"])
  cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id

  if config.objective in instances.PAIR_OBJECTIVES:
    make = _NextSentenceInstances(source, config, cls_id, sep_id)
    stream = document_stream(source, config, process_index, process_count, prepare=make)
    stream = grain.experimental.FlatMapIterDataset(stream, _Instances(make.max_fan_out))
  else:
    stream = document_stream(source, config, process_index, process_count)
    stream = instances.PackedSequences(stream, config.max_seq_length, config.short_seq_prob,
                                       cls_id, sep_id, config.seed,
                                       cross_documents=not config.packed,
                                       truncate_documents=config.truncate_documents)
  if config.shuffle_window > 1:
    stream = WindowShuffle(stream, config.shuffle_window, config.seed)
  masker = None
  if config.objective != "ltr":
    continuation = None
    if config.masking.whole_word:
      kind = info["tokenizer"]["type"]
      tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
      continuation = masking.continuation_table(tokens, kind)
    masker = masking.Masker(config.masking, tokenizer.vocab_size, tokenizer.special_ids,
                            continuation, config.seed)
  if config.packed:
    stream = _packed_rows(stream, _MaskedExamples(config, masker), config, tokenizer.pad_id)
  else:
    stream = stream.batch(config.batch_size, drop_remainder=config.drop_remainder,
                          batch_fn=_Collate(config.max_seq_length, tokenizer.pad_id))
    stream = stream.map(_Targets(config, masker))
  return _with_workers(stream, config)


class _MaskedExamples:
  """A window of instances -> `packing.Example`s, masked together (each by its
  own key: the mask it would get in an unpacked batch)."""

  def __init__(self, config: LoaderConfig, masker: masking.Masker | None):
    self.length, self.masker = config.max_seq_length, masker

  def __call__(self, window: list[instances.Instance]) -> list[packing.Example]:
    lengths = np.array([len(i.token_ids) for i in window])
    if self.masker is None:  # ltr: the targets are the next tokens
      empty = np.zeros(0, np.int32)
      return [packing.Example(i.token_ids, i.num_first, i.next_sentence_label, empty, empty)
              for i in window]
    ids = np.zeros((len(window), self.length), np.int32)
    for row, instance in enumerate(window):
      ids[row, :lengths[row]] = instance.token_ids
    masked = self.masker(ids, lengths, np.array([i.key for i in window], np.uint64))
    examples = []
    for row, instance in enumerate(window):
      real = masked["masked_weights"][row] > 0
      examples.append(packing.Example(
          masked["input_ids"][row, :lengths[row]], instance.num_first,
          instance.next_sentence_label, masked["masked_positions"][row, real],
          masked["masked_ids"][row, real]))
    return examples


def _decoded_examples(records: list[bytes]) -> list[packing.Example]:
  """Statically masked records -> `packing.Example`s."""
  examples = []
  for record in records:
    ids, first, label, positions, originals = shards.decode_instance(record)
    examples.append(packing.Example(ids, first, label, positions, originals))
  return examples


def _packed_rows(stream: grain.IterDataset,
                 prepare: Callable[[list[Any]], list[packing.Example]], config: LoaderConfig,
                 pad_id: int) -> grain.IterDataset:
  """Sequences -> batches of packed rows."""
  predictions = config.masking.max_predictions
  rows = packing.PackedRows(stream, prepare, config.max_seq_length,
                            config.max_sequences_per_row, predictions, config.packing_window,
                            config.seed)
  return rows.batch(config.batch_size, drop_remainder=config.drop_remainder,
                    batch_fn=packing.Collate(config.objective, config.max_seq_length,
                                             config.max_sequences_per_row, predictions, pad_id))


# Batches come back from the worker processes through their queue's pipe, not
# in shared memory (grain's default: a segment in /dev/shm per array, unlinked
# in a background thread once the last array on it is collected, and on CPUs a
# jax.Array keeps it). The segments in flight when a run ends (batches
# prefetched, one being handed over, unlinks queued) outlived it: the resource
# tracker unlinked them with a "leaked shared_memory objects" warning, or, if
# it was killed, no one did. A pipe's bytes end with the processes. The copy
# costs 1-2 ms more a batch of 1.8 MB (256 rows of 512 tokens, on 2 cores),
# against a training step's tenths of a second.
_NO_SHARED_MEMORY = grain.experimental.DatasetOptions(min_shm_size=sys.maxsize)


def _with_workers(stream: grain.IterDataset, config: LoaderConfig) -> grain.IterDataset:
  """`stream` made by `config.worker_count` processes, which leave a terminal's
  signals (Ctrl-C, SIGHUP, a stop of the whole process group) to this process:
  it stops them when the run ends (`DeviceIterator.close`;
  `bertjax.worker_signals`)."""
  if config.worker_count > 0:
    from absl import flags
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()  # grain reads its absl flags; a library caller has none
    worker_signals.start_resource_tracker()  # before grain's first semaphore
    stream = grain.experimental.WithOptionsIterDataset(stream, _NO_SHARED_MEMORY)
    stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=config.worker_count),
                                worker_init_fn=_worker_init)
  return stream


def _worker_init(index: int, count: int) -> None:
  """Sets up a loader worker process: the parent stops it (or its end does)."""
  del index, count
  worker_signals.ignore_in_worker()
  worker_signals.exit_with_parent()


class _StaticCollate:
  """Statically masked records -> a padded batch."""

  def __init__(self, config: LoaderConfig, pad_id: int):
    self.length, self.predictions = config.max_seq_length, config.masking.max_predictions
    self.objective, self.pad_id = config.objective, pad_id

  def __call__(self, records: list[bytes]) -> Batch:
    size = len(records)
    batch = {"input_ids": np.full((size, self.length), self.pad_id, np.int32),
             "attention_mask": np.zeros((size, self.length), np.int32),
             "token_type_ids": np.zeros((size, self.length), np.int32),
             "masked_positions": np.zeros((size, self.predictions), np.int32),
             "masked_ids": np.zeros((size, self.predictions), np.int32),
             "masked_weights": np.zeros((size, self.predictions), np.float32)}
    labels = np.zeros(size, np.int32)
    for row, record in enumerate(records):
      ids, first, labels[row], positions, originals = shards.decode_instance(record)
      batch["input_ids"][row, :len(ids)] = ids
      batch["attention_mask"][row, :len(ids)] = 1
      batch["token_type_ids"][row, first:len(ids)] = 1
      batch["masked_positions"][row, :len(positions)] = positions
      batch["masked_ids"][row, :len(positions)] = originals
      batch["masked_weights"][row, :len(positions)] = 1
    if self.objective == "mlm_nsp":
      batch["next_sentence_labels"] = labels
    return batch


def _static_dataset(config: LoaderConfig, process_index: int,
                    process_count: int) -> grain.IterDataset:
  """Statically masked instances, shuffled per epoch and shared across processes."""
  from bertjax.files import read_json

  shards.check_tokenizer(config.data_dir)
  records = shards.open_records(config.data_dir, shards.complete_shards(
      config.data_dir, shards.static_kind(config.max_seq_length)))
  written = read_json(os.path.join(config.data_dir,
                                   shards.static_info_file(config.max_seq_length)))
  if config.split == "eval":
    raise errors.UsageError("static instances are of the training split; evaluate with dynamic "
                            "masking (static=False)")
  wanted = {"objective": config.objective, "max_seq_length": config.max_seq_length,
            "masking": dataclasses.asdict(config.masking)}
  if config.split == "train":  # the held-out documents must be those left out
    wanted["eval_percent"] = config.eval_percent
  got = {key: written.get(key) for key in wanted}
  if got != wanted:
    raise errors.UsageError(f"{config.data_dir}: the static instances were written for {got}, "
                            f"not {wanted}; rebuild them or use dynamic masking (static=False)")
  tokenizer = tokenizer_from_settings(config.data_dir,
                                      shards.read_info(config.data_dir)["tokenizer"])
  stream = (grain.MapDataset.range(len(records))[process_index::process_count]
            .shuffle(seed=config.seed).repeat(config.num_epochs)
            .map(lambda index: records[index])
            .to_iter_dataset(read_options(config)))
  if config.packed:
    stream = _packed_rows(stream, _decoded_examples, config, tokenizer.pad_id)
  else:
    stream = stream.batch(config.batch_size, drop_remainder=config.drop_remainder,
                          batch_fn=_StaticCollate(config, tokenizer.pad_id))
  return _with_workers(stream, config)
