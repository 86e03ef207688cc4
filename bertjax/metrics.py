"""Metrics out of a training run: console lines, a JSONL file, TensorBoard events.

TensorBoard event files are written here directly (TFRecord framing of `Event`
protocol buffers with scalar summaries), so neither TensorFlow nor TensorBoard
is needed to write them. Only process 0 writes.
"""

from __future__ import annotations

import copy
import errno
import itertools
import json
import logging as pylogging
import os
import socket
import struct
import threading
import time
from typing import Any, Mapping

from absl import logging

from bertjax import errors, files

_CRC_TABLE = []
for _n in range(256):
  _c = _n
  for _ in range(8):
    _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1  # CRC-32C (Castagnoli)
  _CRC_TABLE.append(_c)


def _crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  crc = _crc32c(data)
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    bits, value = value & 0x7F, value >> 7
    out.append(bits | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  key = _varint(number << 3 | wire_type)
  if wire_type == 2:  # length-delimited
    return key + _varint(len(payload)) + payload
  return key + payload


def _event(wall_time: float, step: int, scalars: Mapping[str, float] | None = None,
           file_version: str | None = None) -> bytes:
  """An `Event` proto: wall_time (1, double), step (2, int64), file_version (3)
  or summary (5) of `Value`s with tag (1) and simple_value (2, float)."""
  message = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
  if file_version is not None:
    message += _field(3, 2, file_version.encode())
  if scalars:
    values = b"".join(
        _field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
        for tag, value in scalars.items())
    message += _field(5, 2, values)
  return message


_WRITER_NUMBERS = itertools.count()


class AppendFile:
  """A file that only grows: appended across processes, runs and resumes.

  Locally each `append` is written and flushed at once. On `gs://`, where an
  object cannot be appended to, appends are buffered and a background thread
  uploads each batch as a small object and composes it onto the end of the
  file (a server-side concatenation: the file is never uploaded again).
  Batches go every `flush_every_s` seconds, on `flush()` and on `close()`.

  A storage error never reaches the caller: it is logged, the batch is kept
  and tried again (the next flush), with the number of bytes still waiting.

  A file of records that end in `record_end` (JSONL's newline) is cut back to
  its last whole record when it is opened: a run killed while writing a line
  leaves part of it, which the next run's first line would otherwise follow
  on the same line, making one that no reader can parse.

  Args:
    path: The file, local or a URL.
    flush_every_s: Seconds between uploads of a remote file's batches.
    record_end: What ends each record (b"\n"), or None for records that do
      not say where they end.
  """

  def __init__(self, path: str, flush_every_s: float = 30.0, record_end: bytes | None = None):
    self.path = path
    self._remote = "://" in path
    self._buffer = bytearray()
    self._lock = threading.Lock()
    self._upload_lock = threading.Lock()
    self._failures = 0
    if not self._remote:
      os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
      self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
      if record_end is not None:
        size = os.fstat(self._fd).st_size
        whole = _whole_records(lambda start, end: os.pread(self._fd, end - start, start),
                               size, record_end)
        if whole < size:
          self._cut(whole)
          _said_cut(path, size - whole)
      return
    import fsspec

    self._fs, self._object = fsspec.core.url_to_fs(path)
    if record_end is not None:
      self._cut_remote(record_end)
    self._parts = 0
    self._flush_every_s = flush_every_s
    self._wake = threading.Event()
    self._closing = False
    self._thread = threading.Thread(target=self._flush_loop, daemon=True,
                                    name=f"append {os.path.basename(path)}")
    self._thread.start()

  def append(self, data: bytes) -> None:
    """Appends `data` (whole lines or records: a failed write leaves none of it).

    Raises:
      StorageWriteError: a local disk or quota is full, a file-size limit
        reached or the file system read-only (what was appended before is
        kept; nothing else stops it growing, so the run stops).
    """
    if not self._remote:
      end = os.lseek(self._fd, 0, os.SEEK_END)
      try:
        view = memoryview(data)
        while view:  # a write cut short by a full disk returns what it wrote
          view = view[os.write(self._fd, view):]
      except OSError as e:
        self._cut(end)  # no half line or record for the next append to follow
        # A disk, quota or file-size limit that refuses this line refuses every
        # later one; an input/output error may pass (training goes on).
        if errors.write_failure(e) is not None and e.errno not in (errno.EIO, errno.ESTALE):
          raise errors.storage_write_error(self.path, e, f"{self.path} holds every line "
                                           "before") from e
        self._warn(e)
      return
    with self._lock:
      self._buffer += data

  def _cut_remote(self, record_end: bytes) -> None:
    """Rewrites the object up to its last whole record, if it ends in a part
    of one (an object cannot be truncated). A storage error is logged: the
    next run tries again."""
    fs, target = self._fs, self._object
    try:
      if not fs.exists(target):
        return
      size = fs.info(target)["size"]
      whole = _whole_records(lambda start, end: fs.cat_file(target, start=start, end=end),
                             size, record_end)
      if whole < size:
        fs.pipe_file(target, fs.cat_file(target, start=0, end=whole) if whole else b"")
        fs.invalidate_cache(target)
        _said_cut(self.path, size - whole)
    except Exception as e:  # pylint: disable=broad-except  # never fatal to training
      logging.warning("%s: could not check its last line (%s)", self.path, e)

  def _cut(self, end: int) -> None:
    """Truncates the local file back to `end` bytes (dropping a partial write)."""
    try:
      os.ftruncate(self._fd, end)
    except OSError as e:
      logging.warning("%s: could not remove a partial write (%s)", self.path, e)

  def flush(self) -> bool:
    """Uploads what is buffered now (and waits); returns whether all of it is stored."""
    if not self._remote:
      return True
    return self._upload()

  def _flush_loop(self) -> None:
    while not self._closing:
      self._wake.wait(self._flush_every_s)
      self._upload()

  def _upload(self) -> bool:
    # Appends go on while a batch uploads (the buffer's lock is not held
    # during the upload); one upload at a time keeps the batches in order.
    with self._upload_lock:
      with self._lock:
        data = bytes(self._buffer)
      if not data:
        return True
      try:
        self._append_object(data)
      except Exception as e:  # a storage error is never fatal to training
        self._warn(e)
        return False
      with self._lock:
        del self._buffer[:len(data)]
    if self._failures:
      logging.info("%s: writing again after %d failed tries", self.path, self._failures)
      self._failures = 0
    return True

  def _append_object(self, data: bytes) -> None:
    """Appends `data` to the object (each call is one batch, at most once)."""
    fs, target = self._fs, self._object
    if not fs.exists(target):
      fs.pipe_file(target, data)
      return
    size = fs.info(target)["size"]
    self._parts += 1
    # A part left by a kill must not look like the object to a reader
    # (TensorBoard reads every file whose name holds "tfevents"): a hidden
    # name of its own, unique per host, process and writer.
    part = (f"{target.rsplit('/', 1)[0]}/.part-{socket.gethostname()}-{os.getpid()}-"
            f"{id(self):x}-{self._parts}")
    fs.pipe_file(part, data)
    try:
      try:
        fs.merge(target, [target, part])
      except Exception:
        # The compose may have been done with its answer lost: not twice.
        fs.invalidate_cache(target)
        if fs.info(target)["size"] != size + len(data):
          raise
    finally:
      try:
        fs.rm_file(part)
      except Exception:  # a stray part is harmless; the data is in place or retried
        pass
    fs.invalidate_cache(target)

  def _warn(self, error: Exception) -> None:
    self._failures += 1
    logging.warning("%s: could not write (try %d, %d bytes waiting; training goes on): %s",
                    self.path, self._failures, len(self._buffer), error)

  def close(self) -> None:
    if not self._remote:
      if self._fd is not None:
        os.close(self._fd)
        self._fd = None
      return
    self._closing = True
    self._wake.set()
    self._thread.join()
    for attempt in range(3):
      if self.flush():
        return
      time.sleep(2 ** attempt)
    logging.error("%s: %d bytes of metrics could not be written", self.path,
                  len(self._buffer))


def _whole_records(read, size: int, record_end: bytes, block: int = 1 << 16) -> int:
  """The length of a file's whole records: up to its last `record_end`.

  Args:
    read: `read(start, end)`, the file's bytes [start, end).
    size: The file's size.
  """
  end = size
  while end > 0:
    start = max(0, end - block)
    data = read(start, end)
    if end == size and data.endswith(record_end):
      return size
    found = data.rfind(record_end)
    if found >= 0:
      return start + found + len(record_end)
    end = start
  return 0


def _said_cut(path: str, dropped: int) -> None:
  logging.warning("%s ended in part of a line (%d bytes: a run stopped while writing it); "
                  "dropped it, so that every line reads", path, dropped)


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The records of a JSONL file this module appends to (`metrics.jsonl`),
  local or a URL.

  A line that does not read (a run killed while writing its last one, a line
  edited by hand) is skipped, and the lines skipped are counted in one
  warning that names the file and their line numbers.
  """
  records, skipped, number, line = [], [], 0, "\n"
  with files.open_text(path) as f:
    for number, line in enumerate(f, 1):  # metrics lines are short: one at a time
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        record = None
      if isinstance(record, dict):
        records.append(record)
      else:
        skipped.append(number)
  if skipped:
    cut = skipped[-1] == number and not line.endswith("\n")
    logging.warning("%s: skipped %d line(s) that do not read as a JSON record (line %s%s)",
                    path, len(skipped), ", ".join(map(str, skipped[:10])) +
                    (", ..." if len(skipped) > 10 else ""),
                    "; the last was cut off as a run stopped" if cut else "")
  return records


class EventFileWriter:
  """Appends scalar summaries to a TensorBoard event file of its own (one per
  writer: each run or resume starts a new file, which TensorBoard reads together).

  Args:
    directory: The TensorBoard log directory, local or a URL.
    flush_every_s: Seconds between uploads to a URL (see `AppendFile`).
  """

  def __init__(self, directory: str, flush_every_s: float = 30.0):
    # As TensorFlow names them: time, host, process, and a counter for the
    # writers of one process.
    name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
            f".{next(_WRITER_NUMBERS)}")
    self.path = os.path.join(directory, name)
    self._file = AppendFile(self.path, flush_every_s)
    self._write(_event(time.time(), 0, file_version="brain.Event:2"))

  def _write(self, record: bytes) -> None:
    header = struct.pack("<Q", len(record))
    self._file.append(header + struct.pack("<I", _masked_crc(header)) + record
                      + struct.pack("<I", _masked_crc(record)))

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    self._write(_event(time.time(), step, {k: float(v) for k, v in values.items()}))

  def flush(self) -> bool:
    return self._file.flush()

  def close(self) -> None:
    self._file.close()


class MetricWriter:
  """Writes metrics to `<workdir>/metrics.jsonl`, TensorBoard events and the
  trackers the config asks for (`bertjax.trackers`: W&B), from process 0.

  `metrics.jsonl` is appended to by every run and resume in the workdir (no
  earlier line is ever lost); each run writes its own TensorBoard event file.
  On `gs://` both are appended in batches (see `AppendFile`); the trainer
  calls `flush()` with every checkpoint, so every step up to the newest
  checkpoint is stored.

  Args:
    workdir: The run's directory, local or a URL.
    enabled: Whether this process writes (process 0 does).
    flush_every_s: Seconds between uploads to a URL.
    config: The run's config: its `wandb` block starts a W&B run (None: none).
  """

  def __init__(self, workdir: str, enabled: bool = True, flush_every_s: float = 30.0,
               config: Any = None):
    self.enabled = enabled
    self._tracker_failed = False
    # First: a tracker that cannot start leaves no file of this writer open.
    self._trackers = [] if config is None else _open_trackers(config, workdir, enabled)
    if not enabled:
      return
    try:
      self._jsonl = AppendFile(os.path.join(workdir, "metrics.jsonl"), flush_every_s,
                               record_end=b"\n")
      self._events = EventFileWriter(os.path.join(workdir, "tensorboard"), flush_every_s)
    except BaseException as e:
      for tracker in self._trackers:
        tracker.close(e)
      if hasattr(self, "_jsonl"):
        self._jsonl.close()
      raise

  def write(self, step: int, values: Mapping[str, Any], prefix: str = "") -> None:
    """Writes a step's scalars, named `prefix/name` in TensorBoard."""
    if not self.enabled:
      return
    named = {f"{prefix}{k}": v for k, v in values.items()}
    self._jsonl.append((json.dumps({"step": step, **named}) + "\n").encode())
    numeric = {k: v for k, v in named.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    self._events.scalars(step, numeric)
    for tracker in self._trackers:
      try:
        tracker.write(step, named)
      except Exception as e:  # pylint: disable=broad-except  # never fatal to training
        if not self._tracker_failed:
          logging.warning("%s could not take the metrics of step %d (training goes on): %s",
                          type(tracker).__name__, step, e)
        self._tracker_failed = True

  def flush(self) -> None:
    """Stores what was written so far (waits for a remote upload; never raises)."""
    if self.enabled:
      self._jsonl.flush()
      self._events.flush()

  def close(self, error: BaseException | None = None) -> None:
    """Stores the rest and closes the files and trackers.

    Args:
      error: What ends the run, if it fails or is stopped: the trackers
        record its exit status (`bertjax.trackers.WandbSink.close`).
    """
    if self.enabled:
      self._jsonl.close()
      self._events.close()
      for tracker in self._trackers:
        tracker.close(error)  # never raises: `error` is what the run ends with
      self._trackers = []


def _open_trackers(config: Any, workdir: str, enabled: bool) -> list[Any]:
  """The trackers `config` asks for, started by the writing process
  (`enabled`). Every process learns whether they started (`hosts.agree`): a
  W&B run that cannot start (not logged in) ends every host with its message,
  none left waiting for process 0 in a collective."""
  from bertjax import hosts, trackers  # pylint: disable=import-outside-toplevel

  if not trackers.wanted(config):
    return []
  error, sinks = None, []
  if enabled:
    try:
      sinks = [sink for sink in [trackers.open_wandb(config, workdir)] if sink]
    except Exception as e:  # pylint: disable=broad-except  # every process stops with it
      error = e
  hosts.agree(error, "starting the W&B run")
  return sinks


def format_line(step: int, total: int, values: Mapping[str, float]) -> str:
  """The console line of a training step (pre-training or fine-tuning)."""
  parts = [f"step {step}/{total}"]
  for name, spec in (("loss", ".4f"), ("accuracy", ".3f"), ("mlm_accuracy", ".3f"),
                     ("nsp_accuracy", ".3f"), ("learning_rate", ".2e"), ("grad_norm", ".3f"),
                     ("examples_per_s", ".1f"), ("sequences_per_s", ".1f"),
                     ("tokens_per_s", ".0f"), ("real_tokens_per_s", ".0f"),
                     ("tflops_per_s_per_device", ".3f"), ("mfu", ".1%"),
                     ("input_wait", ".0%")):
    if name in values:
      parts.append(f"{name.replace('_per_s', '/s')} {values[name]:{spec}}")
  if "eta_s" in values:
    parts.append(f"eta {_duration(values['eta_s'])}")
  if "cost_left" in values:
    parts.append(f"cost left {values['cost_left']:,.2f}")
  if values.get("skipped_total"):
    parts.append(f"skipped {int(values['skipped_total'])}")
  return "  ".join(parts)


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def log(message: str) -> None:
  logging.info("%s", message)


def _quiet_orbax(record: pylogging.LogRecord) -> bool:
  """Whether `record` is orbax's or gcsfs', at the default verbosity
  (`--verbosity=1` shows all of their lines as they are): gcsfs logs each
  request it gave up on with a traceback, and bertjax's own line then says
  what failed and what it did about it."""
  path = record.pathname.replace(os.sep, "/")
  return logging.get_verbosity() <= logging.INFO and ("/orbax/" in path or "/gcsfs/" in path)


class _OrbaxInfoFilter(pylogging.Filter):
  """Drops orbax's INFO records at the default verbosity: every checkpoint
  save or restore logs a few dozen lines, which would bury the training lines."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    return not (_quiet_orbax(record) and record.levelno <= pylogging.INFO)


class _OneLineOrbaxErrors(pylogging.Formatter):
  """Writes orbax's warnings and errors as one line each at the default
  verbosity: a failed save logs its traceback from each of orbax's threads,
  and bertjax's own error then says which step failed and where a rerun
  resumes. The record itself is left whole for any other handler."""

  def __init__(self, formatter: pylogging.Formatter | None):
    super().__init__()
    self.formatter = formatter or pylogging.Formatter()

  def format(self, record: pylogging.LogRecord) -> str:
    if _quiet_orbax(record):
      message = record.getMessage()
      if record.exc_info or "\n" in message:  # a traceback, or an error's text with one
        record = copy.copy(record)
        record.exc_info = record.exc_text = None
        record.msg, record.args = "%s (--verbosity=1 shows the traceback)", (
            message.strip().splitlines()[0] if message.strip() else "",)
    return self.formatter.format(record)


def quiet_checkpoint_logs() -> None:
  """Installs the filter and the formatter on absl's log handler (once)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _OrbaxInfoFilter) for f in handler.filters):
    handler.addFilter(_OrbaxInfoFilter())
  python_handler = handler.python_handler
  if not isinstance(python_handler.formatter, _OneLineOrbaxErrors):
    python_handler.setFormatter(_OneLineOrbaxErrors(python_handler.formatter))
