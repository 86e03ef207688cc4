r"""The paper's fine-tuning protocol: learning rates x random restarts, best on dev.

  python -m bertjax.tools.sweep --config=configs/glue.py:rte --workdir=/tmp/rte_sweep \
      --config.init_checkpoint=uncased_L-24_H-1024_A-16 --config.data.dir=glue_data/RTE \
      --learning_rates=5e-5,4e-5,3e-5,2e-5 --seeds=0,1,2,3,4

Every (learning rate, seed) pair fine-tunes from the same checkpoint into
`<workdir>/lr<rate>_seed<seed>/`; the seed sets the new output layer and the
data order ("random restarts", section 4.1). Pairs whose `results.json`
exists are not run again, so an interrupted sweep continues, provided their
saved settings (`config.json`) are the ones asked for: a finished pair of other
settings (another `--config.init_checkpoint`, ...) is refused, naming its
directory and what differs, before any run starts. The run with the
best dev score (the task's first metric: Matthews correlation for CoLA, F1 for
MRPC/QQP/SQuAD/NER, Spearman for STS-B, accuracy elsewhere) is selected;
`sweep.json` and `sweep.md` hold every run and the mean, spread and best per
learning rate. The sweep runs its fine-tunes one after another in this process.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from absl import flags, logging
from ml_collections import config_flags

from bertjax import config_ranges, errors, files, paths, runs, tasks, usage

_CONFIG = config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.",
                                          lock_config=True)
_WORKDIR = paths.DEFINE_path("workdir", None, "Where the runs and the tables go.")
_LEARNING_RATES = flags.DEFINE_list("learning_rates", ["5e-5", "4e-5", "3e-5", "2e-5"],
                                    "Learning rates to try (the paper's four by default).")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Random restarts: one run per seed and rate.")
flags.mark_flags_as_required(["config", "workdir"])


def dev_score(task: str, results: dict[str, Any]) -> tuple[str, float]:
  """(name, value) of the dev metric a task's runs are selected by."""
  dev = results["dev"]
  if task == "glue":
    name = next(iter(dev))
  elif task == "squad":
    name = "f1"
  elif task == "swag":
    name = "accuracy"
  elif task in ("ner", "ner_features"):
    name = "f1"
  else:
    raise errors.UsageError(f"no dev metric known for config.task {task!r}")
  return name, float(dev[name])


def run_name(learning_rate: float, seed: int) -> str:
  return f"lr{learning_rate:g}_seed{seed}"


def _run_config(config, learning_rate: float, seed: int):
  """The resolved config of one pair's run (paths absolute, as it saves them)."""
  run_config = config.copy_and_resolve_references()
  with run_config.unlocked():
    run_config.train.learning_rate = learning_rate
    run_config.seed = seed
  paths.resolve_config(run_config)
  return run_config


def _check_finished(planned: list[tuple[float, int, str, Any]]) -> None:
  """Refuses to reuse a finished run (one with `results.json`) whose saved
  settings (`config.json`) are not the ones this sweep asks for, before any
  run starts: its results would be reported as this sweep's.

  Raises:
    UsageError: naming the first such run's directory and its settings that differ.
  """
  stale = []
  for _, _, run_dir, run_config in planned:
    if files.exists(files.join(run_dir, "results.json")):
      changes = runs.settings_changes(run_config, run_dir)
      if changes:
        stale.append((run_dir, changes))
  if not stale:
    return
  run_dir, changes = stale[0]
  shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
  others = f" (and the {len(stale) - 1} other runs of other settings)" if len(stale) > 1 else ""
  raise errors.UsageError(
      f"{run_dir} holds a finished run of other settings ({shown}); a sweep reads a finished "
      "run back only when its settings are the ones asked for: give this sweep another "
      f"--workdir, or delete that run{others} to run it with these")


