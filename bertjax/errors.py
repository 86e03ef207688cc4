"""The errors bertjax words for its users, and how they are told from bugs.

Every error bertjax raises on purpose is an `Error`: a setting to change, a
file that is missing, damaged or of another dataset, storage that is full or
failed, a workdir another run holds, a run that diverged. Its message names
the key, file or value and what to do, and every command prints it as one
line (`bertjax.usage`). The kinds keep the standard base a caller would catch
(`ValueError`, `FileNotFoundError`, `OSError`, ...).

Two failures of the machine's surroundings are worded wherever they come
from, since no code of bertjax's is at fault: a write that the storage or the
system refused (`write_failure`: a full disk or exhausted quota, a file-size
limit or a file system's largest file, a read-only file system, an
input/output error, a stale network file handle; its `errno` anywhere in an
error's chain, or its text from a library that does not raise `OSError`), and
an operating system error about a named file (missing, not permitted, a
directory). Anything else is a bug, and keeps its traceback.

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


class StorageWriteError(StorageError):
  """A write the storage or the system refused (`write_failure`): the message
  names the path, the cause, what to do and what the failed write left."""


class StorageFullError(StorageWriteError):
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
# The operating system's errors of a write that the machine's surroundings
# cause (its disks, mounts and limits), never bertjax's code. The first four
# only a write meets; an input/output error or a stale handle can be a read's,
# so outside a write (`writing`) they are worded only where they name a file.
_WRITE_ONLY_ERRNOS = _FULL_ERRNOS | {errno.EFBIG, errno.EROFS}
_WRITE_ERRNOS = _WRITE_ONLY_ERRNOS | {errno.EIO, errno.ESTALE}
# How libraries that do not raise OSError (tensorstore, array_record's
# "write() failed: File too large; ...", orbax's wrappers) word the same errors.
_WRITE_TEXTS = {"No space left on device": errno.ENOSPC, "ENOSPC": errno.ENOSPC,
                "Disk quota exceeded": errno.EDQUOT, "EDQUOT": errno.EDQUOT,
                "File too large": errno.EFBIG, "Read-only file system": errno.EROFS,
                "Input/output error": errno.EIO, "Stale file handle": errno.ESTALE}


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
    if isinstance(link, StorageFullError) or _write_errno(link) in _FULL_ERRNOS:
      return link
  return None


def _write_errno(link: BaseException) -> int | None:
  """The `_WRITE_ERRNOS` code one error of a chain says, by its errno or text."""
  if isinstance(link, OSError) and link.errno in _WRITE_ERRNOS:
    return link.errno
  text = str(link)
  return next((code for words, code in _WRITE_TEXTS.items() if words in text), None)


def write_failure(error: BaseException) -> BaseException | None:
  """The error of `error`'s chain that says the storage or the system refused
  a write (`_WRITE_ERRNOS`: a full disk first), if any."""
  full = storage_full(error)
  if full is not None:
    return full
  for link in _chain(error):
    if isinstance(link, StorageWriteError) or _write_errno(link) is not None:
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
  return storage_write_error(path, storage_full(error) or error, kept)


def _failed_path(path: str, failure: BaseException) -> str:
  """`path`, or the file `failure` names when that lies elsewhere (another disk)."""
  failed = getattr(failure, "filename", None)
  if failed and not os.path.abspath(os.fspath(failed)).startswith(
      os.path.abspath(path) if "://" not in path else path):
    return os.fspath(failed)
  return path


def _file_size_limit() -> int | None:
  """This process's file-size limit in bytes (`ulimit -f`), None if unlimited."""
  try:
    import resource  # (POSIX only)

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
  except (ImportError, OSError, ValueError):
    return None
  return None if limit == resource.RLIM_INFINITY else limit


