"""Prepared pre-training data on disk: `array_record` shards of tokenised documents.

A prepared directory holds
- `dataset_info.json`: format version, the tokenizer's settings, the shard
  count, the token dtype and the builder's settings;
- the tokenizer's files (`vocab.txt` or `spiece.model`);
- `documents-SSSSS-of-NNNNN.array_record`: one record per document;
- `documents-SSSSS-of-NNNNN.stats.json` beside each finished shard: its
  `CorpusStats` (its presence marks the shard complete).

With static masking (`--static_dupe_factor`), `instances<L>-*.array_record`
shards hold masked examples of length L (`static_kind`), described by
`instances<L>_info.json`: one directory holds those of both phases (128, 512).

A document record is little-endian bytes: one byte giving the id width (2 or
4), three zero bytes, uint32 sentence count `n`, `n` uint32 sentence lengths,
then the token ids. Documents are stored untruncated and unmasked, so one
prepared directory serves every sequence length and objective.

A directory on `gs://` is read in place (`open_records`: each record a ranged
read, `bertjax.data.streaming`), or from a host's copy (`reading_directory`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shlex
import struct
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from absl import logging
import numpy as np

from bertjax import errors, files
from bertjax.data.corpus import CorpusStats

if TYPE_CHECKING:
  from bertjax.data.streaming import StreamedRecords

INFO_FILE = "dataset_info.json"
# Statically masked instances from before the length was part of their name.
OLD_STATIC_INFO_FILE = "instances_info.json"
FORMAT = "bertjax-documents"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<B3xI")


def shard_name(index: int, count: int, kind: str = "documents") -> str:
  return f"{kind}-{index:05d}-of-{count:05d}.array_record"


def static_kind(max_seq_length: int) -> str:
  """The shard kind of the statically masked instances of one length."""
  return f"instances{max_seq_length}"


def static_info_file(max_seq_length: int) -> str:
  """The settings file of the statically masked instances of one length."""
  return f"{static_kind(max_seq_length)}_info.json"


def stats_path(shard_path: str) -> str:
  """The `.stats.json` beside a shard, whose presence marks it finished."""
  return shard_path[:-len(".array_record")] + ".stats.json"


@contextlib.contextmanager
def shard_writer(path: str) -> Iterator[Any]:
  """An `ArrayRecordWriter` on a temporary name, renamed to `path` on success.

  On an error the partial file is removed; the shard is not marked finished
  until `mark_finished` writes its stats.
  """
  from array_record.python.array_record_module import ArrayRecordWriter

  staging = files.staging_name(path)
  writer = ArrayRecordWriter(staging, "group_size:1")  # records are read at random
  try:
    yield writer
    writer.close()
    os.replace(staging, path)
  except BaseException:
    try:
      writer.close()
    except Exception:  # the original error matters more than a failed close
      pass
    if os.path.exists(staging):
      os.remove(staging)
    raise


# The key of a shard's stats that holds its size in bytes when finished: a
# shard of another size is damaged (cut short, or overwritten).
SHARD_BYTES = "shard_bytes"


def mark_finished(shard_path: str, stats: dict[str, Any]) -> None:
  """Writes a shard's stats, with its size (atomically): the shard is complete."""
  files.write_json(stats_path(shard_path),
                   {**stats, SHARD_BYTES: os.path.getsize(shard_path)})


def publish(shard_path: str, remote: str | None, keep: bool = False) -> None:
  """Uploads a finished shard to the remote output directory (when there is
  one) and checks the upload's size and checksum, then its stats (the mark of a
  finished shard), then removes the local shard (unless `keep`: static
  instances are built from it next): a build for `gs://` holds no more of the
  dataset on this host's disk than the shards being written.

  Raises:
    StorageError: the uploaded shard is not the local one (its size or
      checksum): the local shard is kept, nothing marks it finished there, and
      a rerun uploads it again.
  """
  if not remote:
    return
  target = files.join(remote, os.path.basename(shard_path))
  files.upload(shard_path, target)
  local, uploaded = os.path.getsize(shard_path), files.size(target)
  if uploaded != local:
    raise errors.StorageError(f"{target}: {uploaded} bytes arrived of the {local} of "
                              f"{shard_path}; rerun the same command to upload it again")
  if not _same_checksum(shard_path, target):
    raise errors.StorageError(f"{target}: its checksum is not that of {shard_path} (kept "
                              "here); rerun the same command to upload it again")
  stats = stats_path(shard_path)
  files.upload(stats, files.join(remote, os.path.basename(stats)))
  if not keep:
    os.remove(shard_path)
  elif (mtime := files.modified(target)) is not None:  # the copy `local_directory` keeps
    os.utime(shard_path, (mtime, mtime))


