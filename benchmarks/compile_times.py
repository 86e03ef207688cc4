r"""How long `bertjax.tools.compile` takes on this machine, per model and slice.

  pip install -e '.[tpu]'
  python benchmarks/compile_times.py
  python benchmarks/compile_times.py --runs base_pretrain.py:v4-8 large_pretrain.py:v4-32

Runs the compile tool as a user runs it (`python -m bertjax.tools.compile
--config=configs/<config> --topology=<slice>`: every phase's training and
evaluation step), one process after another, and prints one JSON line per run:
its wall-clock seconds, exit status, whether every step fits and each step's
per-chip total.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNS = ["base_pretrain.py:v4-8", "base_pretrain.py:v5litepod-16", "base_pretrain.py:v6e-8",
        "base_pretrain.py:v5p-8", "large_pretrain.py:v4-32", "large_pretrain.py:v5litepod-16",
        "large_pretrain.py:v5p-8", "modernbert_pretrain.py:v5p-8"]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", nargs="+", default=RUNS, help="config:slice pairs.")
  args = parser.parse_args()
  for run in args.runs:
    config, _, topology = run.rpartition(":")
    command = [sys.executable, "-m", "bertjax.tools.compile", f"--config=configs/{config}",
               f"--topology={topology}"]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = result.stdout.strip().splitlines()
    try:
      report = json.loads(lines[-1])
    except (IndexError, ValueError):
      report = {}
    totals = {name: round(step["total"] / 2**30, 2)
              for name, step in report.get("per_chip_bytes", {}).items()
              if isinstance(step, dict) and isinstance(step.get("total"), (int, float))}
    print(json.dumps({
        "config": config, "topology": topology, "seconds": round(seconds, 1),
        "exit_status": result.returncode, "fits": report.get("fits"),
        "per_chip_gib": totals,
        "error": result.stderr.strip().splitlines()[-1] if result.returncode == 2 else None,
    }), flush=True)


if __name__ == "__main__":
  main()
