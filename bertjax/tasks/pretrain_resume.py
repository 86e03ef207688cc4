"""Where a pre-training run resumes: the newest checkpoint that reads back on
every host. Newer steps that do not (damaged files, on any host) are set
aside in `<workdir>/checkpoints_damaged`, as the steps saved with weights out
of range are in `<workdir>/checkpoints_diverged`, so that a rerun resumes
before them and nothing is deleted."""

from __future__ import annotations

from typing import Any

from absl import logging
import jax

from bertjax import checkpoint, files, hosts


def set_aside(checkpointer: checkpoint.Checkpointer, steps: list[int], aside: str,
              what: str) -> None:
  """Moves the checkpoints of `steps` into the directory `aside` (by process 0,
  every host stopping if that fails: none waits for it)."""
  error = None
  if jax.process_index() == 0:
    try:
      checkpointer.move_aside(steps, aside)
    except Exception as e:  # pylint: disable=broad-except  # every host stops with it
      error = e
  hosts.agree(error, f"moving {what} checkpoints to {aside}")


def restore_newest(checkpointer: checkpoint.Checkpointer, target: Any,
                   workdir: str) -> tuple[Any, dict[str, Any] | None] | None:
  """(state, this host's data position) of the newest step that reads back on
  every host; None when there is no checkpoint.

  Raises:
    DamagedCheckpointError: no step reads back.
    CheckpointMismatchError: a checkpoint of another model.
  """
  steps = checkpointer.all_steps()
  if not steps:
    return None
  damaged: list[tuple[int, str]] = []
  for step in reversed(steps):
    error = None
    try:
      state, data, _ = checkpointer.restore(step, target)
    except Exception as e:  # pylint: disable=broad-except  # every host learns it
      error = e
    # A failure other than damage on any host (storage that did not answer, a
    # bug) ends every host alike, with its status; the hosts that found damage
    # too do not go on to an older step without the others.
    other = error is not None and not isinstance(error, checkpoint.DamagedCheckpointError)
    if hosts.worst(int(other)):
      hosts.agree(error if other else None, f"restoring step {step}")
    try:
      hosts.agree(error, f"restoring step {step}")  # damage may be one host's files
    except (checkpoint.DamagedCheckpointError, hosts.OtherHostError) as e:
      damaged.append((step, str(e)))
      continue
    if damaged:
      _set_aside_damaged(checkpointer, damaged, step, workdir)
    logging.info("Resumed from %s at step %d", checkpointer.directory, step)
    return state, data
  raise checkpoint.DamagedCheckpointError(
      f"no step of {checkpointer.directory} reads back ("
      + "; ".join(message for _, message in damaged) + "); move them away or give another "
      "--workdir to start over")


def _set_aside_damaged(checkpointer: checkpoint.Checkpointer, damaged: list[tuple[int, str]],
                       resumed: int, workdir: str) -> None:
  aside = files.join(workdir, "checkpoints_damaged")
  set_aside(checkpointer, [step for step, _ in damaged], aside, "damaged")
  checkpointer.reload()
  for step, message in damaged:
    logging.warning("DAMAGED CHECKPOINT: step %d cannot be restored (%s); moved to %s/%d",
                    step, message, aside, step)
  logging.warning("Resuming from step %d, the newest checkpoint that reads back: the steps "
                  "after it run again", resumed)
