"""A run's working directory: whose it is, and the resolved config it keeps.

`<workdir>/config.json` says what a workdir holds: `load_pretrained(workdir)`
reads the model from it, and a rerun is checked against it. A run therefore
refuses a workdir that holds another task's run (or the checkpoint it starts
from) before it writes anything, and writes its config only once its settings
are checked and its checkpoint restored, so a refused rerun leaves the file as
it was.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax

from bertjax import files

CONFIG_FILE = "config.json"


def _same_place(a: str, b: str) -> bool:
  if files.is_remote(a) or files.is_remote(b):
    return a.rstrip("/") == b.rstrip("/")
  return os.path.realpath(a) == os.path.realpath(b)


def _kind(config: dict[str, Any]) -> str:
  """'pretrain', 'glue mrpc', 'squad v2.0': what a run is, for telling runs apart."""
  data = config.get("data") or {}
  detail = [str(data[name]) for name in ("task", "version") if data.get(name)]
  return " ".join([str(config.get("task")), *detail])


def check_workdir(config: Any, workdir: str) -> None:
  """Refuses a workdir that belongs to something else, before anything is written.

  Raises:
    ValueError: the workdir is the checkpoint fine-tuning starts from, or holds
      a run of another task (its `config.json` says which).
  """
  init = config.get("init_checkpoint") if hasattr(config, "get") else None
  if init and _same_place(init, workdir):
    raise ValueError(f"--workdir={workdir} is config.init_checkpoint: the run would write "
                     "over the model it starts from; give another --workdir")
  path = files.join(workdir, CONFIG_FILE)
  if not files.isfile(path):
    return
  try:
    saved = json.loads(files.read_text(path))
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not a run's config ({e}); give another --workdir, or "
                     "delete the file if the directory is yours to reuse") from None
  ours, theirs = _kind(config.to_dict()), _kind(saved if isinstance(saved, dict) else {})
  if ours != theirs:
    raise ValueError(f"--workdir={workdir} holds a {theirs!r} run ({path}); this is a "
                     f"{ours!r} run: give another --workdir")


def save_config(config: Any, workdir: str) -> None:
  """Writes a run's resolved config to `<workdir>/config.json` (process 0 only),
  atomically: readers see the old file or the new one."""
  if jax.process_index() != 0:
    return
  files.makedirs(workdir)
  files.write_text(files.join(workdir, CONFIG_FILE),
                   json.dumps(config.to_dict(), indent=2, default=str))
