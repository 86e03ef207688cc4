"""Each command's --help lists every flag it takes, and main's lists every
shipped config."""

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The commands with path flags (`bertjax.paths.DEFINE_path`), which absl once
# left out of --help when run as `python -m`.
COMMANDS = ["bertjax.main"] + [
    f"bertjax.tools.{name[:-3]}" for name in sorted(os.listdir(os.path.join(ROOT, "bertjax", "tools")))
    if name.endswith(".py") and "DEFINE_path(" in open(
        os.path.join(ROOT, "bertjax", "tools", name), encoding="utf-8").read()]


def _defined_flags(module: str) -> set[str]:
  source = open(os.path.join(ROOT, *module.split(".")) + ".py", encoding="utf-8").read()
  return set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))


@pytest.mark.parametrize("module", COMMANDS)
def test_help_lists_every_flag_the_command_defines(module, tmp_path):
  result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  listed = set(re.findall(r"^\s+--(?:\[no\])?(\w+)", result.stdout, re.M))
  missing = _defined_flags(module) - listed
  assert not missing, f"{module} --help leaves out {sorted(missing)}"


def test_mains_help_names_every_shipped_config():
  doc = ast.get_docstring(ast.parse(open(os.path.join(ROOT, "bertjax", "main.py"),
                                         encoding="utf-8").read()))
  shipped = {name for name in os.listdir(os.path.join(ROOT, "configs"))
             if name.endswith(".py") and name not in ("__init__.py", "common.py")}
  assert {name for name in shipped if f"configs/{name}" not in doc} == set()
