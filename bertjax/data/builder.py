"""The offline builder: raw corpus -> `array_record` shards of tokenised documents.

Each output shard is one task: its byte ranges of the input files (or its record
range of a TFDS dataset, or its share of the demo corpus) are read, split into
documents and sentences, tokenised in batches by the Rust tokenizer, and written
to the shard under a temporary name, renamed when complete; its `CorpusStats`
beside it mark it finished. Shards run in parallel worker processes (one core
each) and, on several hosts, by shard index modulo the host count. The command
line is `python -m bertjax.tools.prepare_pretraining_data`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
from typing import Any

from absl import logging
import numpy as np

from bertjax import files
from bertjax.data import corpus, shards

_SENTENCE_BATCH = 4096  # sentences per call of the Rust tokenizer


def _documents(task: dict[str, Any], stats: corpus.CorpusStats):
  """The raw documents of one shard's task."""
  source = task["source"]
  if source["kind"] == "files":
    for file_range in source["ranges"]:
      yield from corpus.read_range(corpus.FileRange(*file_range), task["file_format"],
                                   stats, task["max_line_chars"])
  elif source["kind"] == "tfds":
    data = corpus.tfds_source(source["name"], source["split"], source["data_dir"])
    yield from corpus.tfds_documents(data, source["start"], source["end"], stats,
                                     task["max_line_chars"])
  else:  # demo: every worker parses the (small) corpus and keeps its share.
    for index, document in enumerate(corpus.stdlib_documents()):
      if index % task["num_shards"] == task["shard"]:
        stats.documents_read += 1
        yield document


def build_shard(task: dict[str, Any], progress=None) -> dict[str, Any]:
  """Tokenises one shard's documents into its array_record file; returns stats."""
  from bertjax.data.tokenizers import tokenizer_from_settings

  tokenizer = tokenizer_from_settings(task["output_dir"], task["tokenizer"])
  dtype = np.dtype(task["token_dtype"])
  stats = corpus.CorpusStats()
  path = os.path.join(task["output_dir"], shards.shard_name(task["shard"],
                                                            task["num_shards"]))
  pending: list[list[str]] = []
  reported = [0, 0]

  def flush(writer):
    sentences = [s for document in pending for s in document]
    ids = tokenizer.encode_pieces(sentences) if sentences else []
    cursor = 0
    for document in pending:
      pieces = [p for p in ids[cursor:cursor + len(document)] if p]
      cursor += len(document)
      if len(pieces) < len(document):
        stats.lines_skipped["sentence without tokens"] += len(document) - len(pieces)
      if len(pieces) < task["min_sentences"]:
        stats.documents_skipped["no sentences" if not pieces
                                else f"fewer than {task['min_sentences']} sentences"] += 1
        continue
      writer.write(shards.encode_document(pieces, dtype))
      stats.documents_used += 1
      stats.sentences += len(pieces)
      stats.tokens += sum(len(p) for p in pieces)
    pending.clear()
    if progress is not None:
      progress.put((stats.documents_read - reported[0], stats.tokens - reported[1]))
      reported[:] = [stats.documents_read, stats.tokens]

  with shards.shard_writer(path) as writer:
    pending_sentences = 0
    for document in _documents(task, stats):
      pending.append(document)
      pending_sentences += len(document)
      if pending_sentences >= _SENTENCE_BATCH:
        flush(writer)
        pending_sentences = 0
    flush(writer)
  shards.mark_finished(path, stats.to_dict())
  _publish(task, path)
  return stats.to_dict()


def _publish(task: dict[str, Any], shard_path: str) -> None:
  """Uploads a finished shard to the remote output directory, its stats (the
  mark of a finished shard) last."""
  remote = task.get("publish_to")
  if remote:
    for path in (shard_path, shards.stats_path(shard_path)):
      files.upload(path, files.join(remote, os.path.basename(path)))


def _publish_files(local_dir: str, remote: str | None, names: list[str]) -> None:
  for name in names if remote else ():
    files.upload(os.path.join(local_dir, name), files.join(remote, name))


def _worker_init():
  # One core per worker: the Rust tokenizer would otherwise spread over all.
  os.environ["RAYON_NUM_THREADS"] = "1"
  os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _in_worker(args):
  function, task, progress = args
  return function(task, progress)


