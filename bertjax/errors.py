"""The errors bertjax words for its users, and how they are told from bugs.

Every error bertjax raises on purpose is an `Error`: a setting to change, a
file that is missing, damaged or of another dataset, storage that is full or
failed, a workdir another run holds, a run that diverged. Its message names
the key, file or value and what to do, and every command prints it as one
line (`bertjax.usage`). The kinds keep the standard base a caller would catch
(`ValueError`, `FileNotFoundError`, `OSError`, ...).

Two failures of the machine's surroundings are worded wherever they come
from, since no code of bertjax's is at fault: a full disk or exhausted quota
(`storage_full`, an `ENOSPC`/`EDQUOT` anywhere in an error's chain, or its
text from a library that does not raise `OSError`), and an operating system
error about a named file (missing, not permitted, a directory). Anything else
is a bug, and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Iterator


class Error(Exception):
  """An error bertjax raised on purpose, worded for the user: one line."""


class UsageError(Error, ValueError):
  """A setting, flag or input value to change."""


class MissingFileError(Error, FileNotFoundError):
  """A file or directory the command needs is not there."""


class OutputExistsError(Error, FileExistsError):
  """An output is there already, and replacing it was not asked for."""


class InputIsDirectoryError(Error, IsADirectoryError):
  """A directory where a file is expected."""


class MissingDependencyError(Error, ImportError):
  """A package this input needs is not installed; the message says which."""


class CorruptFileError(Error, ValueError):
  """A file that cannot be read as what it claims to be (flipped or missing
  bytes, a file edited after what was built from it); the message names it
  and the command that makes it again."""


class StorageError(Error, OSError):
  """Storage that failed a read or a write; the message says what that left."""


class StorageFullError(StorageError):
  """A write failed because the disk or the quota holding it is full."""


class WorkdirBusyError(Error, OSError):
  """Another run holds the workdir (`bertjax.workdir_lock`)."""


class TrainingStoppedError(Error, FloatingPointError):
  """Training stopped on a loss that is not finite or diverged; the message
  says where a rerun resumes and what to change."""


# The operating system's errors about a named file that are the user's to
# mend (a path to correct, rights to grant), never a bug.
_FILE_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR,
                          errno.ENOTDIR, errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP})
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How libraries that do not raise OSError (tensorstore, array_record, orbax's
# wrappers) word the same errors.
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "ENOSPC", "EDQUOT")


def _chain(error: BaseException | None) -> Iterator[BaseException]:
  """`error` and the errors it was raised from or while handling, once each."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def storage_full(error: BaseException) -> BaseException | None:
  """The error of `error`'s chain that says a disk or quota is full, if any."""
  for link in _chain(error):
    if isinstance(link, StorageFullError):
      return link
    if isinstance(link, OSError) and link.errno in _FULL_ERRNOS:
      return link
    if any(text in str(link) for text in _FULL_TEXTS):
      return link
  return None


def _existing_parent(path: str) -> str:
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def free_space(path: str) -> str:
  """'1.2 GiB free of 100 GiB' on the disk holding a local `path` ('' on gs://)."""
  if "://" in path:
    return ""
  try:
    usage = shutil.disk_usage(_existing_parent(path))
  except OSError:
    return ""
  return f"{_size(usage.free)} free of {_size(usage.total)}"


def _size(count: int) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if count >= scale:
      return f"{count / scale:.1f} {unit}"
  return f"{count} bytes"


def full_disk(path: str, error: BaseException) -> str:
  """'the disk is full (12.0 KiB free of 20.0 MiB)' (or the quota) for a write
  to `path` whose `error` chain holds a full disk."""
  cause = storage_full(error) or error
  quota = getattr(cause, "errno", None) == errno.EDQUOT or "quota" in str(cause).lower()
  where = free_space(path)
  return ("the disk quota is exhausted" if quota else "the disk is full") + (
      f" ({where})" if where else "")


def storage_full_error(path: str, error: BaseException, kept: str) -> StorageFullError:
  """The one-line error of a write to `path` that found its disk or quota full.

  Args:
    path: What was being written (the failed file itself is named instead
      when the error names one elsewhere, on another disk).
    error: The error of the write (its chain holds the full disk).
    kept: What the failed write left as it was, or finished
      (`"finished shards are kept"`).
  """
  failed = getattr(storage_full(error), "filename", None)
  if failed and not os.path.abspath(os.fspath(failed)).startswith(
      os.path.abspath(path) if "://" not in path else path):
    path = os.fspath(failed)
  what = full_disk(path, error)
  advice = ("free space there (or raise the quota)" if "quota" in what
            else "free space on that disk")
  return StorageFullError(f"writing {path} failed: {what}; {advice} or write elsewhere, "
                          f"then rerun the same command; {kept}")


@contextlib.contextmanager
def writing(path: str, kept: str) -> Iterator[None]:
  """Turns a full disk or quota met inside the block into `StorageFullError`
  naming `path` (see `storage_full_error`); other errors pass as they are."""
  try:
    yield
  except StorageFullError:
    raise
  except Exception as error:  # pylint: disable=broad-except
    if storage_full(error) is None:
      raise
    raise storage_full_error(path, error, kept) from error


def one_line(error: BaseException) -> str | None:
  """The line a command prints for `error`, or None for a bug (a traceback).

  An `Error` says its message; a full disk anywhere in the chain says which
  path and what to free; the operating system's error about a named file
  says the file and the reason.
  """
  if isinstance(error, Error):
    return str(error)
  full = storage_full(error)
  if full is not None:
    path = os.fspath(getattr(full, "filename", None) or "a file")
    return str(storage_full_error(path, full, "what was finished before is kept"))
  if (isinstance(error, OSError) and error.errno in _FILE_ERRNOS
      and getattr(error, "filename", None)):
    return f"{error.filename}: {error.strerror}"
  return None
