"""What a raw input file holds, judged from samples of its bytes, and its lines as UTF-8.

A corpus file may be compressed (gzip, bzip2, xz: read through a decompressor)
and may be UTF-16 or UTF-32 text with a byte-order mark (decoded); `inspect`
tells those from files not worth reading (binary, another encoding, archives),
and `Utf8Lines` reads the first kind line by line as UTF-8 bytes, the form in
which `bertjax.data.corpus` reads every file.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import re
import zlib
from typing import Callable, NamedTuple

from bertjax import files

# A file is judged by three 8 KB samples (decompressed and decoded): its start,
# middle and end (of a compressed file: of its first MiB). Text has almost no
# control characters; machine code, images and archives have many. A file is
# binary when most samples are: a binary stretch in a text file, like a stray
# NUL or bad byte, costs only its lines, while a binary file whose end is text
# (a PDF's cross-reference table) is still binary. Formats that text never
# starts with are named by their signature.
_SAMPLE_BYTES = 8192
_SCAN_BYTES = 1 << 20  # a long line's bytes read at a time by `first_document`
_KEEP_BYTES = 4096  # of each line `first_document` gives
_COMPRESSED_SAMPLE_BYTES = 1 << 20
_MAX_CONTROL_SHARE = 0.05
_MAX_UNDECODABLE_SHARE = 0.3
# Control characters that text holds too are no evidence: whitespace, escape
# (ANSI colours) and backspace (overstruck manual pages).
_CONTROL_CHARACTERS = frozenset(map(chr, [*range(0x08), *range(0x0e, 0x1b),
                                          *range(0x1c, 0x20), 0x7f]))
# Read through a decompressor (each file whole, by one reader).
_COMPRESSIONS = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
_ARCHIVES = {b"\x28\xb5\x2f\xfd": "zstd-compressed (decompress it first)",
             b"PK\x03\x04": "zip archive (extract its files first)",
             b"7z\xbc\xaf\x27\x1c": "7z archive (extract its files first)"}
_BINARY_FORMATS = {b"%PDF-": "a PDF document (extract its text first)",
                   b"\x7fELF": "an executable (ELF)",
                   b"\x89PNG\r\n\x1a\n": "a PNG image", b"\xff\xd8\xff": "a JPEG image",
                   b"GIF87a": "a GIF image", b"GIF89a": "a GIF image",
                   b"SQLite format 3\x00": "an SQLite database",
                   b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1": "an old Microsoft Office document",
                   b"ARROW1": "an Apache Arrow file", b"PAR1": "a Parquet file"}
_TAR_MAGIC_OFFSET, _TAR_MAGIC = 257, b"ustar"  # POSIX and GNU tar headers
_TAR = "a tar archive (unpack it first)"
# What a damaged or cut compressed stream raises.
_DAMAGE = (OSError, EOFError, zlib.error, lzma.LZMAError)
# UTF-32's little-endian mark starts with UTF-16's, so it comes first. Each
# with the codec of its byte order (for samples after the mark) and code unit.
_BYTE_ORDER_MARKS = ((codecs.BOM_UTF32_LE, "utf-32", "utf-32-le", 4),
                     (codecs.BOM_UTF32_BE, "utf-32", "utf-32-be", 4),
                     (codecs.BOM_UTF16_LE, "utf-16", "utf-16-le", 2),
                     (codecs.BOM_UTF16_BE, "utf-16", "utf-16-be", 2))
_DECOMPRESSORS = {"gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
                  "bzip2": bz2.BZ2Decompressor, "xz": lzma.LZMADecompressor}
# Escape sequences of terminals (colours, cursor moves, titles): dropped from
# lines, so a coloured log reads as its text.
_TERMINAL_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)"
                              r"|[@-Z\\-_])")


def open_binary(path: str):
  """A file for reading bytes, local or at a `gs://`-style URL."""
  if "://" in path:
    from etils import epath
    return epath.Path(path).open("rb")
  return open(path, "rb")


def not_utf8(path: str, error: UnicodeDecodeError) -> str:
  """Why a file that must be UTF-8 text could not be read, in one line
  (`bertjax.files.not_utf8` with the file's first bytes)."""
  try:
    with open_binary(path) as raw:
      head = raw.read(4)
  except OSError:
    head = b""
  return files.not_utf8(path, head, error)


class _Sample(NamedTuple):
  """Bytes of a file (decompressed), and whether they start or end it."""

  data: bytes
  first: bool
  last: bool

  def lines(self) -> list[bytes]:
    """The whole lines of the sample (a line cut by either edge left out)."""
    lines = self.data.split(b"\n")
    return lines[0 if self.first else 1:None if self.last else -1]


def inspect(path: str, size: int | None = None) -> tuple[str, str] | str:
  """(compression, encoding) of a file worth reading, or why it is not.

  Args:
    size: The file's size in bytes, if known.
  """
  with open_binary(path) as raw:
    head = raw.read(_SAMPLE_BYTES)
    for magic, reason in (*_ARCHIVES.items(), *_BINARY_FORMATS.items()):
      if head.startswith(magic):
        return reason
    if _is_tar(head):
      return _TAR
    compression = next((name for magic, name in _COMPRESSIONS.items()
                        if head.startswith(magic)), "")
    if compression:
      raw.seek(0)
      data, ended, damaged = _decompressed_start(raw, compression, _COMPRESSED_SAMPLE_BYTES)
      if not data:
        return f"not a readable {compression} file" if damaged else "empty file"
      if _is_tar(data):
        return _TAR
      encoding, codec, unit = _encoding(data)
      samples = [_Sample(data[start:end], start == 0, ended and end == len(data))
                 for start, end in _windows(len(data), unit)]
    else:
      encoding, codec, unit = _encoding(head)
      if size is None:
        size = raw.seek(0, io.SEEK_END)
      samples = []
      for start, end in _windows(size, unit):
        raw.seek(start)
        samples.append(_Sample(raw.read(end - start), start == 0, end == size))
  return _judge(samples, encoding, codec) or (compression, encoding)


def _is_tar(head: bytes) -> bool:
  return head[_TAR_MAGIC_OFFSET:_TAR_MAGIC_OFFSET + len(_TAR_MAGIC)] == _TAR_MAGIC


def _encoding(head: bytes) -> tuple[str, str, int]:
  """(encoding to read with, codec of a sample after the start, code unit)."""
  return next(((name, codec, unit) for mark, name, codec, unit in _BYTE_ORDER_MARKS
               if head.startswith(mark)), ("utf-8", "utf-8", 1))


def _windows(size: int, unit: int) -> list[tuple[int, int]]:
  """Byte ranges of the samples of `size` bytes: its start, middle and end
  (starting at whole code units); a small file is one sample."""
  if size <= 3 * 512:
    return [(0, size)]
  width = min(_SAMPLE_BYTES, size // 3)
  starts = [0, (size - width) // 2, size - width]
  return [(start - start % unit, start - start % unit + width) for start in starts]


def _judge(samples: list[_Sample], encoding: str, codec: str) -> str | None:
  """Why the samples' file is not worth reading, or None if it is."""
  texts = [codecs.getincrementaldecoder(encoding if sample.first else codec)("replace")
           .decode(sample.data) for sample in samples]
  head = samples[0].data
  if encoding == "utf-8" and _is_utf16_without_mark(head):
    return "UTF-16 without a byte-order mark (convert it to UTF-8)"
  binary = [_control_share(text) > _MAX_CONTROL_SHARE for text in texts]
  if 2 * sum(binary) > len(binary):
    return f"binary file (over {_MAX_CONTROL_SHARE:.0%} control characters)"
  text = "".join(t for t, is_binary in zip(texts, binary) if not is_binary)
  if text.count("\ufffd") > _MAX_UNDECODABLE_SHARE * len(text):
    return f"not {encoding.upper()} text (mostly undecodable bytes; convert it to UTF-8)"
  if encoding == "utf-8":
    lines = [line for sample, is_binary in zip(samples, binary) if not is_binary
             for line in sample.lines() if line.strip() and b"\x00" not in line]
    invalid = [line for line in lines if not _is_utf8(line)]
    if len(invalid) > len(lines) / 2:  # most lines would be skipped
      if all(_is_cp1252(line) for line in invalid):
        return "not UTF-8 (looks like Latin-1/cp1252; convert it, e.g. iconv -f cp1252 -t utf-8)"
      return "not UTF-8 text (most lines undecodable; convert it to UTF-8)"
  if "\r" in texts[0] and "\n" not in texts[0]:
    return "CR-only line endings (convert them to \\n)"
  return None


def _control_share(text: str) -> float:
  return sum(c in _CONTROL_CHARACTERS for c in text) / max(len(text), 1)


def _is_utf8(line: bytes) -> bool:
  try:
    line.decode("utf-8")
  except UnicodeDecodeError:
    return False
  return True


def _is_cp1252(line: bytes) -> bool:
  try:
    return _control_share(line.decode("cp1252")) == 0
  except UnicodeDecodeError:
    return False


def _decompressed_start(raw, compression: str, limit: int) -> tuple[bytes, bool, bool]:
  """(data, ended, damaged): up to `limit` bytes of the decompressed start of
  `raw`; whether they are the whole content (the stream ended or broke off);
  whether it is cut short or damaged there. What precedes damage is kept."""
  new = _DECOMPRESSORS[compression]
  decompressor, data = new(), bytearray()
  try:
    while len(data) < limit:
      if decompressor.eof:  # another stream may follow (concatenated files)
        chunk = decompressor.unused_data or raw.read(1 << 16)
        if not chunk:
          return bytes(data), True, False
        decompressor = new()
      else:
        chunk = raw.read(1 << 16)
        if not chunk:  # the file ends before its stream does: cut short
          return bytes(data), True, True
      data += decompressor.decompress(chunk, limit - len(data))
  except _DAMAGE:
    return bytes(data), True, True
  return bytes(data), False, False


def strip_terminal_escapes(text: str) -> str:
  """`text` without terminal escape sequences (ANSI colours and the like)."""
  return _TERMINAL_ESCAPE.sub("", text) if "\x1b" in text else text


def _is_utf16_without_mark(head: bytes) -> bool:
  """Whether bytes look like UTF-16 text: NULs at every other position (the
  high bytes of Latin characters), few elsewhere, and text once decoded."""
  for zeros, others, encoding in ((head[1::2], head[0::2], "utf-16-le"),
                                  (head[0::2], head[1::2], "utf-16-be")):
    if zeros and zeros.count(0) > 0.5 * len(zeros) and others.count(0) < 0.02 * len(others):
      text = codecs.getincrementaldecoder(encoding)("replace").decode(head)
      return sum(c in _CONTROL_CHARACTERS for c in text) <= _MAX_CONTROL_SHARE * len(text)
  return False


def first_document(path: str, compression: str = "", encoding: str = "utf-8",
                   most: int = 1000) -> list[str]:
  """The lines of text a file starts with before its first blank line
  (whitespace only; blank lines before the first text do not count), up to
  `most`: its first document, read one sentence a line. Each line is given
  to its first `_KEEP_BYTES` bytes.

  A line of any length costs at most a MiB of memory; a file that ends first
  gives the lines it has.
  """
  lines = []
  with open_binary(path) as raw:
    f = (Utf8Lines(raw, compression, encoding, lambda reason: None)
         if compression or encoding != "utf-8" else raw)
    first = True
    while len(lines) < most:
      line = f.readline(_SCAN_BYTES)
      if not line:
        break
      if first:
        line, first = line.removeprefix(codecs.BOM_UTF8), False
      rest = line
      while rest and not rest.endswith(b"\n"):  # the rest of a long line, unkept
        rest = f.readline(_SCAN_BYTES)
      text = line[:_KEEP_BYTES].decode("utf-8", "replace").strip() if line.strip() else ""
      if text:
        lines.append(text)
      elif lines:
        break
  return lines


def decompressed(raw, compression: str):
  """A reader of the decompressed bytes of `raw` ("gzip", "bzip2" or "xz")."""
  if compression == "gzip":
    return gzip.GzipFile(fileobj=raw, mode="rb")
  if compression == "bzip2":
    return bz2.BZ2File(raw)
  return lzma.LZMAFile(raw)


def _mark_undecodable(error: UnicodeDecodeError) -> tuple[str, int]:
  # A lone surrogate, encoded back with "surrogatepass", makes its line invalid
  # UTF-8: the line is then skipped and counted like any undecodable one.
  return "\udcff", error.end


codecs.register_error("bertjax.mark_undecodable", _mark_undecodable)


class Utf8Lines:
  """The UTF-8 lines of a compressed or UTF-16/UTF-32 file, read from its start.

  A compressed file that is cut short or damaged ends at the damage, counted
  (`broken`).
  """

  def __init__(self, raw, compression: str, encoding: str,
               skip_line: Callable[[str], None]):
    """`skip_line(reason)` counts the rest of a damaged file."""
    self._raw, self._skip_line = raw, skip_line
    self._compression = compression
    self._stream = decompressed(raw, compression) if compression else raw
    self._text = None
    if encoding != "utf-8":
      self._text = io.TextIOWrapper(self._stream, encoding=encoding,
                                    errors="bertjax.mark_undecodable", newline="\n")
    self._position, self.broken = 0, False

  def readline(self, limit: int = -1) -> bytes:
    if self.broken:
      return b""
    try:
      if self._text is None:
        line = self._stream.readline(limit)
      else:
        line = self._text.readline(limit).encode("utf-8", "surrogatepass")
    except _DAMAGE:
      self._skip_line(f"the rest of a damaged {self._compression} file")
      self.broken = True
      return b""
    self._position += len(line)
    return line

  def tell(self) -> int:
    """Bytes of UTF-8 text read so far."""
    return self._position

  def consumed(self) -> int:
    """Bytes of the file read so far."""
    return self._raw.tell()
