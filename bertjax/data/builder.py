"""The offline builder: raw corpus -> `array_record` shards of tokenised documents.

Each output shard is one task: its byte ranges of the input files (or its record
range of a TFDS dataset, or its share of the demo corpus) are read, split into
documents and sentences, tokenised in batches by the Rust tokenizer, and written
to the shard under a temporary name, renamed when complete; its `CorpusStats`
beside it mark it finished. Shards run in parallel worker processes (one core
each) and, on several hosts, by shard index modulo the host count. The command
line is `python -m bertjax.tools.prepare_pretraining_data`.

Nothing is marked finished unless the host's shards hold a usable document:
a shard with none is marked only once another has one. A dataset that
replaces another (`overwrite`) is built in a staging directory beside it and
moved in only then, so input that turns out unusable leaves the old one whole;
the move (`_swap_in`, on `gs://` an upload) never shows readers a dataset that
mixes old and new shards.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import tempfile
from typing import Any, Callable

from absl import logging
import numpy as np

from bertjax import errors, files
from bertjax.data import build_pool, corpus, shards, stdlib_corpus
from bertjax.data.file_format import (  # noqa: F401 (the builder's, as well)
    ONE_DOCUMENT_LINES, OneDocumentALineError, check_input, check_sentence_files)
from bertjax.data.progress import Progress

_SENTENCE_BATCH = 4096  # sentences per call of the Rust tokenizer


_STALE = ("documents-", "instances")  # a dataset's shards, every length's instances

class NoDocumentsError(errors.UsageError):
  """The input holds no usable document; no shard was marked finished.

  Attributes:
    line: One line naming the input, the cause and what became of the output.
    stats: The account of every file, document and line (`summary()`).
  """

  def __init__(self, spec: str, stats: corpus.CorpusStats, outcome: str, where: str = ""):
    skipped = sum(stats.files_skipped.values())
    cause = (f"all {skipped} input files were skipped" if skipped and not stats.files_read
             else f"{stats.documents_read} documents read, none usable")
    self.line = f"{spec}: no usable document{where} ({cause}); {outcome}"
    self.stats = stats
    super().__init__(f"{self.line}\n{stats.summary()}")


class DatasetMismatchError(errors.UsageError):
  """An output directory holds a dataset of other input or settings.

  Attributes:
    difference: What differs ("the input as it was then: 1 file added (...)").
  """

  def __init__(self, message: str, difference: str):
    super().__init__(message)
    self.difference = difference


def differences(existing: dict[str, Any], info: dict[str, Any]) -> str:
  """What makes the dataset described by `existing` (a `dataset_info.json`)
  another than `info` would build: '' when it is the same one.

  A dataset written before the input's files were recorded is judged by its
  settings alone; tokenizer settings an earlier bertjax saved are read as
  this one saves them (`tokenizers.current_settings`).
  """
  from bertjax.data.tokenizers import current_settings

  old = {k: v for k, v in existing.items() if k not in ("format", "format_version")}
  if isinstance(old.get("tokenizer"), dict):
    old["tokenizer"] = current_settings(old["tokenizer"])
  new = json.loads(json.dumps(info))
  if "input_files" not in old:
    new.pop("input_files", None)
  parts = []
  settings = _changed({k: v for k, v in old.items() if k != "input_files"},
                      {k: v for k, v in new.items() if k != "input_files"})
  if settings:
    parts.append("other settings (" + ", ".join(settings) + ")")
  if old.get("input_files") != new.get("input_files"):
    parts.append("the input as it was then; since then: " + (corpus.describe_changes(
        old.get("input_files") or {}, new.get("input_files") or {}) or "it is read otherwise"))
  return " and ".join(parts)


def _changed(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
  """'tokenizer.do_lower_case: True then, False now' for each setting that differs."""
  changes = []
  for key in sorted(set(old) | set(new)):
    before, now = old.get(key), new.get(key)
    if before == now:
      continue
    if key == "tokenizer_sha256":
      changes.append("another vocabulary (its SHA-256)")
    elif isinstance(before, dict) and isinstance(now, dict):
      changes += _changed(before, now, f"{prefix}{key}.")
    else:
      changes.append(f"{prefix}{key}: {_short(before)} then, {_short(now)} now")
  return changes


def _short(value: Any) -> str:
  text = json.dumps(value) if not isinstance(value, str) else value
  return text if len(text) <= 60 else text[:57] + "..."


def input_changes(info: dict[str, Any]) -> str:
  """How the input files a dataset was built from (its `dataset_info.json`)
  changed since: '' when they did not (or were not files, or not recorded)."""
  before = info.get("input_files")
  if not before:
    return ""
  now: dict[str, list] = {}
  try:
    corpus.scan_files(corpus.expand_inputs(info["input"]), corpus.CorpusStats(), now)
  except (FileNotFoundError, IsADirectoryError) as e:
    return f"the input cannot be read ({e})"
  return corpus.describe_changes(before, now)


def _documents(task: dict[str, Any], stats: corpus.CorpusStats, progress):
  """The raw documents of one shard's task; `progress(n)` counts the input
  read (bytes of files, records of TFDS, documents of the demo corpus)."""
  source = task["source"]
  if source["kind"] == "files":
    for file_range in source["ranges"]:
      yield from corpus.read_range(corpus.FileRange(*file_range), task["file_format"],
                                   stats, task["max_line_chars"], progress)
  elif source["kind"] == "tfds":
    data = corpus.tfds_source(source["name"], source["split"], source["data_dir"])
    yield from corpus.tfds_documents(data, source["start"], source["end"], stats,
                                     task["max_line_chars"], progress)
  else:  # demo: every worker parses the (small) corpus and keeps its share.
    for index, document in enumerate(stdlib_corpus.stdlib_documents()):
      if index % task["num_shards"] == task["shard"]:
        stats.documents_read += 1
        progress(1)
        yield document


def _work(source: dict[str, Any]) -> int | None:
  """How much input a shard reads, in `_documents`' progress units, if known."""
  if source["kind"] == "files":
    return sum(end - start for _, start, end, *_ in source["ranges"])
  if source["kind"] == "tfds":
    return source["end"] - source["start"]
  return None