def write_problem(path: str, error: BaseException, smaller: str = "") -> tuple[str, str]:
  """(what happened, what to do) for a write to `path` whose `error` chain
  holds a `write_failure`: "the file system is read-only", "write elsewhere,
  or remount it writable".

  Args:
    smaller: What makes the files smaller, for a file-size limit ("more
      --num_shards makes smaller shards").
  """
  failure = write_failure(error) or error
  code = _write_errno(failure)
  if isinstance(failure, StorageFullError) or code in _FULL_ERRNOS:
    what = full_disk(path, failure)
    return what, ("free space there (or raise the quota)" if "quota" in what
                  else "free space on that disk") + " or write elsewhere"
  if code == errno.EFBIG:
    limit = _file_size_limit()
    if limit is not None:
      what = f"a file reached this process's file-size limit ({_size(limit)}, ulimit -f)"
      advice = "raise the limit (ulimit -f unlimited)"
    else:
      what = "a file reached the largest size its file system takes"
      advice = "write to a file system that takes larger files (ext4, xfs)"
    return what, advice + (f", or {smaller}" if smaller else "")
  if code == errno.EROFS:
    return "the file system is read-only", "write elsewhere, or remount it writable"
  if code == errno.ESTALE:
    return ("the network file system's handle went stale (what was written was replaced on "
            "its server)", "remount it or write elsewhere")
  return ("the storage reported an input/output error (a failing disk, or a network or FUSE "
          "mount such as NFS or gcsfuse that lost its server)",
          "check that disk or mount (the system log: dmesg) or write elsewhere")


def storage_write_error(path: str, error: BaseException, kept: str,
                        smaller: str = "") -> StorageWriteError:
  """The one-line error of a write to `path` that the storage or the system
  refused (`write_failure`): a `StorageFullError` for a full disk or quota.

  Args:
    path: What was being written (the failed file itself is named instead
      when the error names one elsewhere).
    error: The error of the write (its chain holds the failure).
    kept: What the failed write left as it was, or finished.
    smaller: What makes the files smaller, for a file-size limit.
  """
  failure = write_failure(error) or error
  full = isinstance(failure, StorageFullError) or _write_errno(failure) in _FULL_ERRNOS
  path = _failed_path(path, failure)
  what, advice = write_problem(path, failure, smaller)
  return (StorageFullError if full else StorageWriteError)(
      f"writing {path} failed: {what}; {advice}, then rerun the same command; {kept}")


@contextlib.contextmanager
def writing(path: str, kept: str, smaller: str = "") -> Iterator[None]:
  """Turns a write the storage or the system refused inside the block (a full
  disk, a file-size limit, ...: `write_failure`) into `StorageWriteError`
  naming `path` (see `storage_write_error`); other errors pass as they are.

  Args:
    smaller: What makes the files smaller, said for a file-size limit.
  """
  try:
    yield
  except StorageWriteError:
    raise
  except Exception as error:  # pylint: disable=broad-except
    if write_failure(error) is None:
      raise
    raise storage_write_error(path, error, kept, smaller) from error


def one_line(error: BaseException) -> str | None:
  """The line a command prints for `error`, or None for a bug (a traceback).

  An `Error` says its message; a refused write anywhere in the chain (a
  full disk, a file-size limit, ...) says which path, why and what to do; the
  operating system's error about a named file says the file and the reason.
  """
  if isinstance(error, Error):
    return str(error)
  unreachable = storage_unreachable(error)
  if unreachable is not None:
    return (f"a service the run needs did not answer ({type(unreachable).__name__}: "
            f"{' '.join(str(unreachable).split())[:300]}); what was finished is kept: the same "
            "command resumes once it answers (a supervisor restarts it on exit status 42)")
  failure = write_failure(error)
  named = getattr(failure, "filename", None)
  if failure is not None and (isinstance(failure, StorageWriteError)
                              or _write_errno(failure) in _WRITE_ONLY_ERRNOS):
    return str(storage_write_error(os.fspath(named or "a file"), failure,
                                   "what was finished before is kept"))
  if failure is not None and named:  # an input/output error, a stale handle: a read's too
    what, advice = write_problem(os.fspath(named), failure)
    return f"{os.fspath(named)}: {what}; {advice}, then rerun the same command"
  if (isinstance(error, OSError) and error.errno in _FILE_ERRNOS
      and getattr(error, "filename", None)):
    return f"{error.filename}: {error.strerror}"
  return None
