"""The package's rooms and which way imports go: each module imports only
from its own room or the rooms below it (docs/architecture.md), at the top of
a file or inside a function alike."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "bertjax"

# Bottom to top. A module's room is its subpackage (bertjax.data.loader: data)
# or, for a top-level module, its name.
ROOMS = [
    # What everything may use: errors, files and storage, hosts, signals,
    # metrics and trackers, the optimizer, sharding rules, evaluation metrics.
    {"errors", "lazy", "paths", "files", "hosts", "outage", "preemption", "signals",
     "topology", "sharding", "metrics", "divergence", "optim", "evaluation", "usage", "runs",
     "workdir_lock", "throughput", "worker_signals", "config_ranges", "platforms",
     "trackers", "config_files", "schedule_fit", "cpu_load"},
    {"models"},
    {"data"},
    {"interop", "flops", "phases", "pace", "time_left"},
    {"train", "checkpoint", "checkpoint_failures"},
    {"pretrained", "inference"},
    {"tasks"},
    {"tools", "main", "config_meanings"},
]
RANK = {room: rank for rank, rooms in enumerate(ROOMS) for room in rooms}


def _room(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "bertjax"


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, module) of every bertjax import in a file, wherever it is."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == "bertjax":
        found += [(node.lineno, f"bertjax.{alias.name}") for alias in node.names]
      elif node.module.startswith("bertjax."):
        found.append((node.lineno, node.module))
    elif isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names
                if alias.name.startswith("bertjax.")]
  return found


def test_every_room_has_a_place():
  rooms = {path.stem if path.parent == ROOT else path.relative_to(ROOT).parts[0]
           for path in ROOT.rglob("*.py") if path.name != "__init__.py" or path.parent != ROOT}
  rooms -= {"__init__"}
  assert sorted(rooms - set(RANK)) == []


def test_no_import_climbs():
  climbing = []
  for path in sorted(ROOT.rglob("*.py")):
    module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    if _room(module) in ("bertjax", "__init__"):
      continue
    for line, target in _imports(path):
      room = _room(target)
      if room in RANK and RANK[room] > RANK[_room(module)]:
        climbing.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}")
  assert climbing == []


def test_the_fast_lane_names_test_files_there_are():
  from tests import conftest

  tests = ROOT.parent / "tests"
  assert conftest.FAST_LANE
  assert sorted(name for name in conftest.FAST_LANE
                if not (ROOT.parent / name).is_file() or not name.startswith("tests/")) == []
  assert len(list(tests.rglob("test_*.py"))) > len(conftest.FAST_LANE)
