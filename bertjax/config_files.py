"""Config files as a command names them: found, loaded, and their mistakes.

`--config=configs/NAME.py[:arg]` names a shipped config from any directory
(`shipped_configs`); a path that names no file is one line that lists the
shipped configs, with the nearest as "did you mean" (`missing`); a config file
that does not load, or whose `get_config` returns no config, is one line too
(`file_shape`, `file_frame`, read by `bertjax.usage.parse_flags`). A field or
flag named as other BERT code names it (`num_train_steps`, `train_batch_size`)
is found as the field it is here (`field_for`).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
import traceback
from typing import Any, Iterator

import ml_collections

from bertjax import errors

# How the docs and the commands bertjax prints name a shipped config.
_SHIPPED_CONFIG = re.compile(r"^configs/(\w+\.py)(:.*)?$")


def shipped_configs(argv: list[str]) -> list[str]:
  """`argv` with `--config=configs/NAME.py[:arg]` read from the installed
  configs (`bertjax.configs`) where no such file is under the working
  directory: the commands in the docs, and those bertjax prints, run from any
  directory."""
  def shipped(value: str) -> str:
    match = _SHIPPED_CONFIG.match(value)
    if match is None or os.path.exists(value.split(":", 1)[0]):
      return value
    installed = os.path.join(shipped_dir(), match.group(1))
    return installed + (match.group(2) or "") if os.path.exists(installed) else value

  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith("--config="):
      out[i] = "--config=" + shipped(arg[len("--config="):])
    elif arg == "--config" and i + 1 < len(out):  # --config PATH
      out[i + 1] = shipped(out[i + 1])
  return out


def flag_values(name: str, argv: list[str]) -> list[str]:
  """The values `argv` gives the flag `--name` (`--name=V` or `--name V`),
  as absl reads them (the last one counts)."""
  values = []
  for i, arg in enumerate(argv[1:], 1):
    for prefix in (f"--{name}=", f"-{name}="):
      if arg.startswith(prefix):
        values.append(arg[len(prefix):])
    if arg in (f"--{name}", f"-{name}") and i + 1 < len(argv):
      values.append(argv[i + 1])
  return values


def config_path(argv: list[str]) -> str | None:
  """The --config file's path (without its `:argument`), if one is given."""
  given = flag_values("config", argv)
  return given[-1].split(":", 1)[0] if given else None


def file_shape(error: BaseException, argv: list[str]) -> str | None:
  """The line for a config file without a get_config, or whose get_config
  returned nothing (config_flags words both as other mistakes)."""
  path = config_path(argv)
  if path is None or not os.path.isfile(path):
    return None
  try:
    with open(path, "rb") as f:
      tree = ast.parse(f.read())
  except (OSError, SyntaxError, ValueError):
    return None  # said by the file's own error
  if not any(isinstance(node, ast.FunctionDef) and node.name == "get_config"
             for node in tree.body):
    return (f"--config: {path} has no get_config function: a config file defines "
            "get_config(arg=None) returning the config (docs/configs.md)")
  if "must have a value other than None" in str(error):
    return (f"--config: {path}'s get_config returned None: return the "
            "ml_collections.ConfigDict it builds (docs/configs.md)")
  return None


def file_frame(error: BaseException, argv: list[str]):
  """(The innermost traceback entry in the --config file, the error it is of):
  of `error` or an error it was raised from (no entry when the file's own code
  raised none)."""
  path = config_path(argv)
  if path is None:
    return None, error
  path = os.path.realpath(path)
  given = error
  found, seen = None, set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    for frame in traceback.extract_tb(error.__traceback__):
      if os.path.realpath(frame.filename) == path:
        found = frame
    if found is not None:
      return found, error
    error = error.__cause__ or error.__context__
  return None, given


def load_config_file(file: str, argument: str = "") -> Any:
  """`get_config(argument)` of a config file loaded from its path, as
  `--config=file:argument` loads it."""
  name = f"_bertjax_config_{os.path.splitext(os.path.basename(file))[0]}"
  spec = importlib.util.spec_from_file_location(name, file)
  if spec is None or spec.loader is None:
    raise errors.UsageError(f"{file}: not a Python config file")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(argument) if argument else module.get_config()


def config_leaves(config: ml_collections.ConfigDict,
                  prefix: str = "") -> Iterator[tuple[str, Any]]:
  """(dotted name, value) of every field of a config; an empty section is a field."""
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict) and len(value):
      yield from config_leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


