"""Agreement between the processes of a multi-host run.

A step that may fail on some hosts only (building data on host 0, restoring a
checkpoint, reading each host's shards) must fail on every host: a host left
waiting in a barrier or a collective for one that raised hangs the job with no
error. `agree` shares every host's outcome and raises on all of them.
"""

from __future__ import annotations

import jax
import numpy as np

from bertjax import errors

_MESSAGE_BYTES = 1024  # of the first failure's message, shared with the other hosts


class OtherHostError(errors.Error, ValueError):
  """Raised on the hosts that did not fail, naming the one that did and why."""


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


def agree(error: BaseException | None, what: str) -> None:
  """Raises on every process when `what` failed on any of them.

  Every process must call this, with its own outcome: `error` is the exception
  it caught (re-raised here) or None. A process that succeeded raises
  `OtherHostError` with the first failing process's message.
  """
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    message = np.zeros(_MESSAGE_BYTES, np.uint8)
    if error is not None:
      encoded = str(error).encode("utf-8", "replace")[:_MESSAGE_BYTES]
      message[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    outcome = {"failed": np.array([error is not None], np.int32), "message": message}
    gathered = multihost_utils.process_allgather(outcome)
    failed = np.flatnonzero(np.asarray(gathered["failed"]).reshape(-1))
    if error is None and failed.size:
      first = int(failed[0])
      text = bytes(np.asarray(gathered["message"])[first]).rstrip(b"\0").decode("utf-8",
                                                                                "replace")
      raise OtherHostError(f"{what} failed on process {first} of {jax.process_count()}: {text}")
  if error is not None:
    raise error