def plan(spec: str, num_shards: int, stats: corpus.CorpusStats,
         tfds_data_dir: str | None) -> list[dict[str, Any]]:
  """The source part of every shard; checks the input before any work."""
  if spec.startswith("demo:"):
    if spec != "demo:stdlib":
      raise ValueError(f"{spec}: the only demo corpus is demo:stdlib")
    return [{"kind": "demo"} for _ in range(num_shards)]
  if spec.startswith("tfds:"):
    name, split = corpus.parse_tfds_spec(spec)
    length = len(corpus.tfds_source(name, split, tfds_data_dir))
    bounds = [round(length * i / num_shards) for i in range(num_shards + 1)]
    return [{"kind": "tfds", "name": name, "split": split, "data_dir": tfds_data_dir,
             "start": bounds[i], "end": bounds[i + 1]} for i in range(num_shards)]
  inputs = corpus.scan_files(corpus.expand_inputs(spec), stats)
  if not inputs:
    raise ValueError(f"{spec}: no readable input files ({stats.summary()})")
  return [{"kind": "files", "ranges": [dataclasses.astuple(r) for r in part]}
          for part in corpus.plan_ranges(inputs, num_shards)]


def prepare(spec: str, output_dir: str, tokenizer, *, file_format: str = "sentences",
            num_shards: int = 16, num_workers: int = 1, num_hosts: int = 1,
            host_index: int = 0, min_sentences: int = 1, max_line_chars: int = 100_000,
            tfds_data_dir: str | None = None, overwrite: bool = False,
            show_progress: bool = True) -> corpus.CorpusStats:
  """Builds this host's shards; returns the counts over them.

  Documents with fewer than `min_sentences` sentences are skipped and counted.
  The default keeps every document with a sentence, as the original
  `create_pretraining_data.py` does: a one-sentence document gives
  random-next pairs only.

  Files are scanned (and counted) by every host; host 0 reports them.

  Raises:
    ValueError: bad settings, an output directory holding a different dataset
      (unless `overwrite` on a single host), or no usable document at all.
    FileNotFoundError: a missing input, before any work.
  """
  if files.is_remote(output_dir):
    local = shards.local_directory(output_dir, lambda name: name.endswith(".json"))
    return _prepare_in(spec, local, tokenizer, output_dir,
                       file_format=file_format, num_shards=num_shards,
                       num_workers=num_workers, num_hosts=num_hosts, host_index=host_index,
                       min_sentences=min_sentences, max_line_chars=max_line_chars,
                       tfds_data_dir=tfds_data_dir, overwrite=overwrite,
                       show_progress=show_progress)
  return _prepare_in(spec, output_dir, tokenizer, None, file_format=file_format,
                     num_shards=num_shards, num_workers=num_workers, num_hosts=num_hosts,
                     host_index=host_index, min_sentences=min_sentences,
                     max_line_chars=max_line_chars, tfds_data_dir=tfds_data_dir,
                     overwrite=overwrite, show_progress=show_progress)