def _same_checksum(local: str, remote: str) -> bool:
  """Whether the object `remote` holds the bytes of the file `local`, by the
  checksum the bucket gives (MD5, or CRC32C where it gives none: a composed
  object); True where it gives neither."""
  from bertjax.data import streaming

  fs = streaming.filesystem()
  fs.invalidate_cache(remote)
  entry = fs.info(remote)
  if entry.get("md5Hash"):
    digest, expected = hashlib.md5(), entry["md5Hash"]
  elif entry.get("crc32c"):
    import google_crc32c

    digest, expected = google_crc32c.Checksum(), entry["crc32c"]
  else:
    return True
  with open(local, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return base64.b64encode(digest.digest()).decode() == expected


def shard_host(name: str, kind: str, num_hosts: int) -> int | None:
  """The host that builds the shard (or its stats) `name` of `kind`, by the
  builder's rule (shard index modulo host count); None for another file."""
  match = re.fullmatch(rf"{re.escape(kind)}-(\d+)-of-\d+\.(array_record|stats\.json)", name)
  return int(match.group(1)) % num_hosts if match else None


def remove_this_hosts_copy(local: str, remote: str, kind: str, num_hosts: int,
                           host_index: int) -> None:
  """Removes this host's local copy of a build of `kind` shards now on the
  `gs://` directory `remote` (`remove_local_copy`, by the builder's rule of
  which host builds which shard); says what is kept, and why, if anything."""
  def host(name: str) -> int | None:
    return shard_host(name, kind, num_hosts)

  left = remove_local_copy(local, remote, others=lambda name: host(name) not in (None, host_index),
                           own=lambda name: host(name) == host_index)
  if left:
    logging.warning("%s, this host's copy of %s, is kept (%.1f MiB): %s", local, remote,
                    directory_size(local) / 2**20, left)


def remove_local_copy(local: str, remote: str,
                      others: Callable[[str], bool] = lambda name: False,
                      own: Callable[[str], bool] = lambda name: False) -> str:
  """Removes a build's local copy of the `gs://` directory `remote` once the
  files it removes are there at the same size; returns '' then, or else (the
  copy kept) what differs.

  Several hosts may share the cache (an NFS home): `others(name)` is a file of
  another host's build, which is left. While one is there, or a staging file,
  only this host's own shards (`own`) go: the settings and documents the others
  may still read stay; the directory goes once empty.
  """
  from bertjax.data import streaming

  names = sorted(name for name in os.listdir(local)
                 if os.path.isfile(os.path.join(local, name)))
  busy = any(".tmp" in name or others(name) for name in names)
  gone = [name for name in names if ".tmp" not in name and not others(name)
          and (own(name) or not busy)]
  uploaded = {name: int(entry["size"]) for name, entry in streaming.listing(remote).items()}
  differ = [name for name in gone if uploaded.get(name) != os.path.getsize(
      os.path.join(local, name))]
  if differ:
    return (f"{len(differ)} of its files ({', '.join(differ[:3])}) are not on {remote} at their "
            "size")
  for name in gone:
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(local, name))
  with contextlib.suppress(OSError):  # another host's files are left in it
    os.rmdir(local)
  return ""


def directory_size(directory: str) -> int:
  """The bytes of the files under a local directory."""
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(directory) for name in names)


def publish_files(local_dir: str, remote: str | None, names: list[str]) -> None:
  """Uploads the named files of `local_dir` to `remote` (when there is one)."""
  for name in names if remote else ():
    files.upload(os.path.join(local_dir, name), files.join(remote, name))


