"""Raw text corpora as streams of documents (lists of sentences), with accounting.

Sources, named by one string (`--input` of the builder):
- files: paths and globs, comma-separated, local or `gs://...` (through
  `etils.epath`), in the original format (one sentence per line, blank lines
  between documents) or one document per line (split into sentences);
- `tfds:NAME[:SPLIT]`: a TFDS text dataset (e.g. `tfds:wikipedia/20230601.en`),
  read with `tfds.data_source`, so TensorFlow is not needed;
- `demo:stdlib`: the docstrings and help topics of this Python's standard
  library, parsed from its source files (no import, no download): an offline
  English corpus of a few hundred thousand WordPiece tokens on any machine
  (`bertjax.data.stdlib_corpus`).

Large inputs are read in parallel as byte ranges: a range owns the documents
whose first line starts inside it, and reads past its end to finish the last.
Files compressed with gzip, bzip2 or xz, and UTF-16 or UTF-32 text with a
byte-order mark, are read too, each whole by one reader. Everything not used is
counted with its reason in `CorpusStats`, and the first few skipped files, and
files with lines skipped while reading them, are named (sentences that
tokenise to nothing are counted, not placed).
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import functools
import glob
import io
import math
import os
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from bertjax import errors
from bertjax.data import textfiles
from bertjax.data.sentences import split_sentences

FILE_FORMATS = ("sentences", "documents")
_NAMED_FILES = 5  # skipped files named in the summary, per reason
_BACKSCAN_CHUNK = 4096
# Bytes read at a time past a line too long to keep (or the rest of a line
# before a range's first line start): what a line of any length costs.
_SCAN_CHUNK = 1 << 20
# ASCII whitespace and every non-ASCII byte: what remains is visible ASCII.
_NOT_VISIBLE_ASCII = b" \t\r\n\x0b\x0c" + bytes(range(0x80, 0x100))

Document = list[str]  # sentences


@dataclasses.dataclass
class CorpusStats:
  """Counts of what was read, used and skipped, with reasons.

  `documents_read == documents_used + sum(documents_skipped.values())` once the
  consumer has accounted for every document it received.
  """

  files_read: int = 0
  files_skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  documents_read: int = 0
  documents_used: int = 0
  documents_skipped: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  lines_skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  sentences: int = 0
  tokens: int = 0
  # [reason, path] of the first few skipped files of each reason.
  skipped_file_names: list = dataclasses.field(default_factory=list)
  # [reason, path] of the first few files with skipped lines, for each reason
  # (one more than are named, to tell whether there are others).
  skipped_line_files: list = dataclasses.field(default_factory=list)

  def skip_file(self, path: str, reason: str) -> None:
    """Counts a skipped file, and names it if it is among its reason's first few."""
    self.files_skipped[reason] += 1
    _name(self.skipped_file_names, reason, path, _NAMED_FILES)

  def skip_line(self, reason: str, path: str) -> None:
    """Counts a skipped line, and notes its file among its reason's first few."""
    self.lines_skipped[reason] += 1
    _name(self.skipped_line_files, reason, path, _NAMED_FILES + 1)

  def merge(self, other: CorpusStats) -> None:
    for field in dataclasses.fields(self):
      mine = getattr(self, field.name)
      if isinstance(mine, collections.Counter):
        mine.update(getattr(other, field.name))
      elif isinstance(mine, list):
        limit = _NAMED_FILES + (field.name == "skipped_line_files")
        for reason, path in getattr(other, field.name):
          _name(mine, reason, path, limit)
      else:
        setattr(self, field.name, mine + getattr(other, field.name))

  def to_dict(self) -> dict[str, Any]:
    return {f.name: (dict(sorted(v.items())) if isinstance(v := getattr(self, f.name),
                                                           collections.Counter) else v)
            for f in dataclasses.fields(self)}

  @classmethod
  def from_dict(cls, values: dict[str, Any]) -> CorpusStats:
    """The counts of `to_dict` (other keys, such as a shard's size, left out)."""
    names = {field.name for field in dataclasses.fields(cls)}
    return cls(**{k: collections.Counter(v) if isinstance(v, dict) else v
                  for k, v in values.items() if k in names})

  def summary(self, tokens: bool = True) -> str:
    """A human-readable account of every file and document, naming the first
    skipped files of each reason.

    Args:
      tokens: Whether to include the token count (a vocabulary trainer has none).
    """
    lines = [
        f"files:      {self.files_read} read, "
        f"{sum(self.files_skipped.values())} skipped",
        f"documents:  {self.documents_read} read = {self.documents_used} used + "
        f"{sum(self.documents_skipped.values())} skipped",
        f"sentences:  {self.sentences} used",
    ] + ([f"tokens:     {self.tokens} used"] if tokens else [])
    for title, counter in (("skipped files", self.files_skipped),
                           ("skipped documents", self.documents_skipped),
                           ("skipped lines", self.lines_skipped)):
      for reason, count in sorted(counter.items()):
        line = f"  {title}: {count} ({reason})"
        if counter is self.files_skipped:
          line += _named(count, [path for r, path in self.skipped_file_names if r == reason])
        elif counter is self.lines_skipped:
          paths = [path for r, path in self.skipped_line_files if r == reason]
          if paths:
            line += ", in " + ", ".join(paths[:_NAMED_FILES]) + (
                " and others" if len(paths) > _NAMED_FILES else "")
        lines.append(line)
    return "\n".join(lines)


