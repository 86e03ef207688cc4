"""Prepared shards read on `gs://` where they lie: each record a ranged read.

array_record's reader opens local files only, so reading shards on Cloud
Storage through it means copying them whole to each host first. But an
array_record file indexes itself: its last 64 KiB block holds a postscript
that says where the footer begins, and the footer lists where each chunk of
records begins (array_record's `cpp/layout.proto`). bertjax writes one record
a chunk (`group_size:1`, for random access), so a document is one ranged read
of its chunk's bytes.

`StreamedRecords` reads every shard's postscript and footer when it opens them
(one read a shard, two for a footer over 64 KiB; all shards at once) and each
record when asked, through gcsfs, which retries transient errors as for every
other file (docs/storage.md). Reads are pinned to the object generation that
was indexed, so a shard replaced while a run reads it fails with a clear
error rather than read new bytes at old offsets. Nothing is written to disk.

Riegeli's layout as read here (google/riegeli, `doc/riegeli_records_file_format.md`):
- the file is cut into 64 KiB blocks, each beginning with a 24-byte block
  header that belongs to no chunk (it may fall inside one);
- a chunk is a 40-byte header (header hash, data size, data hash: 64-bit;
  chunk type: a byte; record count: 7 bytes; decoded size: 64-bit; all
  little-endian) followed by its data;
- a simple chunk's data (type `r`) is a compression byte (0: none, `z`:
  zstd), the varint length of the compressed record sizes, those sizes, then
  the compressed records back to back; compressed data begins with the varint
  of its decompressed length.

Riegeli's hashes (HighwayHash) are not recomputed here, as array_record's
reader does for a local file; what is checked is every size the layout
records: a chunk's data and decoded sizes, its record count against the
footer's, its record sizes against its decoded data, and zstd's frame. Damage
inside compressed bytes that leaves all of those right can pass; Cloud
Storage and TLS check the bytes at rest and in transit.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import struct
import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from bertjax import errors, files, outage

_BLOCK = 1 << 16
_BLOCK_HEADER = 24
_CHUNK_HEADER = 40
_SIMPLE_CHUNK = ord("r")
_MAGIC = 0x71930E704FDAE05E  # a RiegeliPostscript's magic
_ARRAY_RECORD_V1 = 1
_OPEN_THREADS = 32  # shards whose footers are read at once
# A shard's first read: its footer's last bytes (all of a footer of up to
# ~8,000 records) and the start of its postscript (the writer's takes ~110).
_FOOTER_GUESS = 64 << 10
_POSTSCRIPT_READ = 1 << 10


def filesystem():
  """gcsfs, as etils' gs:// paths use it (one instance a process)."""
  import fsspec

  return fsspec.filesystem("gs")


_fetched_lock = threading.Lock()
_fetched = {"requests": 0, "bytes": 0}


def fetched() -> dict[str, int]:
  """Ranged reads made by this process so far, and the bytes they returned."""
  with _fetched_lock:
    return dict(_fetched)


def _fetch(url: str, start: int, end: int, generation: str | None) -> bytes:
  """Bytes [start, end) of the object `url`, of this generation if given.

  Storage that does not answer once gcsfs has given up is waited for
  (`bertjax.outage`), by one reader thread while the others wait for it."""
  kwargs = {"generation": generation} if generation else {}
  failed_since = None
  while True:
    try:
      data = filesystem().cat_file(url, start=start, end=end, **kwargs)
      break
    except FileNotFoundError:
      if generation is None:
        raise
      raise errors.CorruptFileError(
          f"{url} was replaced while this run read it (generation {generation} is gone); "
          "restart the run to read the data as it is now") from None
    except Exception as e:  # pylint: disable=broad-except
      if errors.storage_unreachable(e) is None:
        raise
      failed_since = failed_since or time.monotonic()
      _wait_for_storage(url, e, failed_since)
  with _fetched_lock:
    _fetched["requests"] += 1
    _fetched["bytes"] += len(data)
  if len(data) != end - start:
    raise errors.CorruptFileError(f"{url}: {len(data)} bytes at {start}, {end - start} expected "
                                  "(the file is shorter than its index says)")
  return data


