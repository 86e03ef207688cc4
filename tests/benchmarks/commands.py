"""The config a benchmark's `python -m bertjax.main` command runs."""

import importlib
import os


def config_of(args):
  """The shipped config `args` names (`--config=.../configs/NAME.py`), with its
  `--config.*` overrides applied, each to a field that exists, as its type."""
  config_file = next(a for a in args if a.startswith("--config=")).split("=", 1)[1]
  module = os.path.splitext(os.path.basename(config_file))[0]
  config = importlib.import_module(f"bertjax.configs.{module}").get_config()
  overrides = dict(a[len("--config."):].split("=", 1) for a in args if a.startswith("--config."))
  for name, value in overrides.items():
    current = config
    for key in name.split("."):
      current = current[key]
    config.update_from_flattened_dict({name: type(current)(value)})
  return config