# Names other BERT code gives a setting (Google's run_pretraining.py and
# run_classifier.py flags, Hugging Face's TrainingArguments), and the fields
# they are here (the first that the config has).
OTHER_NAMES = {
    "num_train_steps": ("train.total_steps",), "max_steps": ("train.total_steps",),
    "steps": ("train.total_steps",), "total_steps": ("train.total_steps",),
    "num_warmup_steps": ("optimizer.warmup_steps",),
    "warmup_steps": ("optimizer.warmup_steps",),
    "batch_size": ("train.batch_size",), "train_batch_size": ("train.batch_size",),
    "per_device_train_batch_size": ("train.batch_size",),
    "eval_batch_size": ("eval.batch_size",), "predict_batch_size": ("eval.batch_size",),
    "learning_rate": ("optimizer.learning_rate", "train.learning_rate"),
    "lr": ("optimizer.learning_rate", "train.learning_rate"),
    "num_train_epochs": ("train.epochs",), "epochs": ("train.epochs",),
    "max_seq_length": ("train.max_seq_length", "data.max_seq_length"),
    "max_predictions_per_seq": ("train.max_predictions",),
    "save_checkpoints_steps": ("checkpoint.every_steps",),
}


def given_config(argv: list[str]) -> ml_collections.ConfigDict | None:
  """The config `argv`'s `--config=FILE[:arg]` (or `--config FILE`) names, loaded again (None if it
  does not load: config_flags has not kept it when an override failed)."""
  given = flag_values("config", argv)
  if not given:
    return None
  file, _, argument = given[-1].partition(":")
  try:
    config = load_config_file(file, argument)
  except Exception:  # pylint: disable=broad-except  (a hint is a nicety)
    return None
  return config if isinstance(config, ml_collections.ConfigDict) else None


def field_for(path: str, config: ml_collections.ConfigDict) -> str | None:
  """The field of `config` that a mistaken name `path` (dotted, or a flag's
  name) most likely means: the field other BERT code calls so
  (`OTHER_NAMES`), one of the same name in another section
  (`optimizer.learning_rate` for `train.learning_rate`), else the nearest."""
  fields = [field for field, _ in config_leaves(config)]
  name = path.split(".")[-1]
  known = [field for field in OTHER_NAMES.get(name, ()) if field in fields]
  if known:
    return known[0]
  same_name = [field for field in fields if field.split(".")[-1] == name]
  if len(same_name) == 1:
    return same_name[0]
  close = difflib.get_close_matches(path, fields, 1, cutoff=0.75)
  return close[0] if close else None


def shipped_dir() -> str:
  """The folder of the installed configs (`bertjax.configs`)."""
  from bertjax import configs  # pylint: disable=import-outside-toplevel
  return os.path.dirname(os.path.abspath(configs.__file__))


def shipped_names() -> list[str]:
  """The shipped configs' file names (`demo.py`, ...), sorted."""
  return sorted(name for name in os.listdir(shipped_dir())
                if name.endswith(".py") and name not in ("__init__.py", "common.py"))


def missing(value: str, flag: str = "--config") -> str | None:
  """The line for a config `value` (`PATH[:arg]`) whose path names no file
  (None: it names one): the shipped configs, and the one most likely meant
  (a misspelt name, a shipped name in another folder, `configs/glue:mrpc`
  for `configs/glue.py:mrpc`)."""
  path, _, argument = value.partition(":")
  if os.path.isfile(path):
    return None
  names = shipped_names()
  stems = [name[:-3] for name in names]
  base = os.path.basename(path.rstrip("/"))
  stem = base[:-3] if base.endswith(".py") else base
  parent = os.path.basename(os.path.dirname(path.rstrip("/")))
  if stem not in stems and "." in stem and stem.split(".")[0] in stems and not argument:
    stem, argument = stem.split(".", 1)  # configs/glue.mrpc
  elif stem not in stems and parent in stems and not argument:
    stem, argument = parent, stem  # configs/glue/mrpc
  if stem not in stems:
    close = difflib.get_close_matches(stem, stems, 1, cutoff=0.6)
    stem = close[0] if close else ""
  meant = f" (did you mean configs/{stem}.py{':' + argument if argument else ''}?)" if stem else ""
  what = "is a folder, not a config file" if os.path.isdir(path) else "no such file"
  where = "" if os.path.isabs(path) else f" under {os.getcwd()}"
  return (f"{flag}={value}: {what}{where}{meant}; the shipped configs are "
          f"{', '.join('configs/' + name for name in names)} (docs/configs.md)")