def _name(names: list, reason: str, path: str, limit: int) -> None:
  """Adds [reason, path] to `names` unless there or `limit` of that reason are."""
  if [reason, path] not in names and sum(r == reason for r, _ in names) < limit:
    names.append([reason, path])


def _named(count: int, paths: list[str]) -> str:
  """": a, b and 3 more" for `count` files of which `paths` are known."""
  if not paths:
    return ""
  more = f" and {count - len(paths)} more" if count > len(paths) else ""
  return ": " + ", ".join(paths) + more


class InputFile(NamedTuple):
  """A file worth reading: its size, compression ("" for none) and encoding."""

  path: str
  size: int
  compression: str = ""
  encoding: str = "utf-8"


@dataclasses.dataclass(frozen=True)
class FileRange:
  """Bytes [start, end) of one file of `size` bytes: a unit of parallel reading.

  A compressed file, or one not in UTF-8, is read whole: [0, size).
  """

  path: str
  start: int
  end: int
  size: int
  compression: str = ""
  encoding: str = "utf-8"

  @property
  def whole(self) -> bool:
    """Whether the file is read whole (no byte offsets into its text)."""
    return bool(self.compression) or self.encoding != "utf-8"


def expand_inputs(spec: str) -> list[str]:
  """Paths named by comma-separated files and globs, sorted; errors if none.

  Raises:
    FileNotFoundError: a named file does not exist, or a glob matches nothing.
  """
  paths = []
  for pattern in (p.strip() for p in spec.split(",")):
    if not pattern:
      continue
    wildcard = any(c in pattern for c in "*?[")
    if "://" in pattern:
      matches = _remote_matches(pattern, wildcard)
    elif wildcard:
      # Files, and links to nothing (named as skipped by `scan_files`).
      matches = sorted(p for p in glob.glob(pattern, recursive=True)
                       if os.path.isfile(p) or (os.path.islink(p) and not os.path.exists(p)))
    elif os.path.isdir(pattern):
      raise errors.InputIsDirectoryError(f"{pattern} is a directory; name its files with a glob "
                                         f"such as {os.path.join(pattern, '*.txt')}")
    else:
      matches = [pattern] if os.path.isfile(pattern) else []
    if not matches:
      raise errors.MissingFileError(
          f"{pattern}: {'glob matches no files' if wildcard else 'no such file'}")
    paths.extend(matches)
  if not paths:
    raise errors.MissingFileError(f"{spec!r} names no input files")
  return sorted(set(paths))


def _remote_matches(pattern: str, wildcard: bool) -> list[str]:
  from etils import epath

  if not wildcard:
    path = epath.Path(pattern)
    if path.is_dir():
      raise errors.InputIsDirectoryError(f"{pattern} is a directory; name its files with a glob")
    return [pattern] if path.exists() else []
  first = min(pattern.index(c) for c in "*?[" if c in pattern)
  root = pattern[:pattern.rindex("/", 0, first)]
  return sorted(str(p) for p in epath.Path(root).glob(pattern[len(root) + 1:]) if p.is_file())