_outage_lock = threading.Lock()
_answered_at = [float("-inf")]  # when the storage last answered after an outage


def _wait_for_storage(url: str, failure: BaseException, failed_since: float) -> None:
  """Waits until the storage answers (`bertjax.outage`): one thread waits and
  says so; a thread that failed before it answered again just reads again."""
  with _outage_lock:
    if _answered_at[0] >= failed_since:
      return
    outage.wait_until_reachable(url, lambda: filesystem().info(url), failure,
                                "from the workdir's newest checkpoint", failed_since)
    _answered_at[0] = time.monotonic()


class FormatError(ValueError):
  """Bytes that are not the array_record layout described above."""


def _varint(data: bytes, position: int) -> tuple[int, int]:
  """(value, position after it) of the varint at `position`."""
  value = shift = 0
  while True:
    if position >= len(data) or shift > 63:
      raise FormatError("a varint runs past its data")
    byte = data[position]
    value |= (byte & 0x7F) << shift
    position += 1
    if byte < 0x80:
      return value, position
    shift += 7


def _varints(data: bytes) -> np.ndarray:
  """All varints of `data`, back to back, as uint64 (vectorised)."""
  array = np.frombuffer(data, np.uint8)
  ends = np.flatnonzero(array < 0x80)
  if not len(ends) or ends[-1] != len(array) - 1:
    raise FormatError("varints cut short")
  starts = np.concatenate([[0], ends[:-1] + 1])
  lengths = ends - starts + 1
  if lengths.max() > 10:
    raise FormatError("a varint longer than 10 bytes")
  within = np.arange(len(array)) - np.repeat(starts, lengths)
  values = (array & 0x7F).astype(np.uint64) << (7 * within).astype(np.uint64)
  return np.add.reduceat(values, starts)


def _fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
  """(field number, value) of a protocol buffer message's varint and
  length-delimited fields."""
  position = 0
  while position < len(message):
    key, position = _varint(message, position)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, position = _varint(message, position)
    elif wire == 2:
      length, position = _varint(message, position)
      value, position = message[position:position + length], position + length
    elif wire == 1:
      value, position = int.from_bytes(message[position:position + 8], "little"), position + 8
    elif wire == 5:
      value, position = int.from_bytes(message[position:position + 4], "little"), position + 4
    else:
      raise FormatError(f"protocol buffer wire type {wire}")
    if position > len(message):
      raise FormatError("a protocol buffer field runs past its message")
    yield number, value


