"""Metrics out of a training run: console lines, a JSONL file, TensorBoard events.

TensorBoard event files are written here directly (TFRecord framing of `Event`
protocol buffers with scalar summaries), so neither TensorFlow nor TensorBoard
is needed to write them. Only process 0 writes.
"""

from __future__ import annotations

import json
import logging as pylogging
import os
import socket
import struct
import tempfile
import time
from typing import Any, Mapping

from absl import logging

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


class EventFileWriter:
  """Appends scalar summaries to a TensorBoard event file."""

  def __init__(self, directory: str):
    os.makedirs(directory, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
    self.path = os.path.join(directory, name)
    self._file = open(self.path, "ab")
    self._write(_event(time.time(), 0, file_version="brain.Event:2"))

  def _write(self, record: bytes) -> None:
    header = struct.pack("<Q", len(record))
    self._file.write(header + struct.pack("<I", _masked_crc(header)) + record
                     + struct.pack("<I", _masked_crc(record)))

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    self._write(_event(time.time(), step, {k: float(v) for k, v in values.items()}))
    self._file.flush()

  def close(self) -> None:
    self._file.close()


class MetricWriter:
  """Writes metrics to `<workdir>/metrics.jsonl` and TensorBoard events (process 0).

  A remote workdir (`gs://...`) cannot be appended to: the files are written to
  a local directory and copied whole to the workdir after each write.

  Args:
    workdir: The run's directory.
    enabled: Whether this process writes (process 0 does).
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    self._remote = workdir if "://" in workdir else None
    local = tempfile.mkdtemp(prefix="bertjax-metrics-") if self._remote else workdir
    os.makedirs(local, exist_ok=True)
    self._local = local
    self._jsonl = open(os.path.join(local, "metrics.jsonl"), "a", encoding="utf-8")
    self._events = EventFileWriter(os.path.join(local, "tensorboard"))

  def write(self, step: int, values: Mapping[str, Any], prefix: str = "") -> None:
    """Writes a step's scalars, named `prefix/name` in TensorBoard."""
    if not self.enabled:
      return
    record = {"step": step, **{f"{prefix}{k}": v for k, v in values.items()}}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    numeric = {f"{prefix}{k}": v for k, v in values.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    self._events.scalars(step, numeric)
    if self._remote:
      self._mirror()

  def _mirror(self) -> None:
    from etils import epath

    for local in (self._jsonl.name, self._events.path):
      relative = os.path.relpath(local, self._local)
      target = epath.Path(self._remote) / relative
      target.parent.mkdir(parents=True, exist_ok=True)
      with open(local, "rb") as f:
        target.write_bytes(f.read())

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._events.close()


def format_line(step: int, total: int, values: Mapping[str, float]) -> str:
  """The console line of a training step."""
  parts = [f"step {step}/{total}"]
  for name, spec in (("loss", ".4f"), ("mlm_accuracy", ".3f"), ("nsp_accuracy", ".3f"),
                     ("learning_rate", ".2e"), ("grad_norm", ".3f"),
                     ("sequences_per_s", ".1f"), ("tokens_per_s", ".0f"),
                     ("tflops_per_s_per_device", ".3f"), ("mfu", ".1%")):
    if name in values:
      parts.append(f"{name.replace('_per_s', '/s')} {values[name]:{spec}}")
  if "eta_s" in values:
    parts.append(f"eta {_duration(values['eta_s'])}")
  if values.get("skipped_total"):
    parts.append(f"skipped {int(values['skipped_total'])}")
  return "  ".join(parts)


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def log(message: str) -> None:
  logging.info("%s", message)


class _OrbaxInfoFilter(pylogging.Filter):
  """Drops orbax's INFO records at the default verbosity: every checkpoint save
  or restore logs a few dozen lines, which would bury the training lines.
  Warnings and errors pass, and `--verbosity=1` shows everything."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    if record.levelno > pylogging.INFO or logging.get_verbosity() > logging.INFO:
      return True
    return "/orbax/" not in record.pathname.replace(os.sep, "/")


def quiet_checkpoint_logs() -> None:
  """Installs the filter on absl's log handler (once)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _OrbaxInfoFilter) for f in handler.filters):
    handler.addFilter(_OrbaxInfoFilter())