def parse_tfds_spec(spec: str) -> tuple[str, str]:
  """`tfds:NAME[:SPLIT]` -> (name, split), split defaulting to "train"."""
  _, name, *split = spec.split(":")
  if not name or len(split) > 1:
    raise errors.UsageError(f"{spec}: expected tfds:NAME[:SPLIT], e.g. tfds:wikipedia/20230601.en")
  return name, split[0] if split else "train"


def _stat(path: str) -> tuple[int, int]:
  """(size in bytes, modification time in whole seconds) of a file."""
  if "://" in path:
    from etils import epath
    stat = epath.Path(path).stat()
    return stat.length, int(stat.mtime or 0)
  stat = os.stat(path)
  return stat.st_size, int(stat.st_mtime)


def _size(path: str) -> int:
  return _stat(path)[0]


def scan_files(paths: Sequence[str], stats: CorpusStats,
               manifest: dict[str, list] | None = None) -> list[InputFile]:
  """The files worth reading; the others counted out with their reason, and named.

  A file is judged by 8 KB samples of its start, middle and end, decompressed
  (gzip, bzip2, xz) and decoded (UTF-8, or UTF-16/UTF-32 after a byte-order
  mark): binary (a share of control characters no text has, in every sample),
  not UTF-8 (mostly undecodable bytes, or most lines; Latin-1 is named as
  such), UTF-16 without a byte-order mark, an archive this reader does not open
  (tar, zip, 7z, zstd), CR-only line endings, or empty. A binary stretch in a
  text file costs only its lines. A file that cannot be read (no permission,
  a link to nothing) is skipped with the reason.

  Args:
    manifest: Receives `path: [size, mtime, why skipped or ""]` of every file
      (what the input was: a build compares it with its rerun's).
  """
  usable = []
  for path in paths:
    try:
      size, mtime = _stat(path)
      found = textfiles.inspect(path, size) if size else "empty file"
    except OSError as e:
      size, mtime = -1, -1
      found = ("link to a missing file" if isinstance(e, FileNotFoundError)
               and "://" not in path and os.path.islink(path)
               else f"unreadable ({e.strerror or e})")
    if manifest is not None:
      manifest[path] = [size, mtime, found if isinstance(found, str) else ""]
    if isinstance(found, str):
      stats.skip_file(path, found)
      continue
    stats.files_read += 1
    usable.append(InputFile(path, size, *found))
  return usable