def _without_block_headers(raw: bytes, start: int) -> bytes:
  """The bytes of file range [start, start + len(raw)) less its block headers."""
  pieces, position = [], start
  boundary = -(-start // _BLOCK) * _BLOCK
  end = start + len(raw)
  while boundary < end:
    pieces.append(raw[position - start:boundary - start])
    position = min(boundary + _BLOCK_HEADER, end)
    boundary += _BLOCK
  pieces.append(raw[position - start:])
  return b"".join(pieces)


_local = threading.local()


def _decompress(compression: int, data: bytes) -> bytes:
  if compression == 0:
    return data
  size, position = _varint(data, 0)
  if compression != ord("z"):
    raise FormatError(f"compression {chr(compression)!r} (bertjax writes zstd)")
  decompressor = getattr(_local, "zstd", None)
  if decompressor is None:
    import zstandard

    decompressor = _local.zstd = zstandard.ZstdDecompressor()
  try:
    out = decompressor.decompress(data[position:], max_output_size=size)
  except Exception as e:  # zstandard.ZstdError: damaged bytes
    raise FormatError(f"zstd: {e}") from None
  if len(out) != size:
    raise FormatError(f"{len(out)} bytes decompressed, {size} recorded")
  return out


def chunk_records(raw: bytes, start: int) -> list[bytes]:
  """The records of the chunk whose file bytes from `start` are `raw` (block
  headers included, anything after the chunk ignored)."""
  data = _without_block_headers(raw, start)
  if len(data) < _CHUNK_HEADER:
    raise FormatError("a chunk shorter than its header")
  data_size = struct.unpack_from("<Q", data, 8)[0]
  chunk_type = data[24]
  num_records = int.from_bytes(data[25:32], "little")
  decoded_size = struct.unpack_from("<Q", data, 32)[0]
  if chunk_type != _SIMPLE_CHUNK:
    raise FormatError(f"chunk type {chr(chunk_type)!r}, not simple records ('r')")
  body = data[_CHUNK_HEADER:_CHUNK_HEADER + data_size]
  if len(body) != data_size or not body:
    raise FormatError(f"a chunk of {len(body)} bytes, {data_size} recorded")
  compression = body[0]
  sizes_length, position = _varint(body, 1)
  sizes = _varints(_decompress(compression, body[position:position + sizes_length])) \
      if num_records else np.zeros(0, np.uint64)
  values = _decompress(compression, body[position + sizes_length:])
  if len(sizes) != num_records or len(values) != decoded_size or int(sizes.sum()) != len(values):
    raise FormatError(f"{num_records} records of {decoded_size} bytes recorded; "
                      f"{len(sizes)} sizes adding up to {int(sizes.sum())}, {len(values)} bytes")
  ends = np.cumsum(sizes).tolist()
  return [values[a:b] for a, b in zip([0] + ends[:-1], ends)]


@dataclasses.dataclass(frozen=True)
class ShardIndex:
  """Where a shard's records lie.

  Attributes:
    url: The shard.
    size: Its size in bytes, and `generation` the object generation indexed.
    chunk_begins: int64 [chunks + 1]: each chunk's first byte, then the footer's.
    record_starts: int64 [chunks + 1]: each chunk's first record, then the count.
  """

  url: str
  size: int
  generation: str | None
  chunk_begins: np.ndarray
  record_starts: np.ndarray

  @property
  def num_records(self) -> int:
    return int(self.record_starts[-1])

  def read(self, record: int) -> bytes:
    """Record `record` of the shard, by one ranged read."""
    chunk = int(np.searchsorted(self.record_starts, record, "right")) - 1
    begin, end = int(self.chunk_begins[chunk]), int(self.chunk_begins[chunk + 1])
    records = chunk_records(_fetch(self.url, begin, end, self.generation), begin)
    expected = int(self.record_starts[chunk + 1] - self.record_starts[chunk])
    if len(records) != expected:
      raise FormatError(f"chunk {chunk} holds {len(records)} records, its footer says {expected}")
    return records[record - int(self.record_starts[chunk])]


def read_index(url: str, size: int, generation: str | None) -> ShardIndex:
  """A shard's index from its postscript and footer: one ranged read of the
  footer's last `_FOOTER_GUESS` bytes and the postscript's first, a second
  for the rest of a longer footer.

  Raises:
    FormatError: the bytes are not an array_record file's.
  """
  postscript_at = size - _BLOCK  # the postscript fills the last block
  if postscript_at < 0:
    raise FormatError(f"{size} bytes, less than an array_record file's last block")
  start, end = max(0, postscript_at - _FOOTER_GUESS), postscript_at + _POSTSCRIPT_READ
  tail = _fetch(url, start, end, generation)
  postscript = tail[postscript_at - start:]
  needed = _BLOCK_HEADER + _CHUNK_HEADER + struct.unpack_from("<Q", postscript, 32)[0]
  if needed > len(postscript):  # a postscript longer than the writer makes
    postscript += _fetch(url, end, size, generation)
  records = chunk_records(postscript, postscript_at)
  fields = dict(_fields(records[0])) if records else {}
  footer_offset = fields.get(1)
  if fields.get(2) != _MAGIC or not isinstance(footer_offset, int) \
      or not 0 < footer_offset < postscript_at:
    raise FormatError("no array_record postscript in the last block")
  if footer_offset < start:
    tail = _fetch(url, footer_offset, start, generation) + tail
    start = footer_offset
  footer = chunk_records(tail[footer_offset - start:postscript_at - start], footer_offset)
  metadata = dict(_fields(footer[0])) if footer else {}
  array_record = dict(_fields(metadata[1])) if isinstance(metadata.get(1), bytes) else {}
  if array_record.get(1) != _ARRAY_RECORD_V1:
    raise FormatError(f"footer metadata {array_record} is not array_record version 1's")
  num_chunks = array_record.get(2, 0)
  if len(footer) != num_chunks + 1:
    raise FormatError(f"{len(footer) - 1} chunk entries in the footer, {num_chunks} recorded")
  begins, counts = _chunk_entries(footer[1:])
  if num_chunks and (np.any(np.diff(begins) <= 0) or begins[-1] >= footer_offset):
    raise FormatError("chunk offsets out of order")
  if int(counts.sum()) != array_record.get(3, 0):
    raise FormatError(f"{int(counts.sum())} records in the chunks, {array_record.get(3)} "
                      "recorded")
  return ShardIndex(url, size, generation,
                    np.append(begins, footer_offset).astype(np.int64),
                    np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))