def build_shard(task: dict[str, Any], progress=None) -> dict[str, Any]:
  """Tokenises one shard's documents into its array_record file; returns stats.

  A shard with a usable document is marked finished; an empty one is left for
  the caller to mark once it knows the dataset is not empty.
  """
  from bertjax.data.tokenizers import tokenizer_from_settings

  tokenizer = tokenizer_from_settings(task["output_dir"], task["tokenizer"])
  dtype = np.dtype(task["token_dtype"])
  stats = corpus.CorpusStats()
  path = os.path.join(task["output_dir"], shards.shard_name(task["shard"],
                                                            task["num_shards"]))
  pending: list[list[str]] = []
  read = [0]  # input read, in `_documents`' units
  reported = [0, 0, 0]  # input, documents, tokens

  def flush(writer):
    ids = tokenizer.encode_sentences(pending) if pending else []
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
      progress.put((read[0] - reported[0], {"documents": stats.documents_used - reported[1],
                                            "tokens": stats.tokens - reported[2]}))
      reported[:] = [read[0], stats.documents_used, stats.tokens]

  def advance(amount: int) -> None:
    read[0] += amount

  with shards.shard_writer(path) as writer:
    pending_sentences = 0
    for document in _documents(task, stats, advance):
      pending.append(document)
      pending_sentences += len(document)
      if pending_sentences >= _SENTENCE_BATCH:
        flush(writer)
        pending_sentences = 0
    flush(writer)
  if stats.documents_used:
    shards.mark_finished(path, stats.to_dict())
    shards.publish(path, task.get("publish_to"), task.get("keep_local", False))
  return stats.to_dict()