def rebuild_advice(directory: str, shard: str | None = None) -> str:
  """How to make a damaged shard (or, with `shard` None, the tokenizer files)
  of a prepared directory again, from what its `dataset_info.json` says."""
  url = files.cached_url(directory)
  if url is not None and shard is not None:  # this host's copy of a gs:// dataset
    return (f"it is this host's copy of {files.join(url, os.path.basename(shard))}: delete it "
            f"({shard}) and rerun, which copies it again (if the original is damaged too, "
            f"rebuild it with prepare_pretraining_data --output_dir={url})")
  try:
    info = read_info(directory)
  except (OSError, ValueError):
    info = {}
  where = url or directory
  command = ("python -m bertjax.tools.prepare_pretraining_data "
             f"--input={shlex.quote(str(info.get('input')))} --output_dir={shlex.quote(where)} "
             "... (the flags that built it)")
  if shard is None:
    return f"rebuild the dataset ({command} --overwrite)"
  return (f"delete {stats_path(shard)} and rerun {command}, or the pre-training run that "
          "built it (data.build_from): either builds that shard again")


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_document(sentences: Sequence[Sequence[int]], dtype: np.dtype) -> bytes:
  """Packs a document (token ids per sentence) into a record."""
  lengths = np.fromiter((len(s) for s in sentences), np.uint32, len(sentences))
  ids = np.fromiter((t for s in sentences for t in s), dtype, int(lengths.sum()))
  return (_HEADER.pack(dtype.itemsize, len(sentences)) + lengths.astype("<u4").tobytes()
          + ids.astype(dtype.newbyteorder("<")).tobytes())