def _prepare_in(spec: str, output_dir: str, tokenizer, publish_to: str | None, *,
                file_format: str, num_shards: int, num_workers: int, num_hosts: int,
                host_index: int, min_sentences: int, max_line_chars: int,
                tfds_data_dir: str | None, overwrite: bool,
                show_progress: bool) -> corpus.CorpusStats:
  """`prepare` into a local `output_dir`, uploading to `publish_to` (if given)
  the settings, and each shard once finished."""
  if not 0 <= host_index < num_hosts:
    raise ValueError(f"host_index={host_index} is not in [0, num_hosts={num_hosts})")
  if num_shards < 1:
    raise ValueError(f"num_shards must be positive, got {num_shards}")
  if min_sentences < 1:
    raise ValueError(f"min_sentences must be >= 1, got {min_sentences}")
  if overwrite and num_hosts > 1:
    raise ValueError("overwrite with several hosts would race (one host deleting what "
                     "another writes); empty the output directory first")
  file_stats = corpus.CorpusStats()
  sources = plan(spec, num_shards, file_stats, tfds_data_dir)

  # The tokenizer's files go to a staging directory first: they replace the
  # directory's own only once the dataset is known to be this one.
  with tempfile.TemporaryDirectory() as staging:
    settings = tokenizer.save(staging)
    info = {"tokenizer": settings, "tokenizer_sha256": _digest(staging),
            "num_shards": num_shards, "vocab_size": tokenizer.vocab_size,
            "token_dtype": shards.token_dtype(tokenizer.vocab_size).name, "input": spec,
            "file_format": file_format, "min_sentences": min_sentences,
            "max_line_chars": max_line_chars}
    os.makedirs(output_dir, exist_ok=True)
    info_path = os.path.join(output_dir, shards.INFO_FILE)
    if os.path.isfile(info_path):
      existing = {k: v for k, v in shards.read_info(output_dir).items()
                  if k not in ("format", "format_version")}
      if existing != json.loads(json.dumps(info)):
        if not overwrite:
          raise ValueError(f"{output_dir} holds a different dataset ({info_path}); pass "
                           "--overwrite to replace it, or choose another --output_dir")
        stale = ("documents-", "instances")  # the documents, every length's instances
        for directory in (output_dir, publish_to) if publish_to else (output_dir,):
          for name in files.listdir(directory):
            if name.startswith(stale):
              files.remove(files.join(directory, name))
    for name in os.listdir(staging):
      shutil.copyfile(os.path.join(staging, name), os.path.join(output_dir, f".{name}.tmp"))
      os.replace(os.path.join(output_dir, f".{name}.tmp"), os.path.join(output_dir, name))
    tokenizer_files = os.listdir(staging)
  shards.write_info(output_dir, info)
  _publish_files(output_dir, publish_to, tokenizer_files + [shards.INFO_FILE])

  tasks = []
  for index in range(host_index, num_shards, num_hosts):
    done = shards.stats_path(os.path.join(output_dir, shards.shard_name(index, num_shards)))
    if os.path.isfile(done):
      continue  # finished by an earlier run
    tasks.append({"shard": index, "num_shards": num_shards, "source": sources[index],
                  "output_dir": output_dir, "publish_to": publish_to, "tokenizer": settings,
                  "token_dtype": info["token_dtype"], "file_format": file_format,
                  "min_sentences": min_sentences, "max_line_chars": max_line_chars})
  logging.info("Building %d of this host's %d shards with %d workers", len(tasks),
               len(range(host_index, num_shards, num_hosts)), num_workers)
  _run(tasks, num_workers, show_progress)

  stats = file_stats if host_index == 0 else corpus.CorpusStats()
  for index in range(host_index, num_shards, num_hosts):
    path = shards.stats_path(os.path.join(output_dir, shards.shard_name(index, num_shards)))
    with open(path, encoding="utf-8") as f:
      stats.merge(corpus.CorpusStats.from_dict(json.load(f)))
  if stats.documents_used == 0:
    raise ValueError(f"{spec}: no usable document in this host's shards\n{stats.summary()}")
  return stats


def _digest(directory: str) -> str:
  """SHA-256 over the files of a directory (names and contents)."""
  digest = hashlib.sha256()
  for name in sorted(os.listdir(directory)):
    digest.update(name.encode())
    with open(os.path.join(directory, name), "rb") as f:
      digest.update(f.read())
  return digest.hexdigest()


def _run(tasks: list[dict[str, Any]], num_workers: int, show_progress: bool,
         function=None, unit: str = "tokens") -> None:
  """Runs `function(task, progress)` (default: `build_shard`) over the tasks."""
  from tqdm import tqdm

  function = function or build_shard
  bar = tqdm(total=None, unit=f" {unit}", unit_scale=True, disable=not show_progress,
             file=sys.stderr, desc="building")
  if num_workers <= 1:
    sink = _ListQueue(bar)
    for task in tasks:
      function(task, sink)
    bar.close()
    return
  context = multiprocessing.get_context("spawn")
  with context.Manager() as manager:
    progress = manager.Queue()
    with context.Pool(num_workers, initializer=_worker_init) as pool:
      pending = pool.map_async(_in_worker, [(function, t, progress) for t in tasks])
      while not pending.ready() or not progress.empty():
        try:
          _, count = progress.get(timeout=0.2)
          bar.update(count)
        except queue.Empty:
          pass
      pending.get()  # re-raises a worker's error
  bar.close()


class _ListQueue:
  """The progress queue of an in-process build."""

  def __init__(self, bar):
    self._bar = bar

  def put(self, item):
    self._bar.update(item[1])