def plan(spec: str, num_shards: int, stats: corpus.CorpusStats, tfds_data_dir: str | None,
         outcome: str = "nothing was written",
         manifest: dict[str, list] | None = None,
         check_sentences: bool = False) -> list[dict[str, Any]]:
  """The source part of every shard; checks the input before any work.

  Args:
    manifest: Receives what the input files were (`corpus.scan_files`).
    check_sentences: Refuse input files that look like one document a line
      (`check_sentence_files`): they are to be read one sentence a line, a
      format the user did not choose.

  Raises:
    NoDocumentsError: every input file is skipped (`outcome` says what that
      left of the output).
    OneDocumentALineError: with `check_sentences`, a file that looks like one
      document a line.
  """
  if spec.startswith("demo:"):
    if spec != "demo:stdlib":
      raise errors.UsageError(f"{spec}: the only demo corpus is demo:stdlib")
    return [{"kind": "demo"} for _ in range(num_shards)]
  if spec.startswith("tfds:"):
    name, split = corpus.parse_tfds_spec(spec)
    length = len(corpus.tfds_source(name, split, tfds_data_dir))
    bounds = [round(length * i / num_shards) for i in range(num_shards + 1)]
    return [{"kind": "tfds", "name": name, "split": split, "data_dir": tfds_data_dir,
             "start": bounds[i], "end": bounds[i + 1]} for i in range(num_shards)]
  inputs = corpus.scan_files(corpus.expand_inputs(spec), stats, manifest)
  if not inputs:
    raise NoDocumentsError(spec, stats, outcome)
  if check_sentences:
    check_sentence_files(inputs)
  return [{"kind": "files", "ranges": [dataclasses.astuple(r) for r in part]}
          for part in corpus.plan_ranges(inputs, num_shards)]


def prepare(spec: str, output_dir: str, tokenizer, *, file_format: str | None = None,
            num_shards: int = 16, num_workers: int = 1, num_hosts: int = 1,
            host_index: int = 0, min_sentences: int = 1, max_line_chars: int = 100_000,
            tfds_data_dir: str | None = None, overwrite: bool = False,
            show_progress: bool = True, keep_local_copy: bool = False) -> corpus.CorpusStats:
  """Builds this host's shards; returns the counts over them.

  `file_format` is "sentences" (one a line, a blank line between documents)
  or "documents" (one a line); None reads sentences and refuses files that
  look like one document a line (`check_sentence_files`).

  Documents with fewer than `min_sentences` sentences are skipped and counted.
  The default keeps every document with a sentence, as the original
  `create_pretraining_data.py` does: a one-sentence document gives
  random-next pairs only.

  Files are scanned (and counted) by every host; host 0 reports them. Built
  for `gs://`, the local copy is removed as the shards are uploaded, unless
  `keep_local_copy` (static instances are built from it next, and remove it).

  Raises:
    ValueError: bad settings, an output directory holding a different dataset
      (unless `overwrite` on a single host), or no usable document at all.
    FileNotFoundError: a missing input, before any work.
  """
  remote = files.is_remote(output_dir)
  with errors.writing(output_dir, "the shards finished before are kept, and an old dataset "
                      "being replaced (--overwrite) is whole",
                      smaller="build smaller shards (more --num_shards, with --overwrite)"):
    # On gs:// the dataset is built in a local copy (its settings and the stats
    # of the shards finished there first), each shard uploaded, checked and
    # removed here when done.
    local = (shards.local_directory(output_dir, lambda name: name.endswith(".json"))
             if remote else output_dir)
    for directory in (local, os.path.dirname(os.path.abspath(local))):
      files.remove_stale_staging(directory)  # of an earlier build that was killed
    stats = _prepare_in(spec, local, tokenizer, output_dir if remote else None,
                        file_format=file_format, num_shards=num_shards,
                        num_workers=num_workers, num_hosts=num_hosts, host_index=host_index,
                        min_sentences=min_sentences, max_line_chars=max_line_chars,
                        tfds_data_dir=tfds_data_dir, overwrite=overwrite,
                        show_progress=show_progress, keep_local=keep_local_copy)
  if remote and not keep_local_copy:  # all on gs:// now: a rerun copies back what it reads
    shards.remove_this_hosts_copy(local, output_dir, "documents", num_hosts, host_index)
  return stats