def decode_document(record: bytes) -> tuple[np.ndarray, np.ndarray]:
  """(token ids [tokens] int32, sentence offsets [sentences + 1]) of a record."""
  width, count = _HEADER.unpack_from(record)
  lengths = np.frombuffer(record, "<u4", count, _HEADER.size)
  ids = np.frombuffer(record, "<u2" if width == 2 else "<u4",
                      offset=_HEADER.size + 4 * count).astype(np.int32)
  offsets = np.zeros(count + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  if offsets[-1] != len(ids):
    raise errors.CorruptFileError(f"corrupt document record: {offsets[-1]} tokens announced, "
                                  f"{len(ids)} present")
  return ids, offsets


def encode_instance(row: dict[str, np.ndarray]) -> bytes:
  """Packs one masked example (a batch row of the loader) into a record.

  int32 little-endian: tokens, first-segment length, next-sentence label,
  predictions, then the (masked) token ids, masked positions and original ids.
  """
  length = int(row["attention_mask"].sum())
  first = int(np.argmax(row["token_type_ids"][:length])) if row["token_type_ids"].any() \
      else length
  predictions = int(row["masked_weights"].sum())
  label = int(row.get("next_sentence_labels", -1))
  return np.concatenate([
      np.array([length, first, label, predictions], np.int32), row["input_ids"][:length],
      row["masked_positions"][:predictions], row["masked_ids"][:predictions]],
  ).astype("<i4").tobytes()


def decode_instance(record: bytes) -> tuple[np.ndarray, int, int, np.ndarray, np.ndarray]:
  """(token ids, first-segment length, label, masked positions, original ids)."""
  values = np.frombuffer(record, "<i4")
  length, first, label, predictions = (int(v) for v in values[:4])
  ids = values[4:4 + length]
  positions = values[4 + length:4 + length + predictions]
  originals = values[4 + length + predictions:4 + length + 2 * predictions]
  return ids, first, label, positions, originals


def write_info(directory: str, info: dict[str, Any], name: str = INFO_FILE) -> None:
  """Writes `dataset_info.json` (or another info file) atomically."""
  path = os.path.join(directory, name)
  staging = files.staging_name(path)
  with open(staging, "w", encoding="utf-8") as f:
    json.dump({"format": FORMAT, "format_version": FORMAT_VERSION, **info}, f, indent=2)
  os.replace(staging, path)


def read_info(directory: str) -> dict[str, Any]:
  """The `dataset_info.json` of a prepared directory, checked."""
  path = os.path.join(directory, INFO_FILE)
  if not files.exists(path):
    raise errors.MissingFileError(
        f"{directory}: no {INFO_FILE}; not a prepared pre-training "
        "directory (make one with bertjax.tools.prepare_pretraining_data)")
  info = files.read_json(path)
  if info.get("format") != FORMAT or info.get("format_version") != FORMAT_VERSION:
    raise errors.UsageError(f"{path}: format {info.get('format')!r} version "
                            f"{info.get('format_version')!r} is not {FORMAT!r} version "
                            f"{FORMAT_VERSION}")
  return info


def complete_shards(directory: str, kind: str = "documents") -> list[str]:
  """Paths of the finished shards of a prepared directory, in order.

  Raises:
    ValueError: some shards are missing or unfinished.
  """
  info = read_info(directory)
  if kind != "documents":  # static instances: `static_kind`
    path = os.path.join(directory, f"{kind}_info.json")
    if not files.exists(path):
      older = (" (its instances_info.json is from an older bertjax: rebuild)"
               if files.exists(os.path.join(directory, OLD_STATIC_INFO_FILE)) else "")
      raise errors.MissingFileError(
          f"{directory}: no statically masked instances of length {kind[len('instances'):]} "
          f"({kind}_info.json){older}; build them with prepare_pretraining_data "
          "--static_dupe_factor, or let the run build them (data.static)")
    info = files.read_json(path)
  count = info["num_shards"]
  paths = [os.path.join(directory, shard_name(i, count, kind)) for i in range(count)]
  if files.is_remote(directory):  # one listing, not a request a shard
    present = set(files.listdir(directory))
    missing = [os.path.basename(p) for p in paths
               if os.path.basename(stats_path(p)) not in present]
  else:
    missing = [os.path.basename(p) for p in paths if not files.exists(stats_path(p))]
  if missing:
    raise errors.UsageError(f"{directory}: {len(missing)} of {count} shards are missing or "
                            f"unfinished (e.g. {missing[0]}); rerun the builder to finish them")
  if not files.is_remote(directory):
    damaged = damaged_shards(paths)
    if damaged:
      path, reason = damaged[0]
      raise errors.CorruptFileError(
          f"{path} is damaged ({reason})" + (f", and {len(damaged) - 1} more shards"
                                             if len(damaged) > 1 else "")
          + f"; {rebuild_advice(directory, path)}")
  return paths


def damaged_shards(paths: Sequence[str], sizes: dict[str, int] | None = None
                   ) -> list[tuple[str, str]]:
  """(path, why) of the finished local shards whose size is not the one their
  stats recorded (shards finished before sizes were recorded pass).

  Args:
    sizes: The shards' sizes by name where they are not local (a build's
      shards on `gs://`, uploaded and removed here), from a listing.
  """
  damaged = []
  for path in paths:
    try:
      with open(stats_path(path), encoding="utf-8") as f:
        recorded = json.load(f).get(SHARD_BYTES)
    except (OSError, ValueError) as e:
      damaged.append((path, f"its {os.path.basename(stats_path(path))} cannot be read: {e}"))
      continue
    if recorded is None:
      continue
    try:
      size = os.path.getsize(path) if sizes is None else sizes[os.path.basename(path)]
    except (OSError, KeyError):
      damaged.append((path, "it is missing"))
      continue
    if size != recorded:
      damaged.append((path, f"{size} bytes, {recorded} when it was built"))
  return damaged


def check_tokenizer(directory: str, info: dict[str, Any] | None = None) -> None:
  """The tokenizer files of a prepared directory must be those it was built
  with (`tokenizer_sha256`): token ids mean nothing under another vocabulary.

  Raises:
    CorruptFileError: naming the file and what rebuilds the dataset.
  """
  info = info if info is not None else read_info(directory)
  settings, recorded = info.get("tokenizer") or {}, info.get("tokenizer_sha256")
  names = [settings[key] for key in ("vocab_file", "model_file") if key in settings]
  if not recorded or not names:
    return
  digest = tokenizer_digest(directory, names)
  if digest != recorded:
    raise errors.CorruptFileError(
        f"{files.join(directory, names[0])} is not the vocabulary the data in {directory} was "
        "built with (it was edited or replaced since); put the original back, or "
        f"{rebuild_advice(directory)}")


def tokenizer_digest(directory: str, names: Sequence[str]) -> str:
  """SHA-256 over tokenizer files (names and contents), as `dataset_info.json`
  records it (`tokenizer_sha256`)."""
  digest = hashlib.sha256()
  for name in sorted(names):
    digest.update(name.encode())
    digest.update(files.read_bytes(files.join(directory, name)))
  return digest.hexdigest()


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0][:200] if text else type(error).__name__