def build_static_shard(task: dict[str, Any], progress=None) -> dict[str, Any]:
  """Writes instance shard `task["shard"]`: the masked examples of `dupe_factor`
  epochs of the dynamic pipeline over that shard's share of the documents."""
  from bertjax.data import loader
  from bertjax.data.masking import MaskingConfig

  config = loader.LoaderConfig(
      task["data_dir"], objective=task["objective"], max_seq_length=task["max_seq_length"],
      batch_size=256, masking=MaskingConfig(**task["masking"]),
      short_seq_prob=task["short_seq_prob"], seed=task["seed"],
      num_epochs=task["dupe_factor"], shuffle_window=1, drop_remainder=False,
      split="train", eval_percent=task["eval_percent"])
  path = os.path.join(task["data_dir"], shards.shard_name(
      task["shard"], task["num_shards"], shards.static_kind(task["max_seq_length"])))
  count = 0
  num_documents = len(loader.DocumentSource(task["data_dir"]))
  batches = []  # a shard beyond the number of documents stays empty
  if len(range(task["shard"], num_documents, task["num_shards"])):
    batches = loader.make_dataset(config, task["shard"], task["num_shards"])
  with shards.shard_writer(path) as writer:
    for batch in batches:
      rows = len(batch["input_ids"])
      for row in range(rows):
        writer.write(shards.encode_instance({k: v[row] for k, v in batch.items()}))
      count += rows
      if progress is not None:
        progress.put((0, rows))
  shards.mark_finished(path, {"instances": count})
  _publish(task, path)
  return {"instances": count}


def prepare_static(data_dir: str, *, objective: str, max_seq_length: int, masking,
                   dupe_factor: int, short_seq_prob: float = 0.1, seed: int = 0,
                   eval_percent: float = 1.0, num_workers: int = 1, num_hosts: int = 1,
                   host_index: int = 0, show_progress: bool = True) -> int:
  """Writes statically masked instances, as the original code did (`dupe_factor`
  differently masked copies of the data), from finished document shards.

  The instances of each length have their own files (`shards.static_kind`), so
  one directory holds both phases'. They come from the training split: the
  `eval_percent` of documents held out for evaluation (`loader.split_documents`)
  stay out, and evaluation masks them on the fly. Instances already written
  with the same settings are kept (a rerun finishes what is missing); with other
  settings they are replaced.

  Returns the number of instances this host wrote.
  """
  import dataclasses

  if dupe_factor < 1:
    raise ValueError(f"dupe_factor must be >= 1, got {dupe_factor}")
  publish_to = None
  if files.is_remote(data_dir):  # built from a local copy, each shard uploaded when done
    shards.complete_shards(data_dir)
    publish_to, data_dir = data_dir, shards.local_directory(data_dir)
  info = shards.read_info(data_dir)
  shards.complete_shards(data_dir)  # all documents first: random B segments read any
  num_shards = info["num_shards"]
  settings = {"objective": objective, "max_seq_length": max_seq_length,
              "masking": dataclasses.asdict(masking), "short_seq_prob": short_seq_prob,
              "seed": seed, "dupe_factor": dupe_factor, "eval_percent": eval_percent,
              "num_shards": num_shards}
  kind, info_file = shards.static_kind(max_seq_length), shards.static_info_file(max_seq_length)
  existing = os.path.join(data_dir, info_file)
  if os.path.isfile(existing):
    from bertjax.files import read_json
    written = {k: v for k, v in read_json(existing).items()
               if k not in ("format", "format_version")}
    if written != json.loads(json.dumps(settings)):
      if num_hosts > 1:
        raise ValueError(f"{existing} describes other static instances; with several hosts, "
                         f"delete them ({kind}-* and this file) first")
      # On gs:// the old settings file goes first, then the old instances: a
      # reader never pairs the new settings with old shards.
      for directory in (publish_to, data_dir) if publish_to else (data_dir,):
        if publish_to and directory == publish_to:
          files.remove(files.join(publish_to, info_file))
        for name in files.listdir(directory):
          if name.startswith(f"{kind}-"):
            files.remove(files.join(directory, name))
  shards.write_info(data_dir, settings, info_file)
  _publish_files(data_dir, publish_to, [info_file])
  tasks = []
  for index in range(host_index, num_shards, num_hosts):
    done = shards.stats_path(os.path.join(data_dir, shards.shard_name(index, num_shards,
                                                                      kind)))
    if not os.path.isfile(done):
      tasks.append({"shard": index, "num_shards": num_shards, "data_dir": data_dir,
                    "publish_to": publish_to, **settings})
  _run(tasks, num_workers, show_progress, build_static_shard, "instances")
  total = 0
  for index in range(host_index, num_shards, num_hosts):
    path = shards.stats_path(os.path.join(data_dir, shards.shard_name(index, num_shards,
                                                                      kind)))
    with open(path, encoding="utf-8") as f:
      total += json.load(f)["instances"]
  return total