def _prepare_in(spec: str, output_dir: str, tokenizer, publish_to: str | None, *,
                file_format: str | None, num_shards: int, num_workers: int, num_hosts: int,
                host_index: int, min_sentences: int, max_line_chars: int,
                tfds_data_dir: str | None, overwrite: bool, show_progress: bool,
                keep_local: bool) -> corpus.CorpusStats:
  """`prepare` into a local `output_dir`, uploading to `publish_to` (if given)
  the settings, and each shard once finished."""
  if not 0 <= host_index < num_hosts:
    raise errors.UsageError(f"host_index={host_index} is not in [0, num_hosts={num_hosts})")
  if num_shards < 1:
    raise errors.UsageError(f"num_shards must be positive, got {num_shards}")
  if min_sentences < 1:
    raise errors.UsageError(f"min_sentences must be >= 1, got {min_sentences}")
  if file_format is not None and file_format not in corpus.FILE_FORMATS:
    raise errors.UsageError(f"file_format must be one of {', '.join(corpus.FILE_FORMATS)}, got "
                            f"{file_format!r}")
  check_sentences, file_format = file_format is None, file_format or "sentences"
  if overwrite and num_hosts > 1:
    raise errors.UsageError("overwrite with several hosts would race (one host deleting what "
                            "another writes); empty the output directory first")
  info_path = os.path.join(output_dir, shards.INFO_FILE)
  existing = shards.read_info(output_dir) if os.path.isfile(info_path) else None
  kept = f"the dataset in {publish_to or output_dir} is kept" if existing else None
  file_stats = corpus.CorpusStats()
  manifest: dict[str, list] = {}
  sources = plan(spec, num_shards, file_stats, tfds_data_dir, kept or "nothing was written",
                 manifest, check_sentences)

  # The tokenizer's files go to a scratch directory first: they replace the
  # directory's own only once the dataset is known to be this one.
  with tempfile.TemporaryDirectory() as scratch:
    settings = tokenizer.save(scratch)
    info = {"tokenizer": settings, "tokenizer_sha256": _digest(scratch),
            "num_shards": num_shards, "vocab_size": tokenizer.vocab_size,
            "token_dtype": shards.token_dtype(tokenizer.vocab_size).name, "input": spec,
            "file_format": file_format, "min_sentences": min_sentences,
            "max_line_chars": max_line_chars,
            # What the input files were: a rerun that finds them changed rebuilds
            # (--overwrite) or refuses, never mixing shards of two inputs.
            "input_files": manifest if sources[0]["kind"] == "files" else None}
    build = functools.partial(
        _build_shards, spec, sources=sources, info=info, file_stats=file_stats,
        host_index=host_index, num_hosts=num_hosts, num_workers=num_workers,
        show_progress=show_progress, keep_local=keep_local)
    difference = None if existing is None else differences(existing, info)
    if difference:
      if not overwrite:
        raise DatasetMismatchError(
            f"{publish_to or output_dir} holds a dataset built from {difference}; pass "
            "--overwrite to build it anew from the input as it is now, or choose another "
            "--output_dir", difference)
      logging.warning("%s: rebuilding the dataset, built from %s", publish_to or output_dir,
                      difference)
      return _replace(build, scratch, info, output_dir, publish_to, kept)

    created = existing is None and num_hosts == 1  # this run starts the dataset
    made = not os.path.isdir(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    tokenizer_files = _install(scratch, output_dir)
  shards.write_info(output_dir, info)
  shards.publish_files(output_dir, publish_to, tokenizer_files + [shards.INFO_FILE])
  try:
    return build(output_dir, publish_to, outcome=kept or (
        "nothing was written" if created else "no shard was marked finished"))
  except NoDocumentsError:
    if created:  # leave nothing that would refuse the corrected input
      for directory in (publish_to, output_dir) if publish_to else (output_dir,):
        for name in [shards.INFO_FILE] + tokenizer_files:  # the dataset's mark first
          if files.exists(files.join(directory, name)):
            files.remove(files.join(directory, name))
      if made and not os.listdir(output_dir):
        os.rmdir(output_dir)
    raise


def _install(scratch: str, directory: str) -> list[str]:
  """Copies the files of `scratch` into `directory`, each renamed into place."""
  names = sorted(os.listdir(scratch))
  for name in names:
    staging = files.staging_name(os.path.join(directory, name))
    shutil.copyfile(os.path.join(scratch, name), staging)
    os.replace(staging, os.path.join(directory, name))
  return names


def _replace(build, scratch: str, info: dict[str, Any], output_dir: str,
             publish_to: str | None, kept: str) -> corpus.CorpusStats:
  """Builds a dataset in a staging directory beside `output_dir` and swaps it
  in place of the old one (`_swap_in`) only once it holds a usable document;
  on `gs://` the local copy first, then the bucket."""
  parent = os.path.dirname(os.path.abspath(output_dir))
  staging = tempfile.mkdtemp(prefix=os.path.basename(files.staging_name(output_dir)) + "-",
                             dir=parent)
  try:
    _install(scratch, staging)
    shards.write_info(staging, info)
    stats = build(staging, None, outcome=kept)
    names = [name for name in os.listdir(staging) if not name.startswith(".")]
    _swap_in(output_dir, names, info, lambda name: os.replace(
        os.path.join(staging, name), os.path.join(output_dir, name)))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  if publish_to:
    _swap_in(publish_to, names, info, lambda name: files.upload(
        os.path.join(output_dir, name), files.join(publish_to, name)), local=output_dir)
  return stats


def _swap_in(directory: str, names: list[str], info: dict[str, Any],
             put: Callable[[str], None], local: str | None = None) -> None:
  """Puts a new dataset's files (`names`, `put(name)` writing one) in place of
  the dataset in `directory`, local or on `gs://`.

  No reader ever finds a complete-looking dataset (`dataset_info.json` and
  every shard's stats) that mixes old and new files, and the old one stays
  whole for as long as that allows. The new files the old dataset does not
  use go first (shards before their stats), the new dataset_info.json last,
  replacing the old in one step; the old dataset's other files go after it.
  Only new files that would overwrite the old dataset's (the same shard count,
  or another vocabulary under the same file name) make the old one be
  withdrawn before them: its dataset_info.json, its statically masked
  instances' marks and the stats of the shards overwritten. A rerun then
  finishes the new one (each shard is written before its stats).

  Args:
    local: On `gs://`, the local copy the new files come from (errors name it).

  Raises:
    OSError: a file could not be put, saying what that left of the old dataset.
  """
  present = set(files.listdir(directory)) if files.isdir(directory) else set()
  old_info = None
  if shards.INFO_FILE in present:
    try:
      old_info = files.read_json(files.join(directory, shards.INFO_FILE))
    except ValueError:  # unreadable: no dataset there for a reader to use
      pass
  old_files = set()  # what a reader of the old dataset reads
  if old_info is not None and isinstance(old_info.get("num_shards"), int):
    count = old_info["num_shards"]
    old_files = {name for index in range(count) for name in (
        shards.shard_name(index, count), shards.stats_path(shards.shard_name(index, count)))}
    if old_info.get("tokenizer_sha256") != info["tokenizer_sha256"]:
      old_files |= {name for name in present if not name.startswith(_STALE)}
  # Each shard before its stats, and the tokenizer's files before the shards.
  new = sorted((name for name in names if name != shards.INFO_FILE), key=lambda name: (
      name in old_files, name.startswith("documents-"), name.split(".")[0],
      name.endswith(".stats.json")))
  marks = sorted(name for name in present if name.startswith("instances")
                 and name.endswith("_info.json"))
  withdrawn = False

  def remove(name: str) -> None:
    if name in present:
      files.remove(files.join(directory, name))
      present.discard(name)

  try:
    for name in new:
      if name in old_files and not withdrawn:
        # Readers stop taking the old dataset for whole before its files change.
        withdrawn = True
        for old in [shards.INFO_FILE, *marks, *(n for n in new if n in old_files
                                                 and n.endswith(".stats.json"))]:
          remove(old)
      put(name)
    for name in marks:  # instances masked from the old documents
      remove(name)
    put(shards.INFO_FILE)
  except Exception as error:  # pylint: disable=broad-except
    remote = files.is_remote(directory)
    if withdrawn and remote:
      left = ("the old dataset there was withdrawn first, as the new one reuses its file "
              f"names, and the new one is whole in {local} "
              f"({shards.directory_size(local) / 2**20:.1f} MiB, kept until it is uploaded): "
              "rerun the same command to finish the upload")
    elif withdrawn:
      left = ("the old dataset there was withdrawn first, as the new one reuses its file "
              "names: rerun with --overwrite to build the new one again")
    else:
      left = ("the old dataset there is whole" if old_info is not None else "nothing there "
              "is marked finished") + "; rerun with --overwrite to try again"
    raise errors.StorageError(f"{directory}: {'the upload of ' if remote else 'moving in '}the new "
                              f"dataset failed part-way ({type(error).__name__}: {error}); {left}"
                              ) from error
  stale = [name for name in sorted(present) if name.startswith(_STALE) and name not in names]
  try:
    for name in stale:
      remove(name)
  except Exception as error:  # pylint: disable=broad-except
    logging.warning("%s: the new dataset is in place, but removing the old one's files "
                    "(unused now) failed: %s", directory, error)


def _build_shards(spec: str, directory: str, publish_to: str | None, *,
                  sources: list[dict[str, Any]], info: dict[str, Any],
                  file_stats: corpus.CorpusStats, host_index: int, num_hosts: int,
                  num_workers: int, show_progress: bool, outcome: str,
                  keep_local: bool = False) -> corpus.CorpusStats:
  """Builds this host's unfinished shards into `directory` (holding the
  tokenizer and `info`); returns the counts over all of the host's shards.

  Raises:
    NoDocumentsError: the host's shards hold no usable document; the empty
      shards this run wrote are removed, none is marked finished.
  """
  num_shards = info["num_shards"]
  indices = range(host_index, num_shards, num_hosts)
  path = {i: os.path.join(directory, shards.shard_name(i, num_shards)) for i in indices}
  finished = [i for i in indices if os.path.isfile(shards.stats_path(path[i]))]
  sizes = None
  if publish_to and finished:  # uploaded and removed here (`shards.publish`): check them there
    from bertjax.data import streaming

    sizes = {name: int(entry["size"]) for name, entry in streaming.listing(publish_to).items()}
  for damaged, reason in shards.damaged_shards([path[i] for i in finished], sizes):
    logging.warning("%s is damaged (%s): building it again", files.join(
        publish_to, os.path.basename(damaged)) if publish_to else damaged, reason)
    os.remove(shards.stats_path(damaged))
    finished.remove(next(i for i in finished if path[i] == damaged))
  tasks = [{"shard": i, "num_shards": num_shards, "source": sources[i],
            "output_dir": directory, "publish_to": publish_to, "keep_local": keep_local,
            "tokenizer": info["tokenizer"],
            "token_dtype": info["token_dtype"], "file_format": info["file_format"],
            "min_sentences": info["min_sentences"], "max_line_chars": info["max_line_chars"]}
           for i in indices if i not in finished]
  logging.info("Building %d of this host's %d shards with %d workers", len(tasks),
               len(indices), num_workers)
  work = [_work(task["source"]) for task in tasks]
  with Progress("building", show_progress, None if None in work else sum(work),
                "bytes" if sources[0]["kind"] == "files" else "documents") as bar:
    results = build_pool.run_tasks(tasks, num_workers, bar, directory, build_shard)

  stats = file_stats if host_index == 0 else corpus.CorpusStats()
  for index in finished:
    with open(shards.stats_path(path[index]), encoding="utf-8") as f:
      stats.merge(corpus.CorpusStats.from_dict(json.load(f)))
  for result in results:
    stats.merge(corpus.CorpusStats.from_dict(result))
  empty = [(task, result) for task, result in zip(tasks, results)
           if not result["documents_used"]]
  if stats.documents_used == 0:
    for task, _ in empty:
      os.remove(path[task["shard"]])
    raise NoDocumentsError(spec, stats, outcome,
                           " in this host's shards" if num_hosts > 1 else "")
  for task, result in empty:
    shards.mark_finished(path[task["shard"]], result)
    shards.publish(path[task["shard"]], task.get("publish_to"), task.get("keep_local", False))
  return stats


def tokenizer_sha256(tokenizer) -> str:
  """The `tokenizer_sha256` a dataset built with `tokenizer` records."""
  with tempfile.TemporaryDirectory() as scratch:
    tokenizer.save(scratch)
    return _digest(scratch)


def _digest(directory: str) -> str:
  """SHA-256 over the files of a directory (names and contents)."""
  return shards.tokenizer_digest(directory, os.listdir(directory))
