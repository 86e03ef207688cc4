"""What a pre-training run does when asked to stop: whether its step is saved,
and how it ends unsaved.

A Ctrl-C (or a closed terminal) always saves. A SIGTERM (a preemption) saves
when the measured saves fit in the grace left, else the run ends at once,
naming the step a restart resumes from. Every host decides alike.
"""

from __future__ import annotations

import time
from typing import NoReturn

from absl import logging
import jax

from bertjax import checkpoint, hosts, preemption, signals

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: "stopped, resume me"
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: stopped by Ctrl-C, after saving
HANGUP_EXIT_CODE = 129  # 128 + SIGHUP: the terminal closed, after saving


def save_on_stop(stop: signals.StopRequests, clock: preemption.SaveClock,
                 checkpointer: checkpoint.Checkpointer, step: int) -> bool:
  """Whether to save on a stop request: always on Ctrl-C (on any host); on
  SIGTERM, when the measured saves (after one still in flight) fit in the
  grace left, by process 0's clock. Where they do not, a save in flight that
  can still finish is waited for. Every host calls this at the same step."""
  if hosts.worst(int(stop.interrupted)):
    return True
  # The grace runs from the first host's signal (each host notes when its own
  # landed; one whose signal has not, or which has none, counts from now).
  since_ms = hosts.worst(int(1000 * (time.monotonic() - (stop.signalled or time.monotonic()))))
  signalled = time.monotonic() - since_ms / 1000
  needed = clock.save_seconds()
  in_flight = bool(hosts.worst(int(checkpointer.saving())))  # the same branch on all
  left_in_flight = clock.in_flight_left() if in_flight else 0.0
  if in_flight and needed is None:
    save = False  # the first save is still being written: no time measured for another
  else:
    save = preemption.fits_in_grace(
        None if needed is None else needed + left_in_flight, signalled, preemption.GRACE_S)
  if not save and jax.process_index() == 0:
    logging.warning(
        "SIGTERM at step %d: %s (--grace_seconds=%g): not saving", step,
        "the run's first save is still being written" if needed is None else
        f"a save takes about {needed:.0f} s, more than the "
        f"{preemption.GRACE_S - (time.monotonic() - signalled):.0f} s grace leaves",
        preemption.GRACE_S)
  save = bool(hosts.from_process_0(int(save)))
  if not save and in_flight:
    # The save in flight may still finish: wait for it while the grace allows.
    wait_s = preemption.GRACE_S - preemption.EXIT_MARGIN_S - (time.monotonic() - signalled)
    deadline = time.monotonic() + hosts.from_process_0(int(max(wait_s, 0)))
    while checkpointer.saving() and time.monotonic() < deadline:
      time.sleep(0.05)
    if not checkpointer.saving():
      clock.done()
  return save


def exit_unsaved(checkpointer: checkpoint.Checkpointer, clock: preemption.SaveClock, step: int,
                 saving: int | None) -> NoReturn:
  """Ends the run at once, saying from where a restart resumes (what is
  committed on the storage once no save can commit any more)."""
  in_flight = checkpointer.saving()
  finished, caveat = checkpointer.abandon(timeout=preemption.EXIT_MARGIN_S / 2)
  start = clock.start_of(finished[-1]) if finished else None
  if start is not None:
    ago = time.monotonic() - start
    back = (f"step {finished[-1]}, {step - finished[-1]} steps back, whose save started "
            f"{ago:.0f} s before this stop")
  elif finished:
    back = f"step {finished[-1]}, {step - finished[-1]} steps back (saved by an earlier run)"
  else:
    back = "step 0: nothing is saved yet"
  logging.warning("Preempted at step %d without saving: a restart resumes from %s%s%s",
                  step, back, f" ({caveat})" if caveat else "",
                  "; the save still being written is abandoned"
                  if in_flight and saving not in finished else "")
  raise preemption.ExitAtOnce(PREEMPTED_EXIT_CODE)
