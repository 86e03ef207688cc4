"""What `python -m bertjax.main` runs, by `config.task`."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

# config.task -> the module of bertjax.tasks whose `run(config, workdir)` does it.
TASKS = {"pretrain": "pretrain", "glue": "glue", "squad": "squad", "swag": "swag",
         "ner": "ner", "ner_features": "features"}


def interrupted(name: str) -> str:
  """What a run of `config.task == name` stopped by Ctrl-C, SIGTERM or SIGHUP
  leaves, said after "interrupted (Ctrl-C): "."""
  if name == "pretrain":
    return "finished checkpoints and data are kept: rerun the same command to resume"
  return "the fine-tuning keeps no checkpoint: rerun the same command to run it again"


def task_module(name: str):
  """The module that runs `config.task == name`."""
  import importlib

  from bertjax import errors

  if name not in TASKS:
    raise errors.UsageError(f"Unknown config.task {name!r}; known: {', '.join(TASKS)}")
  return importlib.import_module(f"bertjax.tasks.{TASKS[name]}")


def run(config: Any, workdir: str) -> Any:
  """Runs `config.task` in `workdir`, which must be this run's alone.

  The config's paths and the workdir are resolved (`bertjax.paths`: a
  notebook's relative paths too), its numbers are checked against their
  ranges (`bertjax.config_ranges`: a config built in Python too), its
  trackers against what is installed (`bertjax.trackers`) and a pre-training
  schedule against the run's length (`bertjax.schedule_fit`), the workdir is
  checked (not another task's run, not the checkpoint the run starts from)
  and then locked (`bertjax.workdir_lock`, once per run: by process 0, every
  process learning the outcome) before anything is written; a workdir the run
  made and left empty when it fails is removed. Storage that does not answer
  is waited for (`bertjax.outage`) before the run gives up, restartably.

  Returns:
    What the task's `run` returns (its metrics).
  """
  import contextlib

  from bertjax import usage

  jax = usage.import_held("jax")  # (a signal inside its start can crash Python)
  from bertjax import (config_ranges, files, hosts, paths, runs, schedule_fit, trackers,
                       workdir_lock)

  module = task_module(config.task)
  paths.resolve_config(config)
  config_ranges.check(config)
  trackers.check(config)  # W&B asked for: its client is there
  schedule_fit.check(config)
  workdir = paths.resolve(workdir)
  _waiting_out_outages(lambda: files.check_directory(workdir, "--workdir"), workdir)
  _waiting_out_outages(lambda: runs.check_workdir(config, workdir), workdir)
  with contextlib.ExitStack() as stack:
    error = None
    if jax.process_index() == 0:
      try:
        # A run refused once the workdir is made leaves no empty one behind:
        # the folders inside it go while the lock is held (they are this run's).
        stack.enter_context(files.removed_if_left_empty(workdir))
        stack.enter_context(workdir_lock.hold(workdir))
        stack.enter_context(files.empty_folders_removed(workdir))
        files.remove_stale_staging(workdir)  # of an earlier run that was killed
      except Exception as e:  # every process stops with it
        error = e
    hosts.agree(error, f"locking the workdir {workdir}")
    return module.run(config, workdir)


def _waiting_out_outages(fn: Callable[[], Any], workdir: str) -> Any:
  """`fn()`, tried again while `workdir`'s storage does not answer (waiting
  for it with `bertjax.outage`, which gives up restartably)."""
  from bertjax import errors, files, outage

  failed_since = None
  while True:
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      if errors.storage_unreachable(e) is None:
        raise
      failed_since = failed_since or time.monotonic()
      outage.wait_until_reachable(workdir, lambda: files.exists(workdir), e,
                                  "from the workdir's newest checkpoint", failed_since)
