r"""Draws runs' curves from their metrics.jsonl to a PNG.

  python -m bertjax.tools.plot --runs=/tmp/bertjax_demo --output=/tmp/bertjax_demo/curves.png
  python -m bertjax.tools.plot --runs=gs://bucket/base,gs://bucket/base_no_nsp \
      --output=compare.png --metrics=mlm_accuracy,nsp_accuracy

One panel a metric, every run in it (a run's name is its directory's), the
training values as lines and the held-out ones (`eval/`, fine-tuning's
`dev/`) as points joined. Default panels, those the runs have: the loss,
masked-LM and next-sentence accuracy (pre-training), a fine-tuning task's
dev figures, the learning rate and the throughput. A step logged twice (a run
stopped and run again) keeps its last value. Needs matplotlib (`pip install
matplotlib`).
"""

from __future__ import annotations

import io
import json
import os
from typing import Any, Sequence

from absl import flags

from bertjax import errors, files, paths, usage

_RUNS = flags.DEFINE_list("runs", None, "Workdirs (local or gs://), comma-separated.",
                          required=True)
_OUTPUT = paths.DEFINE_path("output", None, "The PNG to write (local or gs://).", required=True)
_METRICS = flags.DEFINE_list("metrics", None, "Panels, by metric name without its prefix "
                             "(loss, mlm_accuracy, learning_rate, ...); default: those the "
                             "runs have of the usual ones.")

# The panels drawn by default, in order, where a run has them; a fine-tuning
# run's dev figures come after the loss.
DEFAULT_PANELS = ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "accuracy",
                  "learning_rate", "tokens_per_s", "examples_per_s")
_HELD_OUT = ("eval/", "dev/")
_TITLES = {"loss": "loss", "mlm_loss": "masked-LM loss", "mlm_accuracy": "masked-LM accuracy",
           "nsp_accuracy": "next-sentence accuracy", "learning_rate": "learning rate",
           "tokens_per_s": "tokens/s", "examples_per_s": "examples/s"}

Series = dict[str, dict[int, float]]  # "train/loss" -> {step: value}


def read_run(workdir: str) -> Series:
  """A run's `metrics.jsonl` as series, the last value of each step (lines cut
  short by a kill are skipped)."""
  path = files.join(workdir, "metrics.jsonl")
  if not files.isfile(path):
    raise errors.MissingFileError(f"{path} not found: --runs takes workdirs of bertjax runs")
  series: Series = {}
  for line in files.read_text(path).splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue
    step = record.get("step") if isinstance(record, dict) else None
    if not isinstance(step, int):
      continue
    for key, value in record.items():
      if "/" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
        series.setdefault(key, {})[step] = float(value)
  return series


def panels(runs: Sequence[Series], wanted: Sequence[str] | None) -> list[str]:
  """The metric names to draw: `wanted`, else the default ones the runs have
  and their held-out figures (a fine-tuning task's f1, matthews_corr, ...)."""
  names = {key.split("/", 1)[1] for run in runs for key in run}
  if wanted:
    missing = [name for name in wanted if name not in names]
    if missing:
      raise errors.UsageError(f"--metrics: no run has {', '.join(missing)}; they have "
                              f"{', '.join(sorted(names))}")
    return list(wanted)
  held_out = sorted({key.split("/", 1)[1] for run in runs for key in run
                     if key.startswith(_HELD_OUT) and not key.endswith("perplexity")}
                    - set(DEFAULT_PANELS))  # (a perplexity is its loss's exponential)
  chosen = [name for name in DEFAULT_PANELS if name in names]
  return chosen[:1] + held_out + chosen[1:]


def draw(runs: dict[str, Series], names: Sequence[str]) -> Any:
  """The figure: a panel a metric, a colour a run."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")  # files only: no display needed
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  columns = min(3, len(names))
  rows = -(-len(names) // columns)
  figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for axis, name in zip(axes.flat, names):
    for i, (label, series) in enumerate(runs.items()):
      colour = colours[i % len(colours)]
      for key, values in sorted(series.items()):
        if key.split("/", 1)[1] != name or not values:
          continue
        steps = sorted(values)
        held_out = key.startswith(_HELD_OUT)
        axis.plot(steps, [values[s] for s in steps], color=colour,
                  marker="o" if held_out else None, markersize=4,
                  linestyle="--" if held_out else "-", linewidth=1.2,
                  label=f"{label} {key.split('/', 1)[0]}")
    axis.set_title(_TITLES.get(name, name))
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)
    if name == "learning_rate":
      axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    axis.legend(fontsize=7)
  for axis in list(axes.flat)[len(names):]:
    axis.set_visible(False)
  figure.tight_layout()
  return figure


def _label(workdir: str) -> str:
  return os.path.basename(workdir.rstrip("/")) or workdir


def main(argv):
  del argv
  runs = {}
  for workdir in _RUNS.value:
    label = _label(workdir)
    while label in runs:  # two runs of one name in other directories
      label += "'"
    runs[label] = read_run(workdir)
  names = panels(list(runs.values()), _METRICS.value)
  if not names:
    raise errors.UsageError("the runs' metrics.jsonl hold no metrics yet")
  files.check_file(_OUTPUT.value, "--output")
  with usage.signals_held():
    try:
      import matplotlib  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      raise errors.MissingDependencyError(
          "matplotlib is not installed: pip install matplotlib") from None
  png = io.BytesIO()
  draw(runs, names).savefig(png, format="png", dpi=110)
  if not files.is_remote(_OUTPUT.value):
    files.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)))
  files.write_bytes(_OUTPUT.value, png.getvalue())  # whole or not at all
  print(f"Wrote {_OUTPUT.value}: {', '.join(names)} of {', '.join(runs)}")


if __name__ == "__main__":
  usage.run_main(main, interrupted="nothing was written")
