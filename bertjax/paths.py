"""Paths as the user typed them, resolved once, where they enter.

A local path is made absolute against the directory the command started in
(`~` expanded), so that nothing deeper depends on the working directory (orbax
refuses relative paths; a relative path read again from another directory
names another file). A URL (`gs://bucket/...`) is kept as it is, and so are
the names that are not paths: a Hugging Face Hub id (`org/name`, when no such
local path exists) and the corpus sources `demo:stdlib` and `tfds:NAME`.

Every command's path flags are defined here (`DEFINE_path`, resolved as absl
parses them), and a config's path fields are resolved by `resolve_config` as
soon as the config is loaded (`bertjax.usage.parse_flags`). Functions of the
library that take a path (`bertjax.load_pretrained`) resolve it the same way.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable

from absl import flags


def is_remote(path: str) -> bool:
  return "://" in os.fspath(path)


def resolve(path: str | None) -> str | None:
  """A local path made absolute (`~` expanded); a URL, '' and None as they are."""
  if not path or is_remote(path):
    return path
  return os.path.abspath(os.path.expanduser(os.fspath(path)))


def is_hub_id(path: str) -> bool:
  """Whether `path` reads as a Hugging Face Hub model id (`org/name`) rather
  than a path: two parts, no URL, and nothing at that path locally."""
  return (not is_remote(path) and not os.path.isabs(path) and not path.startswith("~")
          and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", path) is not None
          and not os.path.exists(path))


def resolve_model(path: str | None) -> str | None:
  """A model location: a Hub id as it is, any other path as `resolve`."""
  if not path or is_hub_id(path):
    return path
  return resolve(path)


def _is_source_name(part: str) -> bool:
  """`demo:stdlib`, `tfds:NAME[:SPLIT]`: a scheme-like prefix before any '/'."""
  return ":" in part.split("/")[0]


def resolve_inputs(spec: str | None) -> str | None:
  """A corpus source (`--input`): comma-separated files and globs, each local
  one made absolute (a glob's pattern too); `demo:`, `tfds:` and URLs kept."""
  if not spec or _is_source_name(spec.strip()) and not is_remote(spec):
    return spec
  return ",".join(part if not part.strip() or _is_source_name(part.strip())
                  else resolve(part.strip()) for part in spec.split(","))


# The config fields that hold paths, each with its resolver and, where the
# field is a path only in some settings, when.
_CONFIG_PATHS: tuple[tuple[str, Callable[[str], str], Callable[[Any], bool]], ...] = (
    ("init_checkpoint", resolve_model, lambda config: True),
    ("data.dir", resolve, lambda config: True),
    ("data.build_from", resolve_inputs, lambda config: True),
    ("wandb.dir", resolve, lambda config: True),  # W&B's local files
    # SQuAD's JSON files (with data.source="tfds" these name TFDS splits; the
    # NER files are names inside data.dir).
    *((name, resolve, lambda config: config.data.get("source") == "json")
      for name in ("data.train_file", "data.predict_file", "data.test_file")),
)


def resolve_config(config: Any) -> None:
  """Resolves, in place, the path fields a (locked) ConfigDict has."""
  for name, resolver, applies in _CONFIG_PATHS:
    *parents, leaf = name.split(".")
    node = config
    for parent in parents:
      node = node.get(parent) if hasattr(node, "get") else None
    if node is None or not hasattr(node, "get") or leaf not in node:
      continue
    value = node[leaf]
    if isinstance(value, str) and value and applies(config):
      node[leaf] = resolver(value)


class _PathParser(flags.ArgumentParser):
  """absl's parser of a path flag: the value resolved as it is parsed."""

  def __init__(self, resolver: Callable[[str], str]):
    self._resolver = resolver

  def parse(self, argument: Any) -> Any:
    return self._resolver(argument) if isinstance(argument, str) else argument

  def flag_type(self) -> str:
    return "string"


_RESOLVERS = {"path": resolve, "model": resolve_model, "inputs": resolve_inputs}


# pylint: disable-next=invalid-name,redefined-builtin
def DEFINE_path(name: str, default: str | None, help: str, *, kind: str = "path",
                **kwargs: Any) -> flags.FlagHolder:
  """A string flag holding a path, resolved where it is parsed.

  Args:
    kind: "path" (a file or directory), "model" (a model directory or Hub id)
      or "inputs" (a corpus source: files and globs, `demo:`, `tfds:`).
    **kwargs: As for `flags.DEFINE_string` (`required=True`).
  """
  # The flag belongs to the command that defines it (its --help lists it):
  # absl names a command run as `python -m` by its file, as here.
  caller = sys._getframe(1).f_globals["__name__"]  # pylint: disable=protected-access
  kwargs.setdefault("module_name", sys.argv[0] if caller == "__main__" else caller)
  return flags.DEFINE(_PathParser(_RESOLVERS[kind]), name, default, help,
                      serializer=flags.ArgumentSerializer(), **kwargs)
