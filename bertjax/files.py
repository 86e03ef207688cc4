"""Reading JSON with clear errors, and writing directories atomically."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator


def is_remote(path: str) -> bool:
  return "://" in os.fspath(path)


def exists(path: str) -> bool:
  """Whether a file exists, locally or at a `gs://`-style URL (through etils.epath)."""
  if is_remote(path):
    from etils import epath
    return epath.Path(path).exists()
  return os.path.exists(path)


def write_text(path: str, text: str) -> None:
  """Writes a whole file, locally (atomically) or at a URL."""
  if is_remote(path):
    from etils import epath
    epath.Path(path).write_text(text)
    return
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def read_json(path: str) -> dict[str, Any]:
  """A JSON object from `path` (local or a URL); errors name the file."""
  try:
    if is_remote(path):
      from etils import epath
      if not epath.Path(path).exists():
        raise FileNotFoundError(path)
      data = json.loads(epath.Path(path).read_text())
    else:
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
  except FileNotFoundError:
    raise FileNotFoundError(f"{path} not found") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(data, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def write_json(path: str, data: dict[str, Any]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=2, ensure_ascii=False)
    f.write("\n")


@contextlib.contextmanager
def atomic_directory(out_dir: str, overwrite: bool = False) -> Iterator[str]:
  """Yields a temporary directory that becomes `out_dir` only if the block succeeds.

  The temporary directory is a sibling of `out_dir` (same file system, so the
  final rename is atomic). On any error it is removed and `out_dir` is left as
  it was. An existing `out_dir` is an error unless `overwrite`, in which case it
  is replaced only after the new one is complete.
  """
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and not overwrite:
    raise FileExistsError(f"{out_dir} already exists; choose a new directory or "
                          "pass overwrite=True")
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
  try:
    yield staging
    # mkdtemp makes a private (0700) directory; give it the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)
    if not os.path.exists(out_dir):
      os.rename(staging, out_dir)
      return
    retired = staging + ".old"
    os.rename(out_dir, retired)
    try:
      os.rename(staging, out_dir)
    except BaseException:
      os.rename(retired, out_dir)
      raise
    shutil.rmtree(retired)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def save_config(config: Any, workdir: str) -> None:
  """Writes a run's resolved config to `<workdir>/config.json` (process 0 only)."""
  import jax

  if jax.process_index() != 0:
    return
  if not is_remote(workdir):
    os.makedirs(workdir, exist_ok=True)
  write_text(os.path.join(workdir, "config.json"),
             json.dumps(config.to_dict(), indent=2, default=str))
