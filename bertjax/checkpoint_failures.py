"""How a checkpoint's storage fails: which errors are the storage's, and the
noise a failure leaves behind.

A save's error is either the storage failing (a rerun resumes from the newest
finished step) or a bug (raised as it is); a read's error either says nothing
about the step's files (a busy store, missing rights: raised as it is) or that
they are damaged. After a failure, orbax and tensorstore print tracebacks that
say again, many times over, what the one raised error says: those are dropped.
"""

from __future__ import annotations

import logging
import sys

from absl import logging as absl_logging

from bertjax import errors


def first_line(error: BaseException, limit: int = 300) -> str:
  """The first line of an error's text (its type's name when it has none)."""
  text = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return text if len(text) <= limit else text[:limit] + "..."


# Storage errors that say nothing about the checkpoint's files (a busy or
# unreachable store, missing rights, memory): raised as they are, never taken
# for damage, so a step that is fine is never set aside for them.
_NOT_DAMAGE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "PERMISSION_DENIED", "UNAUTHENTICATED",
               "RESOURCE_EXHAUSTED", "CANCELLED", "Too Many Requests", "Service Unavailable",
               "Forbidden")


# A save's failure is the storage's (worded as a `CheckpointSaveError`: which
# step, where a rerun resumes) when it, or an error it was raised from, is an
# OSError (gcsfs' FileNotFoundError, refused connections, a full disk), comes
# from a storage client library, or carries one of these texts (tensorstore's
# ValueErrors carry a status code; orbax names a directory that went away).
# Anything else is a bug, raised as it is with its traceback: a rerun would
# only fail the same way.
_STORAGE_TEXTS = (*_NOT_DAMAGE, "NOT_FOUND", "ABORTED", "DATA_LOSS", "FAILED_PRECONDITION",
                  "does not exist", "No such file")
# tensorstore's catch-all codes (an HTTP status it does not map, a broken
# connection) count when the text is a storage request's; elsewhere (XLA's
# INTERNAL, a bad argument) they are bugs.
_REQUEST_CODES = ("UNKNOWN", "INTERNAL", "INVALID_ARGUMENT")
_REQUEST_MARKS = ("tensorstore", "HTTP", "http://", "https://", "gs://")
_STORAGE_LIBRARIES = ("aiohttp", "gcsfs", "fsspec", "google", "requests", "urllib3")
_BUGS = (TypeError, AttributeError, KeyError, IndexError, NameError, AssertionError,
         NotImplementedError)


def storage_failure(error: BaseException) -> bool:
  """Whether a save's `error` is the storage failing rather than a bug."""
  if errors.write_failure(error) is not None:  # a full disk, a file-size limit, ...
    return True
  seen = set()
  while error is not None and id(error) not in seen:  # `raise ... from` chains
    seen.add(id(error))
    if isinstance(error, _BUGS):
      return False
    text = str(error)
    if (isinstance(error, OSError)
        or type(error).__module__.split(".")[0] in _STORAGE_LIBRARIES
        or any(mark in text for mark in _STORAGE_TEXTS)
        or (any(code in text for code in _REQUEST_CODES)
            and any(mark in text for mark in _REQUEST_MARKS))):
      return True
    error = error.__cause__
  return False


def says_nothing_of_files(error: BaseException) -> bool:
  """Whether an error from reading a step is the storage's (busy, unreachable,
  no rights, no memory) rather than a sign that the step's files are damaged."""
  return isinstance(error, (PermissionError, MemoryError, ConnectionError, TimeoutError)) or any(
      marker in str(error) for marker in _NOT_DAMAGE)


def quiet_closed_event_loop() -> None:
  """Drops the hundreds of `RuntimeError: Event loop is closed` tracebacks that
  tensorstore's callbacks print when orbax's event loop closes on a failed read
  (a damaged checkpoint), so that the one error that matters is seen. Installed
  once per process; every other exception is reported as before."""
  if getattr(sys.excepthook, "_bertjax_quiet", False):
    return
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

  def closed(value: BaseException | None) -> bool:
    return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"

  def quiet_excepthook(kind, value, traceback):
    if not closed(value):
      excepthook(kind, value, traceback)

  def quiet_unraisablehook(unraisable):
    if not closed(unraisable.exc_value):
      unraisablehook(unraisable)

  quiet_excepthook._bertjax_quiet = True
  sys.excepthook, sys.unraisablehook = quiet_excepthook, quiet_unraisablehook


# What the text of a failed orbax task or tensorstore write contains.
_CHECKPOINT_IO = ("/orbax/", "tensorstore_spec", "orbax-checkpoint-tmp", "OCDBT")


class UnretrievedSaveErrors(logging.Filter):
  """Drops asyncio's notes, at exit, of orbax tasks and tensorstore writes
  whose failure was never retrieved: a failed save leaves several, each with a
  traceback. Installed once a `CheckpointSaveError` has said what failed (until
  then such a note may be the only trace of a failed write); `--verbosity=1`
  keeps them."""

  def filter(self, record: logging.LogRecord) -> bool:
    if absl_logging.get_verbosity() > absl_logging.INFO:
      return True
    return not ("never retrieved" in str(record.msg)
                and any(mark in record.getMessage() for mark in _CHECKPOINT_IO))


def quiet_unretrieved_save_errors() -> None:
  """Installs `UnretrievedSaveErrors` on asyncio's logger (once)."""
  logger = logging.getLogger("asyncio")
  if not any(isinstance(f, UnretrievedSaveErrors) for f in logger.filters):
    logger.addFilter(UnretrievedSaveErrors())
