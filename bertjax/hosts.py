"""Agreement between the processes of a multi-host run.

A step that may fail on some hosts only (building data on host 0, restoring a
checkpoint, reading each host's shards) must fail on every host: a host left
waiting in a barrier or a collective for one that raised hangs the job with no
error. `agree` shares every host's outcome and raises on all of them, each
host ending its command with the same exit status (`errors.exit_status`): the
class of a failure is shared as data, never read back from its message, since
a supervisor acts on every host's status (any host's 2 ends a JobSet).
"""

from __future__ import annotations

import jax
import numpy as np

from bertjax import errors

_MESSAGE_BYTES = 1024  # of a failure's message, shared with the other hosts
_KIND_BYTES = 64  # of its class name


class OtherHostError(errors.Error, ValueError):
  """Raised on the hosts that did not fail, naming the one that did and why;
  it ends the command with that host's exit status.

  Attributes:
    kind: The class name of the failing host's error (`DamagedCheckpointError`).
  """

  def __init__(self, message: str, kind: str, status: int):
    super().__init__(message)
    self.kind = kind
    errors.with_exit_status(self, status)


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (no-op on one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def from_process_0(value: int) -> int:
  """Process 0's `value` on every process (a decision only one clock makes)."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils

  return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def worst(value: int) -> int:
  """The largest of every process's `value` (an outcome: 0 fine, more worse)."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils

  return int(np.max(multihost_utils.process_allgather(np.int32(value))))


# The exit statuses a failure can end with, the one that wins first: a bug
# or a setting to mend on any host ends every host for good (a restart would
# meet it again there); only where every failure is restartable do all restart.
_PRECEDENCE = (1, errors.USAGE_EXIT_CODE, errors.RESTART_EXIT_CODE)


def _status(error: BaseException) -> int:
  """The exit status `error` alone would end its command with (1: a bug)."""
  status = errors.exit_status(error)
  return 1 if status is None else status


def _text(values: np.ndarray) -> str:
  return bytes(np.asarray(values, np.uint8)).rstrip(b"\0").decode("utf-8", "replace")


def _encoded(text: str, size: int) -> np.ndarray:
  encoded = np.zeros(size, np.uint8)
  data = text.encode("utf-8", "replace")[:size]
  encoded[:len(data)] = np.frombuffer(data, np.uint8)
  return encoded


def agree(error: BaseException | None, what: str) -> None:
  """Raises on every process when `what` failed on any of them.

  Every process must call this, with its own outcome: `error` is the exception
  it caught (re-raised here) or None. A process that succeeded raises
  `OtherHostError` with the failing process's message. Every process ends
  with one exit status: that of the failure that comes first in
  `_PRECEDENCE` (of the lowest-numbered process among equals), the failing
  processes' own errors included (`errors.with_exit_status`).
  """
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    status = 0 if error is None else _status(error)
    message = "" if error is None else (errors.one_line(error) or
                                        f"{type(error).__name__}: {error}")
    outcome = {"status": np.array([status], np.int32),
               "kind": _encoded("" if error is None else type(error).__name__, _KIND_BYTES),
               "message": _encoded(message, _MESSAGE_BYTES)}
    gathered = multihost_utils.process_allgather(outcome)
    statuses = np.asarray(gathered["status"]).reshape(-1)
    failed = [(_PRECEDENCE.index(int(s)) if int(s) in _PRECEDENCE else -1, process)
              for process, s in enumerate(statuses) if s]
    if failed:
      first = min(failed)[1]  # whose failure decides the status
      agreed = int(statuses[first])
      if error is not None:
        raise errors.with_exit_status(error, agreed)
      raise OtherHostError(
          f"{what} failed on process {first} of {jax.process_count()}: "
          f"{_text(gathered['message'][first])}", _text(gathered["kind"][first]), agreed)
  if error is not None:
    raise error
