"""What a raw input file holds, judged from its first bytes, and its lines as UTF-8.

A corpus file may be compressed (gzip, bzip2, xz: read through a decompressor)
and may be UTF-16 or UTF-32 text with a byte-order mark (decoded); `inspect`
tells those from files not worth reading (binary, another encoding, archives),
and `Utf8Lines` reads the first kind line by line as UTF-8 bytes, the form in
which `bertjax.data.corpus` reads every file.
"""

from __future__ import annotations

import bz2
import codecs
import collections
import gzip
import io
import lzma
import zlib

# A file is judged by its first 8 KB (decompressed and decoded): text has
# almost no control characters and, in UTF-8, few undecodable bytes; machine
# code, images and archives have many. A stray NUL or bad byte in a text file
# only costs its line.
_BINARY_PROBE_BYTES = 8192
_MAX_CONTROL_SHARE = 0.05
_MAX_UNDECODABLE_SHARE = 0.3
_CONTROL_CHARACTERS = frozenset(map(chr, [*range(0x09), *range(0x0e, 0x20), 0x7f]))
# Read through a decompressor (each file whole, by one reader).
_COMPRESSIONS = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
_ARCHIVES = {b"\x28\xb5\x2f\xfd": "zstd-compressed (decompress it first)",
             b"PK\x03\x04": "zip archive (extract its files first)",
             b"7z\xbc\xaf\x27\x1c": "7z archive (extract its files first)"}
# What a damaged or cut compressed stream raises.
_DAMAGE = (OSError, EOFError, zlib.error, lzma.LZMAError)
# UTF-32's little-endian mark starts with UTF-16's, so it comes first.
_BYTE_ORDER_MARKS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                     (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def open_binary(path: str):
  """A file for reading bytes, local or at a `gs://`-style URL."""
  if "://" in path:
    from etils import epath
    return epath.Path(path).open("rb")
  return open(path, "rb")


def inspect(path: str) -> tuple[str, str] | str:
  """(compression, encoding) of a file worth reading, or why it is not."""
  with open_binary(path) as raw:
    head = raw.read(_BINARY_PROBE_BYTES)
  for magic, reason in _ARCHIVES.items():
    if head.startswith(magic):
      return reason
  compression = next((name for magic, name in _COMPRESSIONS.items()
                      if head.startswith(magic)), "")
  if compression:
    try:
      with open_binary(path) as raw, decompressed(raw, compression) as f:
        head = f.read(_BINARY_PROBE_BYTES)
    except _DAMAGE:
      return f"not a readable {compression} file"
    if not head:
      return "empty file"
  encoding = next((name for mark, name in _BYTE_ORDER_MARKS if head.startswith(mark)), "utf-8")
  text = codecs.getincrementaldecoder(encoding)("replace").decode(head)
  if encoding == "utf-8" and _is_utf16_without_mark(head):
    return "UTF-16 without a byte-order mark (convert it to UTF-8)"
  if sum(c in _CONTROL_CHARACTERS for c in text) > _MAX_CONTROL_SHARE * len(text):
    return f"binary file (over {_MAX_CONTROL_SHARE:.0%} control characters)"
  if text.count("\ufffd") > _MAX_UNDECODABLE_SHARE * len(text):
    return f"not {encoding.upper()} text (mostly undecodable bytes; convert it to UTF-8)"
  if "\r" in text and "\n" not in text:
    return "CR-only line endings (convert them to \\n)"
  return compression, encoding


def _is_utf16_without_mark(head: bytes) -> bool:
  """Whether bytes look like UTF-16 text: NULs at every other position (the
  high bytes of Latin characters), few elsewhere, and text once decoded."""
  for zeros, others, encoding in ((head[1::2], head[0::2], "utf-16-le"),
                                  (head[0::2], head[1::2], "utf-16-be")):
    if zeros and zeros.count(0) > 0.5 * len(zeros) and others.count(0) < 0.02 * len(others):
      text = codecs.getincrementaldecoder(encoding)("replace").decode(head)
      return sum(c in _CONTROL_CHARACTERS for c in text) <= _MAX_CONTROL_SHARE * len(text)
  return False


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
               lines_skipped: collections.Counter):
    self._raw, self._lines_skipped = raw, lines_skipped
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
      self._lines_skipped[f"the rest of a damaged {self._compression} file"] += 1
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
