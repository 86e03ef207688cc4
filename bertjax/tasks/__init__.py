"""What `python -m bertjax.main` runs, by `config.task`."""

from __future__ import annotations

from typing import Any

# config.task -> the module of bertjax.tasks whose `run(config, workdir)` does it.
TASKS = {"pretrain": "pretrain", "glue": "glue", "squad": "squad", "swag": "swag",
         "ner": "ner", "ner_features": "features"}


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
  notebook's relative paths too), the workdir is checked (not another task's
  run, not the checkpoint the run starts from) and then locked
  (`bertjax.workdir_lock`, once per run: by process 0, every process learning
  the outcome) before anything is written.

  Returns:
    What the task's `run` returns (its metrics).
  """
  import contextlib

  import jax

  from bertjax import files, hosts, paths, runs, workdir_lock

  module = task_module(config.task)
  paths.resolve_config(config)
  workdir = paths.resolve(workdir)
  runs.check_workdir(config, workdir)
  with contextlib.ExitStack() as stack:
    error = None
    if jax.process_index() == 0:
      try:
        stack.enter_context(workdir_lock.hold(workdir))
        files.remove_stale_staging(workdir)  # of an earlier run that was killed
      except Exception as e:  # every process stops with it
        error = e
    hosts.agree(error, f"locking the workdir {workdir}")
    return module.run(config, workdir)
