"""The real `xpk` package for the tests, in a virtual environment of its own
(its pins are strict), made once from PyPI under BERTJAX_TEST_CACHE (or
~/.cache/bertjax-tests)."""

import os
import subprocess
import sys

XPK_VERSION = "1.16.0"


def xpk_executable() -> str | None:
  """The path of `xpk`, installed if needed; None when PyPI is not reachable
  (the caller skips, saying so)."""
  cache = os.environ.get("BERTJAX_TEST_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "bertjax-tests")
  venv = os.path.join(cache, f"xpk-{XPK_VERSION}")
  executable = os.path.join(venv, "bin", "xpk")
  if not os.path.exists(executable):
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    install = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q",
                              f"xpk=={XPK_VERSION}"], capture_output=True, text=True,
                             timeout=900)
    if install.returncode:
      return None
  return executable
