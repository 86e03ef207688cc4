"""What each field of a config means, read from the configs themselves: the
comment on a field's line or the comment block above it in the config files
(`configs/`), the model's fields from `EncoderConfig`'s docstring, the
divergence guard's from `configs/common.py`'s `divergence_config`; each
number's range from `bertjax.config_ranges`. The `config_fields` command
prints them; docs/configs.md's field tables are its `--docs` output
(`docs_tables`). A module of its own, without the command's flags, so that it
can be imported beside any command.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from typing import Sequence

import ml_collections

from bertjax import config_files, config_ranges, errors, usage

# (dotted name, value) of every field; an empty section is a field.
leaves = usage.config_leaves


def _comments(path: str) -> dict[str, dict[str, str]]:
  """Function -> field -> its comment, in one config file: the comment on its
  assignment's line, else the block of comment lines right above it; the
  fields of a `ConfigDict(dict(a=..., b=...))` take the comments in the call,
  else that section's."""
  source = open(path, encoding="utf-8").read()
  lines = source.splitlines()
  trailing: dict[int, str] = {}
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      row = token.start[0]
      if lines[row - 1].strip() != token.string.strip():  # after code on its line
        trailing[row] = token.string.lstrip("# ").strip()

  def above(row: int) -> str:
    block = []
    while row > 1 and lines[row - 2].strip().startswith("#"):
      row -= 1
      block.insert(0, lines[row - 1].strip().lstrip("#").strip())
    return " ".join(block)

  found: dict[str, dict[str, str]] = {}
  scope = "get_config"

  def section(name: str, value: ast.expr, own: str) -> None:
    """The keywords of `dict(...)` or `ConfigDict(dict(...))`: fields of `name`."""
    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Call):
      value = value.args[0]
    if not (isinstance(value, ast.Call) and ast.unparse(value.func) == "dict"):
      return
    for keyword in value.keywords:
      text = trailing.get(keyword.value.end_lineno) or above(keyword.lineno) or own
      if text:
        found.setdefault(scope, {}).setdefault(f"{name}.{keyword.arg}", text)

  for function in ast.parse(source).body:
    if not isinstance(function, ast.FunctionDef):
      continue
    scope = function.name
    if scope.endswith("_config") and scope not in (
        "get_config", "pretrain_config", "finetune_config", "model_config"):
      # A section's own function (`divergence_config`): what it returns.
      for statement in function.body:
        if isinstance(statement, ast.Return) and statement.value is not None:
          section(scope[:-len("_config")], statement.value, above(statement.lineno))
    for node in ast.walk(function):
      if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        continue
      target = ast.unparse(node.targets[0])
      if not target.startswith("config."):
        continue
      name = target[len("config."):]
      own = trailing.get(node.lineno) or above(node.lineno)
      if own:
        found.setdefault(scope, {}).setdefault(name, own)
      section(name, node.value, own)
  return found


def _docstring_attributes(doc: str) -> dict[str, str]:
  """`Attributes:` entries of a Google-style docstring."""
  found, name = {}, None
  section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
  for line in section.splitlines():
    match = re.match(r"^    (\w+): (.*)$", line)
    if match:
      name = match.group(1)
      found[name] = match.group(2).strip()
    elif name and line.startswith("      "):
      found[name] += " " + line.strip()
    elif line.strip() and not line.startswith(" "):
      break
  return found


def _configs_dir() -> str:
  from bertjax import configs  # pylint: disable=import-outside-toplevel
  return os.path.dirname(os.path.abspath(configs.__file__))


def meanings(spec: str) -> dict[str, str]:
  """What the fields of a shipped config (`name[:arg]`) do: its file's
  comments first, then those of the recipe it builds on (`configs/common.py`'s
  `pretrain_config` or `finetune_config`) and of common.py's sections, then
  the model's fields from `EncoderConfig`'s docstring."""
  from bertjax.models.config import EncoderConfig  # pylint: disable=import-outside-toplevel

  own = _comments(_file_of(spec)[0])
  common = _comments(os.path.join(_configs_dir(), "common.py"))
  base = "pretrain_config" if load(spec).task == "pretrain" else "finetune_config"
  found: dict[str, str] = {}
  for part in [own.get("get_config", {}), common.get(base, {}),
               *(fields for scope, fields in common.items()
                 if scope not in ("pretrain_config", "finetune_config"))]:
    for field, text in part.items():
      found.setdefault(field, text)
  for field, text in _docstring_attributes(EncoderConfig.__doc__ or "").items():
    found.setdefault(f"model.{field}", text)
  return found


def meaning(field: str, known: dict[str, str]) -> str:
  """What `field` does ("" where nothing says)."""
  if field in known:
    return known[field]
  if field.startswith("train.long_model."):  # any model field, for the long phase
    return f"the long phase's model.{field.split('.', 2)[2]}"
  return ""


def _shown(value: object) -> str:
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  text = repr(value)
  return text if len(text) <= 40 else "(see the config file)"


# The tables of docs/configs.md: (heading, configs), the defaults those of
# the first config that has the field.
TABLES = (
    ("Pre-training", ("base_pretrain", "modernbert_pretrain")),
    ("Fine-tuning", ("glue:sst2", "squad:v2.0", "swag", "ner", "ner_features:concat_last_four")),
)


def _file_of(spec: str) -> tuple[str, str]:
  """(the config file, its argument) of `NAME[:arg]` (a shipped config) or
  `PATH.py[:arg]` (any config file)."""
  file, _, arg = spec.partition(":")
  if not file.endswith(".py"):
    file = os.path.join(_configs_dir(), f"{file}.py")
  elif not os.path.exists(file) and file.startswith("configs/"):
    file = os.path.join(_configs_dir(), os.path.basename(file))
  if not os.path.isfile(file):
    raise errors.UsageError(config_files.missing(spec)
                            or f"--config={spec}: no config file {file}")
  return file, arg


def load(spec: str) -> ml_collections.ConfigDict:
  """The config of `spec` (see `_file_of`)."""
  return usage.load_config_file(*_file_of(spec))


def markdown(specs: Sequence[str]) -> str:
  """A table: each field of `specs`' configs, its default, its range (of a
  number) and what it does (those of the first config that has it)."""
  rows: dict[str, tuple[str, str, str, list[str]]] = {}
  for spec in specs:
    known = meanings(spec)
    config = load(spec)
    for field, value in leaves(config):
      if field not in rows:
        allowed = config_ranges.range_of(field, config.task)
        rows[field] = (_shown(value), "" if allowed is None else str(allowed),
                       meaning(field, known), [])
      rows[field][3].append(spec)
  lines = ["| field | default | range | what it does |", "|---|---|---|---|"]
  for field in sorted(rows):
    shown, allowed, what, present = rows[field]
    where = "" if len(present) == len(specs) else f" ({', '.join(present)})"
    what = what.replace("|", "\\|")
    lines.append(f"| `{field}` | `{shown}`{where} | {allowed} | {what} |")
  return "\n".join(lines)


def docs_tables() -> str:
  """docs/configs.md's field tables (`TABLES`)."""
  parts = []
  for title, specs in TABLES:
    shipped = ", ".join(f"`configs/{s.replace(':', '.py:') if ':' in s else s + '.py'}`"
                        for s in specs)
    parts.append(f"### {title}\n\nThe fields of {shipped}, each with the default of the "
                 f"first that has it.\n\n{markdown(specs)}\n")
  return "\n".join(parts)
