"""A package's public names, imported when first used (PEP 562).

JAX and Flax take seconds to import; a package that names its API this way
lets the commands that need neither (the data tools, `--help`, a flag
mistake) start at once.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def api(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any],
                                                       Callable[[], list[str]]]:
  """`__getattr__` and `__dir__` for `package`, whose `names` map each public
  name to the module that defines it."""
  namespace = importlib.import_module(package).__dict__

  def __getattr__(name: str) -> Any:
    if name not in names:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(names[name]), name)
    namespace[name] = value  # found directly from now on
    return value

  def __dir__() -> list[str]:
    return sorted(set(namespace) | set(names))

  return __getattr__, __dir__