def sweep(config, workdir: str, learning_rates: list[float], seeds: list[int]) -> dict[str, Any]:
  """Runs (or reuses) every pair and returns the summary written to sweep.json.

  A pair finished before (its `results.json`) is read back, not run again,
  when the settings it saved (`config.json`) are this sweep's; a finished pair
  of other settings (another `init_checkpoint`, data, epochs, ...) is refused
  before any run starts (`_check_finished`).
  """
  if config.task == "pretrain":
    raise errors.UsageError("the sweep fine-tunes; config.task 'pretrain' is not a "
                               "fine-tuning task")
  workdir = paths.resolve(workdir)
  planned = [(learning_rate, seed, files.join(workdir, run_name(learning_rate, seed)),
              _run_config(config, learning_rate, seed))
             for learning_rate in learning_rates for seed in seeds]
  _check_finished(planned)
  if not files.is_remote(workdir):
    os.makedirs(workdir, exist_ok=True)
  done = []
  for learning_rate, seed, run_dir, run_config in planned:
    results_path = files.join(run_dir, "results.json")
    if files.exists(results_path):
      logging.info("%s: done before with these settings, reading its results", run_dir)
      results = files.read_json(results_path)
    else:
      logging.info("Fine-tuning %s", run_dir)
      results = tasks.run(run_config, run_dir)
    metric, score = dev_score(config.task, results)
    done.append({"learning_rate": learning_rate, "seed": seed, "metric": metric,
                 "dev": score, "workdir": run_dir})
  # A collapsed run can score NaN (a constant STS-B prediction): never the best.
  best = max(done, key=lambda r: -math.inf if math.isnan(r["dev"]) else r["dev"])
  by_rate = []
  for learning_rate in learning_rates:
    scores = [r["dev"] for r in done if r["learning_rate"] == learning_rate]
    mean = sum(scores) / len(scores)
    spread = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    by_rate.append({"learning_rate": learning_rate, "runs": len(scores), "mean": mean,
                    "std": spread, "max": max(scores)})
  summary = {"task": config.task, "metric": best["metric"], "best": best, "runs": done,
             "by_learning_rate": by_rate}
  files.write_text(os.path.join(workdir, "sweep.json"), json.dumps(summary, indent=2))
  files.write_text(os.path.join(workdir, "sweep.md"), markdown_table(summary))
  return summary


def markdown_table(summary: dict[str, Any]) -> str:
  metric = summary["metric"]
  best = summary["best"]
  lines = [f"# {summary['task']} sweep: dev {metric}", "",
           f"Best: learning rate {best['learning_rate']:g}, seed {best['seed']}: "
           f"{best['dev']:.2f} (`{best['workdir']}`)", "",
           f"| learning rate | seed | dev {metric} |", "|---:|---:|---:|"]
  for run in summary["runs"]:
    mark = " (best)" if run is best else ""
    lines.append(f"| {run['learning_rate']:g} | {run['seed']} | {run['dev']:.2f}{mark} |")
  lines += ["", "| learning rate | runs | mean | std | max |", "|---:|---:|---:|---:|---:|"]
  for row in summary["by_learning_rate"]:
    lines.append(f"| {row['learning_rate']:g} | {row['runs']} | {row['mean']:.2f} | "
                 f"{row['std']:.2f} | {row['max']:.2f} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  try:
    learning_rates = [float(v) for v in _LEARNING_RATES.value]
    seeds = [int(v) for v in _SEEDS.value]
  except ValueError as e:
    raise errors.UsageError(f"--learning_rates takes numbers and --seeds integers: {e}")
  # They become the runs' fields: refused as those are, before any run starts.
  for flag, field, values in (("--learning_rates", "train.learning_rate", learning_rates),
                              ("--seeds", "seed", seeds)):
    allowed = config_ranges.range_of(field, _CONFIG.value.task)
    wrong = [value for value in values if allowed is not None and value not in allowed]
    if wrong:
      raise errors.UsageError(f"{flag}: {wrong[0]:g} must be {allowed}, as each run's "
                              f"config.{field}")
  files.check_directory(_WORKDIR.value, "--workdir")
  summary = sweep(_CONFIG.value, _WORKDIR.value, learning_rates, seeds)
  print(markdown_table(summary))


if __name__ == "__main__":
  usage.run_main(main, interrupted="finished runs are kept: rerun the same command to run "
                 "the rest")