class Records:
  """Random access to the records of finished shards (grain's
  `ArrayRecordDataSource`), with a damaged record named: its shard, its index
  there, and what builds the shard again, rather than array_record's
  `RuntimeError` (a chunk hash mismatch, a file cut short)."""

  def __init__(self, directory: str, paths: Sequence[str]):
    import grain

    self.directory, self.paths = directory, list(paths)
    try:
      self._source = grain.sources.ArrayRecordDataSource(self.paths)
    except RuntimeError:  # a damaged footer: which file, and why
      for path in self.paths:
        try:
          grain.sources.ArrayRecordDataSource([path])
        except RuntimeError as e:
          raise errors.CorruptFileError(
              f"{path} is damaged: it cannot be opened ({_first_line(e)}); "
              f"{rebuild_advice(directory, path)}") from None
      raise

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> bytes:
    try:
      return self._source[index]
    except RuntimeError as e:
      path, local = self.locate(index)
      raise errors.CorruptFileError(
          f"{path} is damaged: its record {local} cannot be read ({_first_line(e)}); "
          f"{rebuild_advice(self.directory, path)}") from None

  def locate(self, index: int) -> tuple[str, int]:
    """(shard path, index within it) of a record index."""
    import grain

    for path in self.paths:
      count = len(grain.sources.ArrayRecordDataSource([path]))
      if index < count:
        return path, index
      index -= count
    return self.paths[-1], index


def open_records(directory: str, paths: Sequence[str]) -> Records | StreamedRecords:
  """Random access to the records of finished shards: `Records` for local
  ones, `bertjax.data.streaming.StreamedRecords` (ranged reads) on `gs://`."""
  if files.is_remote(directory):
    from bertjax.data import streaming

    return streaming.StreamedRecords(directory, paths)
  return Records(directory, paths)


# How a run reads a prepared directory on gs:// (`data.read_mode`).
READ_MODES = ("auto", "stream", "copy")


def reading_directory(directory: str, mode: str = "auto") -> str:
  """Where a run reads a prepared directory from: a local one in place; one on
  `gs://` streamed (`directory` itself: each record a ranged read, nothing
  copied), or from this host's copy (`local_directory`).

  Args:
    mode: "stream", "copy" (copy the shards into the cache first), or "auto":
      the copy when this host holds a complete one already (an earlier run's
      "copy"), else stream.
  """
  if mode not in READ_MODES:
    raise errors.UsageError(f"data.read_mode must be one of {', '.join(READ_MODES)}, got "
                            f"{mode!r}")
  if not files.is_remote(directory):
    return directory
  if mode == "copy" or (mode == "auto" and has_complete_copy(directory)):
    return local_directory(directory)
  return directory


def has_complete_copy(directory: str) -> bool:
  """Whether this host's cache holds every file of the `gs://` directory at
  its size and modification time (what `local_directory` would leave)."""
  local = files.cache_path(directory)
  if not os.path.isdir(local):
    return False
  from bertjax.data import streaming

  for name, entry in streaming.listing(directory).items():
    if ".tmp" in name:
      continue
    path = os.path.join(local, name)
    mtime = entry.get("mtime")
    if not (os.path.isfile(path) and os.path.getsize(path) == int(entry["size"])
            and (mtime is None or int(os.path.getmtime(path)) == int(mtime.timestamp()))):
      return False
  return True


def local_directory(directory: str, names: Callable[[str], bool] | None = None) -> str:
  """A local copy of a prepared directory on `gs://` (`directory` itself when local).

  array_record's reader opens local files only: with `data.read_mode="copy"`
  (and for the builder's own work) each host copies the finished shards into
  its cache (`bertjax.files.cache_path`) once; a file already there with the
  same size is kept. A shard's stats file that the remote directory lacks (a
  build whose upload did not finish) is dropped, so the copy never claims more
  than the original.

  Args:
    names: Which files to copy (default: all but temporary ones).
  """
  if not files.is_remote(directory):
    return directory
  local = files.cache_path(directory)
  if os.path.isdir(local):
    remote_names = set(files.listdir(directory)) if files.isdir(directory) else set()
    for name in os.listdir(local):
      if name.endswith(".stats.json") and name not in remote_names:
        os.remove(os.path.join(local, name))
  if not files.isdir(directory):
    os.makedirs(local, exist_ok=True)
    return local
  wanted = names or (lambda name: True)
  return files.local_copy(directory, lambda name: ".tmp" not in name and wanted(name))


def read_stats(directory: str, kind: str = "documents", limit: int | None = None
               ) -> CorpusStats:
  """The builder's counts over the finished shards (local or remote), or over
  the first `limit` of them (a sample)."""
  total = CorpusStats()
  names = sorted(name for name in files.listdir(directory)
                 if name.startswith(f"{kind}-") and name.endswith(".stats.json"))
  for name in names[:limit]:
    total.merge(CorpusStats.from_dict(files.read_json(files.join(directory, name))))
  return total