def _chunk_entries(entries: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
  """(chunk offsets, record counts) of ArrayRecordFooter messages
  (chunk_offset = 1, decoded_data_size = 2, num_records = 3)."""
  if not entries:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)
  values = _varints(b"".join(entries))
  if len(values) == 6 * len(entries) and np.all(
      values.reshape(-1, 6)[:, ::2] == np.array([8, 16, 24], np.uint64)):  # the writer's order
    return values[1::6].astype(np.int64), values[5::6].astype(np.int64)
  begins, counts = [], []
  for entry in entries:  # any other field order, or a field left out
    fields = dict(_fields(entry))
    begins.append(fields.get(1, 0))
    counts.append(fields.get(3, 0))
  return np.array(begins, np.int64), np.array(counts, np.int64)


_indexes: dict[tuple[str, int, str | None], ShardIndex] = {}
_indexes_lock = threading.Lock()


def listing(directory: str) -> dict[str, dict[str, Any]]:
  """name -> gcsfs' details (`size`, `generation`, ...) of a directory's objects."""
  entries = filesystem().ls(directory, detail=True)
  return {entry["name"].rstrip("/").rsplit("/", 1)[-1]: entry for entry in entries
          if entry.get("type") == "file"}


class StreamedRecords:
  """Random access to the records of shards on `gs://`, as `shards.Records`
  gives it to local ones: a record is one ranged read.

  Picklable (grain's worker processes): the indexes travel, each process
  makes its own connections.
  """

  def __init__(self, directory: str, paths: Sequence[str]):
    from bertjax.data import shards

    self.directory, self.paths = directory, list(paths)
    found = listing(directory)
    missing = [p for p in self.paths if os.path.basename(p) not in found]
    if missing:
      raise errors.MissingFileError(f"{missing[0]} not found")

    def index(path: str) -> ShardIndex:
      entry = found[os.path.basename(path)]
      key = (path, int(entry["size"]), entry.get("generation"))
      with _indexes_lock:
        if key in _indexes:
          return _indexes[key]
      try:
        made = read_index(path, *key[1:])
      except FormatError as e:
        raise errors.CorruptFileError(f"{path} is damaged: it cannot be opened ({e}); "
                                      f"{shards.rebuild_advice(directory, path)}") from None
      with _indexes_lock:
        return _indexes.setdefault(key, made)

    with concurrent.futures.ThreadPoolExecutor(min(_OPEN_THREADS, len(self.paths) or 1)) as pool:
      self.indexes = list(pool.map(index, self.paths))
    self._starts = np.cumsum([0] + [i.num_records for i in self.indexes])

  def __len__(self) -> int:
    return int(self._starts[-1])

  def __getitem__(self, index: int) -> bytes:
    from bertjax.data import shards

    shard, local = self._place(index)
    try:
      return self.indexes[shard].read(local)
    except FormatError as e:
      path = self.paths[shard]
      raise errors.CorruptFileError(
          f"{path} is damaged: its record {local} cannot be read ({e}); "
          f"{shards.rebuild_advice(self.directory, path)}") from None

  def _place(self, index: int) -> tuple[int, int]:
    if not 0 <= index < len(self):
      raise IndexError(f"record {index} of {len(self)}")
    shard = int(np.searchsorted(self._starts, index, "right")) - 1
    return shard, index - int(self._starts[shard])

  def locate(self, index: int) -> tuple[str, int]:
    """(shard path, index within it) of a record index."""
    shard, local = self._place(index)
    return self.paths[shard], local
