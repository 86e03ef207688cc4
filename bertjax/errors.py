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

How a command ends tells a supervisor (xpk's JobSet on GKE, `launch/run.sh`
on TPU VMs) what to do next, so every failure is in one of three classes
(`exit_status`, and the table in docs/troubleshooting.md):

- a failure a restart can cure (`RestartableError`: storage unreachable for
  longer than the run waited for it; a network error of the storage client
  anywhere in an error's chain) exits `RESTART_EXIT_CODE`, 42, which xpk
  restarts on;
- an error a person must mend (any other `Error`) exits `USAGE_EXIT_CODE`, 2:
  a restart would end the same way;
- a bug exits 1, with its traceback.

On several hosts the class is agreed (`bertjax.hosts.agree`): every host ends
with one status, never a status guessed from another host's message
(`with_exit_status`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Iterator

USAGE_EXIT_CODE = 2  # a setting, file, disk or workdir to mend
RESTART_EXIT_CODE = 42  # a restart can cure it (xpk restarts on 42 and 127-255)


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


class RestartableError(Error):
  """A failure of the run's surroundings that a restart can cure (exit 42);
  the message says what failed and where a restart resumes."""


class StorageUnreachableError(RestartableError, StorageError):
  """Storage that did not answer for longer than the run waits for it."""


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


# What a storage client raises when the store does not answer, or answers
# "busy, try later": by type, or by the status a library words in its text.
_UNREACHABLE_TYPES = (ConnectionError, TimeoutError)
_UNREACHABLE_TYPE_NAMES = frozenset({
    "ClientConnectionError", "ClientConnectorError", "ServerDisconnectedError",
    "ServerTimeoutError", "ClientOSError",  # aiohttp (gcsfs)
    "ServiceUnavailable", "InternalServerError", "TooManyRequests", "GatewayTimeout",
    "BadGateway", "RetryError",  # google.api_core (the lock's client)
    "ConnectionError", "ConnectTimeout", "ReadTimeout", "ProtocolError",  # requests, urllib3
})
_UNREACHABLE_TEXTS = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "Service Unavailable",
                      "Too Many Requests", "Connection refused", "Connection reset",
                      "Cannot connect to host", "Server disconnected", "timed out")


def storage_unreachable(error: BaseException) -> BaseException | None:
  """The error of `error`'s chain that says the storage did not answer (a
  refused or dropped connection, a time-out, a 429 or 5xx), if any; never a
  full disk, a missing file or missing rights."""
  if storage_full(error) is not None:
    return None
  for link in _chain(error):
    if isinstance(link, StorageUnreachableError):
      return link
    if isinstance(link, _UNREACHABLE_TYPES) or type(link).__name__ in _UNREACHABLE_TYPE_NAMES:
      return link
    status = getattr(link, "code", None)  # gcsfs' HttpError carries the HTTP status
    if isinstance(status, int) and (status == 429 or 500 <= status < 600):
      return link
    if any(text in str(link) for text in _UNREACHABLE_TEXTS):
      return link
  return None


# Where `with_exit_status` keeps the status the hosts of a run agreed on.
_AGREED_STATUS = "_bertjax_agreed_exit_status"


def with_exit_status(error: BaseException, status: int) -> BaseException:
  """`error`, ending its command with `status` whatever its own class (the
  status every host of a run agreed on: `bertjax.hosts.agree`)."""
  setattr(error, _AGREED_STATUS, status)
  return error


def exit_status(error: BaseException) -> int | None:
  """The exit status a command ends with on `error`: 42 for what a restart
  can cure, 2 for what a person must mend, None for a bug (a traceback, 1);
  the status the run's hosts agreed on where they did (`with_exit_status`)."""
  agreed = getattr(error, _AGREED_STATUS, None)
  if agreed is not None:
    return agreed
  if isinstance(error, RestartableError) or storage_unreachable(error) is not None:
    return RESTART_EXIT_CODE
  return USAGE_EXIT_CODE if one_line(error) is not None else None


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
  unreachable = storage_unreachable(error)
  if unreachable is not None:
    return (f"a service the run needs did not answer ({type(unreachable).__name__}: "
            f"{' '.join(str(unreachable).split())[:300]}); what was finished is kept: the same "
            "command resumes once it answers (a supervisor restarts it on exit status 42)")
  full = storage_full(error)
  if full is not None:
    path = os.fspath(getattr(full, "filename", None) or "a file")
    return str(storage_full_error(path, full, "what was finished before is kept"))
  if (isinstance(error, OSError) and error.errno in _FILE_ERRNOS
      and getattr(error, "filename", None)):
    return f"{error.filename}: {error.strerror}"
  return None