def describe_changes(before: dict[str, list], now: dict[str, list]) -> str:
  """'1 file added (a.txt), 1 grown (b.txt: 10 -> 20 bytes)': how an input's
  manifest (`scan_files`) changed; '' when it did not."""
  def named(paths: list[str]) -> str:
    shown = ", ".join(paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")

  parts = []
  added = sorted(set(now) - set(before))
  removed = sorted(set(before) - set(now))
  if added:
    parts.append(f"{len(added)} file(s) added ({named(added)})")
  if removed:
    parts.append(f"{len(removed)} removed ({named(removed)})")
  both = sorted(set(before) & set(now))
  readable = [p for p in both if before[p][2] and not now[p][2]]
  unreadable = [p for p in both if not before[p][2] and now[p][2]]
  resized = [p for p in both if p not in readable + unreadable and before[p][0] != now[p][0]]
  touched = [p for p in both if p not in readable + unreadable + resized
             and before[p][1] != now[p][1]]
  if readable:
    parts.append(f"{len(readable)} readable now, skipped then ({named(readable)})")
  if unreadable:
    parts.append(f"{len(unreadable)} skipped now, read then "
                 f"({named([f'{p}: {now[p][2]}' for p in unreadable])})")
  if resized:
    parts.append(f"{len(resized)} of another size ("
                 + named([f"{p}: {before[p][0]} -> {now[p][0]} bytes" for p in resized]) + ")")
  if touched:
    parts.append(f"{len(touched)} modified ({named(touched)})")
  return ", ".join(parts)


def plan_ranges(files: Sequence[tuple], num_parts: int) -> list[list[FileRange]]:
  """Splits files into `num_parts` runs of byte ranges of about equal size.

  Args:
    files: `InputFile`s, or (path, size) pairs of UTF-8 text. A file that is
      compressed or in another encoding goes whole to the part where it starts.
  """
  total = sum(file[1] for file in files)
  bounds = [round(total * i / num_parts) for i in range(num_parts + 1)]
  parts: list[list[FileRange]] = [[] for _ in range(num_parts)]
  offset = 0
  for file in files:
    path, size, compression, encoding = InputFile(*file)
    entire = FileRange(path, 0, size, size, compression, encoding)
    for part in range(num_parts):
      start, end = max(bounds[part], offset), min(bounds[part + 1], offset + size)
      if start < end and not entire.whole:
        parts[part].append(FileRange(path, start - offset, end - offset, size))
      elif start < end and start == offset:
        parts[part].append(entire)
    offset += size
  return parts


def _read_line(f, limit: int, first: bool = False) -> tuple[bytes | None, bool]:
  """(line, too_long): the next line (b"" at the end), or None if its text
  (without the newline) is over `limit` bytes; such a line is read past, never
  held whole.

  Args:
    first: Whether the line starts the file: a UTF-8 byte-order mark there
      (as Windows editors write) is not text.
  """
  line = f.readline(limit + 1)
  if len(line) <= limit or line.endswith(b"\n"):
    return line.removeprefix(codecs.BOM_UTF8) if first else line, False
  _skip_rest_of_line(f)
  return None, True


def _skip_rest_of_line(f) -> None:
  """Reads `f` past the next newline (or to its end), a chunk at a time: a
  line of any length costs at most one chunk of memory."""
  while True:
    chunk = f.readline(_SCAN_CHUNK)
    if not chunk or chunk.endswith(b"\n"):
      return


def _is_blank(line: bytes) -> bool:
  """Whether a line holds only whitespace (Unicode's: NBSP and ideographic too)."""
  if not line.strip():
    return True
  try:
    return not line.decode("utf-8").strip()
  except UnicodeDecodeError:
    return False


def _previous_line_is_blank(f, position: int, limit: int) -> bool:
  """Whether the line ending just before `position` (a line start) is blank.

  A line over `limit` bytes is not (`_lines` skips it as too long, never as
  blank); the scan back stops there, so it holds at most `limit` bytes.
  """
  if position == 0:
    return True
  chunks: list[bytes] = []  # the previous line's bytes, last first
  collected, first = 0, False
  cursor = position - 1  # the newline ending the previous line
  while cursor > 0:
    begin = max(0, cursor - _BACKSCAN_CHUNK)
    f.seek(begin)
    chunk = f.read(cursor - begin)
    newline = chunk.rfind(b"\n")
    if newline >= 0:
      chunk = chunk[newline + 1:]
    collected += len(chunk)
    if collected > limit:
      f.seek(position)
      return False
    chunks.append(chunk)
    first = newline < 0 and begin == 0
    if newline >= 0 or chunk.translate(None, _NOT_VISIBLE_ASCII):  # a visible ASCII character
      break  # Not blank, whatever comes before.
    cursor = begin
  f.seek(position)
  line = b"".join(reversed(chunks))
  # The file's first line, as `_read_line` reads it (a byte-order mark is no text).
  return _is_blank(line.removeprefix(codecs.BOM_UTF8) if first else line)


def _first_line_start(f, start: int) -> int:
  """The first line start at or after `start`; leaves `f` there (`f` is new)."""
  if start == 0:
    return 0
  f.seek(start - 1)
  _skip_rest_of_line(f)  # the line holding byte start-1 (just "\n" if it ends there)
  return f.tell()


def read_range(file_range: FileRange, file_format: str, stats: CorpusStats,
               max_line_chars: int = 100_000,
               progress: Callable[[int], None] | None = None) -> Iterator[Document]:
  """Yields the documents a byte range owns, as lists of sentences.

  Args:
    file_range: The bytes to read.
    file_format: "sentences" (one sentence per line, blank line between
      documents) or "documents" (one document per line).
    stats: Counts lines skipped (invalid UTF-8, NUL bytes, too long) and
      documents read.
    max_line_chars: Longer lines are skipped and counted (their bytes are never
      held in memory).
    progress: Called with the number of the range's bytes read since its last
      call; over the whole range, they add up to its length.
  """
  if file_format not in FILE_FORMATS:
    raise errors.UsageError(f"file format must be one of {FILE_FORMATS}, got {file_format!r}")
  size = _size(file_range.path)
  if size != file_range.size:
    raise errors.UsageError(f"{file_range.path} changed while being read ({file_range.size} bytes "
                            f"when the work was planned, {size} now); build from files that are "
                            "complete")
  length = file_range.end - file_range.start
  reported = 0
  with textfiles.open_binary(file_range.path) as raw:
    if file_range.whole:
      f = textfiles.Utf8Lines(raw, file_range.compression, file_range.encoding,
                              functools.partial(stats.skip_line, path=file_range.path))
      end, consumed = math.inf, f.consumed
    else:
      f = raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(raw)
      end, consumed = file_range.end, lambda: f.tell() - file_range.start

    def report(done: int) -> None:
      nonlocal reported
      done = min(done, length)
      if progress is not None and done > reported:
        progress(done - reported)
        reported = done

    for document in _lines(f, _first_line_start(f, file_range.start), end, file_format,
                           f"invalid {file_range.encoding.upper()}", stats, max_line_chars,
                           functools.partial(stats.skip_line, path=file_range.path)):
      yield document
      if progress is not None:
        report(consumed())
    report(length)


def _lines(f, position: int, end: float, file_format: str, invalid: str, stats: CorpusStats,
           max_line_chars: int, skip_line: Callable[[str], None]) -> Iterator[Document]:
  """The documents of `read_range`, from line start `position` of `f`, each
  starting before `end`; `skip_line(reason)` counts a skipped line."""
  limit = 4 * max_line_chars  # bytes: UTF-8 takes at most 4 per character

  def decode(line: bytes) -> str | None:
    if b"\x00" in line:
      skip_line("NUL bytes")
      return None
    try:
      text = line.decode("utf-8")
    except UnicodeDecodeError:
      skip_line(invalid)
      return None
    if len(text) > max_line_chars:
      skip_line(f"over {max_line_chars} characters")
      return None
    return textfiles.strip_terminal_escapes(text)

  if file_format == "documents":
    while position < end:
      line, too_long = _read_line(f, limit, position == 0)
      position = f.tell()
      if too_long:
        stats.documents_read += 1
        stats.documents_skipped[f"over {max_line_chars} characters"] += 1
        continue
      if not line:
        break
      if _is_blank(line):
        continue
      stats.documents_read += 1
      text = decode(line)
      if text is None:
        stats.documents_skipped["unreadable line"] += 1
        continue
      yield split_sentences(text)
    return

  # One sentence per line. Skip the tail of a document owned by the range
  # before; a document belongs to the range holding its first line.
  if not _previous_line_is_blank(f, position, limit):
    while True:
      line, too_long = _read_line(f, limit)
      if not too_long and _is_blank(line):
        break
  in_document, document = False, []
  while True:
    line_start = f.tell()
    line, too_long = _read_line(f, limit, line_start == 0)
    if not too_long and _is_blank(line):  # a blank line or the end of the file
      if in_document:
        stats.documents_read += 1
        if not line and getattr(f, "broken", False):
          stats.documents_skipped["cut short by a damaged file"] += 1
        elif document:
          yield document
        else:
          stats.documents_skipped["no readable lines"] += 1
      in_document, document = False, []
      if not line:
        break
      continue
    if not in_document:
      if line_start >= end:
        break  # The next document belongs to the next range.
      in_document = True
    if too_long:
      skip_line(f"over {max_line_chars} characters")
      continue
    text = decode(line)
    if text is not None:
      document.append(text.strip())


def tfds_source(name: str, split: str = "train", data_dir: str | None = None):
  """A random-access TFDS source (`tfds.data_source`); records have a `text`."""
  from bertjax.data import tfds_io

  return tfds_io.open_source(name, split, data_dir)


def tfds_documents(source, start: int, end: int, stats: CorpusStats,
                   max_line_chars: int = 100_000,
                   progress: Callable[[int], None] | None = None) -> Iterator[Document]:
  """Documents [start, end) of a TFDS text source, split into sentences.

  Args:
    progress: Called with 1 for each record read.
  """
  for index in range(start, end):
    if progress is not None:
      progress(1)
    record = source[index]
    text = record["text"]
    if isinstance(text, bytes):
      try:
        text = text.decode("utf-8")
      except UnicodeDecodeError:
        stats.documents_read += 1
        stats.documents_skipped["invalid UTF-8"] += 1
        continue
    stats.documents_read += 1
    paragraphs = []
    for paragraph in text.split("\n"):
      if len(paragraph) > max_line_chars:
        stats.lines_skipped[f"over {max_line_chars} characters"] += 1
      else:
        paragraphs.append(paragraph)
    yield split_sentences("\n".join(paragraphs))
