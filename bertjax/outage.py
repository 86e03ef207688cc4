"""Waiting out a storage outage before giving up, restartably.

Cloud Storage clients retry a failed request for about half a minute (gcsfs
six times, tensorstore its own); an outage longer than that would end a run
whose next minute would have been fine. Where a run meets storage that does
not answer (taking the workdir's lock, saving a checkpoint), it waits for it
here: it asks again with growing pauses, for up to `WAIT_S` seconds in all
(`python -m bertjax.main --storage_wait_s`), then gives up with
`errors.StorageUnreachableError`, whose exit status 42 a supervisor restarts
on (`bertjax.errors`). Storage that answers with a refusal (missing rights, a
bucket that is gone, a full disk) is not waited for: that needs a person.
"""

from __future__ import annotations

import time
from typing import Callable

from absl import logging

from bertjax import errors

WAIT_S = 900.0  # how long a run waits for storage that does not answer
FIRST_PAUSE_S = 2.0
LONGEST_PAUSE_S = 60.0


def wait_until_reachable(where: str, probe: Callable[[], object], failure: BaseException,
                         resumes: str, started: float | None = None) -> float:
  """Waits until `probe()` returns without a storage-unreachable error.

  Args:
    where: The path or URL waited for (named in the log and the error).
    probe: A cheap request to that storage (reading a small object, listing a
      directory); any return value counts as an answer.
    failure: The error that showed the storage unreachable.
    resumes: Where a restart resumes, said if the wait gives up
      ("from step 40").
    started: When the storage first failed to answer (`time.monotonic()`);
      now by default. The wait ends `WAIT_S` seconds after it.

  Returns:
    The seconds waited.

  Raises:
    StorageUnreachableError: it did not answer within `WAIT_S` seconds.
    Exception: what `probe` raised, when that is not the storage being
      unreachable (a refusal: it is the caller's to word).
  """
  started = time.monotonic() if started is None else started
  deadline = started + WAIT_S
  pause = FIRST_PAUSE_S
  logging.warning("%s does not answer (%s); waiting up to %.0f s for it (--storage_wait_s)",
                  where, _first_line(failure), WAIT_S)
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      raise errors.StorageUnreachableError(
          f"{where} did not answer for {time.monotonic() - started:.0f} s "
          f"({_first_line(failure)}); what was finished is kept: a restart resumes {resumes} "
          "once it answers (exit status 42: xpk and launch/run.sh --restarts restart on it; "
          "--storage_wait_s waits longer)") from failure
    time.sleep(min(pause, left))
    pause = min(2 * pause, LONGEST_PAUSE_S)
    try:
      probe()
    except Exception as e:  # pylint: disable=broad-except
      if errors.storage_unreachable(e) is None:
        raise
      failure = e
      continue
    waited = time.monotonic() - started
    logging.warning("%s answers again after %.0f s: going on", where, waited)
    return waited


def _first_line(error: BaseException) -> str:
  text = " ".join(str(error).split()) or type(error).__name__
  return f"{type(error).__name__}: {text[:200]}"
