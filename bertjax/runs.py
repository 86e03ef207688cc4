"""A run's working directory: whose it is, the resolved config it keeps, and
what the run says it left there when it is done.

`<workdir>/config.json` says what a workdir holds: `load_pretrained(workdir)`
reads the model from it, and a rerun is checked against it. A run therefore
refuses a workdir that holds another task's run (or the checkpoint it starts
from) before it writes anything, and writes its config only once its settings
are checked and its checkpoint restored, so a refused rerun leaves the file as
it was.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
from typing import Any, Mapping

from bertjax import errors, files, metrics

CONFIG_FILE = "config.json"


def _same_place(a: str, b: str) -> bool:
  if files.is_remote(a) or files.is_remote(b):
    return a.rstrip("/") == b.rstrip("/")
  return os.path.realpath(a) == os.path.realpath(b)


def _kind(config: dict[str, Any]) -> str:
  """'pretrain', 'glue mrpc', 'squad v2.0': what a run is, for telling runs apart."""
  data = config.get("data") or {}
  detail = [str(data[name]) for name in ("task", "version") if data.get(name)]
  return " ".join([str(config.get("task")), *detail])


def check_workdir(config: Any, workdir: str) -> None:
  """Refuses a workdir that belongs to something else, before anything is written.

  Raises:
    ValueError: the workdir is the checkpoint fine-tuning starts from, or holds
      a run of another task (its `config.json` says which).
  """
  init = config.get("init_checkpoint") if hasattr(config, "get") else None
  if init and _same_place(init, workdir):
    raise errors.UsageError(f"--workdir={workdir} is config.init_checkpoint: the run would write "
                            "over the model it starts from; give another --workdir")
  path = files.join(workdir, CONFIG_FILE)
  if not files.isfile(path):
    return
  try:
    saved = json.loads(files.read_text(path))
  except (ValueError, UnicodeDecodeError) as e:
    raise errors.UsageError(f"{path} is not a run's config ({e}); give another --workdir, or "
                            "delete the file if the directory is yours to reuse") from None
  if not isinstance(saved, dict) or "task" not in saved:
    raise errors.UsageError(f"{path} is not a bertjax run's config (a model directory?); give "
                            "another --workdir")
  ours, theirs = _kind(config.to_dict()), _kind(saved)
  if ours != theirs:
    raise errors.UsageError(f"--workdir={workdir} holds a {theirs!r} run ({path}); this is a "
                            f"{ours!r} run: give another --workdir")


# The settings whose change on a rerun changes the rest of a run's schedule:
# said (the steps trained keep what they had), not refused.
SCHEDULE_FIELDS = ("train.total_steps", "train.batch_size", "train.long_from_step",
                   "train.long_batch_size", "optimizer.learning_rate",
                   "optimizer.warmup_steps", "optimizer.schedule", "optimizer.decay_steps",
                   "optimizer.long_learning_rate", "optimizer.final_fraction",
                   "optimizer.weight_decay", "optimizer.restarts")


def schedule_changes(config: Any, workdir: str) -> list[str]:
  """What a rerun changes of the schedule its workdir's `config.json` was
  saved with: `"train.total_steps 2000 -> 3000"`, ... (none for a new run)."""
  path = files.join(workdir, CONFIG_FILE)
  if not files.isfile(path):
    return []
  saved = json.loads(files.read_text(path))
  now = json.loads(json.dumps(config.to_dict(), default=str))  # tuples as JSON has them
  changes = []
  for field in SCHEDULE_FIELDS:
    section, name = field.split(".")
    before, after = (saved.get(section) or {}).get(name), (now.get(section) or {}).get(name)
    if before is not None and after is not None and before != after:
      changes.append(f"{field} {before} -> {after}")
  return changes


def settings_changes(config: Any, workdir: str) -> list[str]:
  """How `config` differs from the `config.json` a run saved in `workdir`:
  `"init_checkpoint: /models/a then, /models/b now"`, one entry a setting
  (nested ones dotted); `["no config.json"]` where the run saved none. A
  setting the saved config lacks (one a later bertjax added) is no change."""
  path = files.join(workdir, CONFIG_FILE)
  if not files.isfile(path):
    return [f"no {CONFIG_FILE} to compare"]
  try:
    saved = json.loads(files.read_text(path))
  except (ValueError, UnicodeDecodeError) as e:
    return [f"{CONFIG_FILE} unreadable ({e})"]
  return _changed(saved, json.loads(json.dumps(config.to_dict(), default=str)))


def _changed(saved: Any, now: Any, prefix: str = "") -> list[str]:
  """`settings_changes` between two JSON trees, their keys under `prefix`; keys
  `saved` lacks are left out."""
  if isinstance(saved, dict) and isinstance(now, dict):
    return [change for key in sorted(saved)
            for change in _changed(saved.get(key), now.get(key), f"{prefix}{key}.")]
  if saved == now:
    return []
  return [f"{prefix.rstrip('.')}: {_shown(saved)} then, {_shown(now)} now"]


def _process_0() -> bool:
  """Whether this is the run's process 0 (JAX, imported here only: a sweep's
  --help or refusal answers without it)."""
  import jax

  return jax.process_index() == 0


def _shown(value: Any) -> str:
  """A setting's value as a user types it (a path bare, others as JSON)."""
  return value if isinstance(value, str) and value else json.dumps(value)


def save_config(config: Any, workdir: str) -> None:
  """Writes a run's resolved config to `<workdir>/config.json` (process 0 only),
  atomically: readers see the old file or the new one."""
  if not _process_0():
    return
  files.makedirs(workdir)
  files.write_text(files.join(workdir, CONFIG_FILE),
                   json.dumps(config.to_dict(), indent=2, default=str))


def say_pretraining_is_done(workdir: str, step: int, held_out: Mapping[str, float],
                            held_out_step: int, demo: bool = False) -> None:
  """A pre-training run's last lines (process 0): where its checkpoint and
  metrics are, its held-out figures, and the commands that look at it, convert
  it and fine-tune from it (`demo`: on the offline task of the demo corpus,
  configs/demo_finetune.py; otherwise on GLUE's SST-2, whose files the user
  brings)."""
  if not _process_0():
    return
  if not held_out:  # a rerun of a finished run: its last evaluation, as recorded
    held_out, held_out_step = last_evaluation(workdir)
  figures = "  ".join(f"{k} {v:.4f}" for k, v in held_out.items())
  q, stem = shlex.quote, workdir.rstrip("/")
  if demo:
    fine_tune = (f"python -m bertjax.main --config=configs/demo_finetune.py "
                 f"--config.init_checkpoint={q(workdir)} --workdir={q(stem + '_topics')}")
  else:
    fine_tune = (f"python -m bertjax.main --config=configs/glue.py:sst2 "
                 f"--config.init_checkpoint={q(workdir)} --config.data.dir=glue_data/SST-2 "
                 f"--workdir={q(stem + '_sst2')}  # the GLUE SST-2 files: docs/finetuning.md")
  lines = [
      f"Done: {step} steps. Checkpoint {files.join(workdir, 'checkpoints', str(step))}, "
      f"metrics {files.join(workdir, 'metrics.jsonl')}.",
      (f"Held-out at step {held_out_step}: {figures}" if figures
       else "Held-out: not evaluated (eval.every_steps)"),
      f"Plot:      {plot_command(workdir)}",
      f"Look:      {tensorboard_command(files.join(workdir, 'tensorboard'))}",
      f"Convert:   python -m bertjax.tools.convert --input={q(workdir)} --to=hf "
      f"--output={q(stem + '_hf')}",
      f"Fine-tune: {fine_tune}",
  ]
  metrics.log("\n".join(lines))


def last_evaluation(workdir: str) -> tuple[dict[str, float], int]:
  """The last held-out figures a run's `metrics.jsonl` holds, without their
  `eval/` prefix, and their step ({} and 0 where it holds none)."""
  figures: dict[str, float] = {}
  step = 0
  path = files.join(workdir, "metrics.jsonl")
  if not files.isfile(path):
    return figures, step
  for line in files.read_text(path).splitlines():
    try:
      record = json.loads(line)
    except ValueError:  # a line cut short by a kill
      continue
    found = {k[len("eval/"):]: v for k, v in record.items() if k.startswith("eval/")}
    if found and isinstance(record.get("step"), int):
      figures, step = found, record["step"]
  return figures, step


def tensorboard_command(logdir: str) -> str:
  """The shell command that shows `logdir` in TensorBoard, installing it first
  where it is not on the PATH (bertjax does not depend on it)."""
  command = f"tensorboard --logdir {shlex.quote(logdir)}"
  return command if shutil.which("tensorboard") else f"pip install tensorboard && {command}"


def plot_command(workdir: str) -> str:
  """The shell command that draws a run's curves (`bertjax.tools.plot`) to
  `<workdir>/curves.png`, installing matplotlib first where it is missing."""
  command = (f"python -m bertjax.tools.plot --runs={shlex.quote(workdir)} "
             f"--output={shlex.quote(files.join(workdir, 'curves.png'))}")
  installed = importlib.util.find_spec("matplotlib") is not None
  return command if installed else f"pip install matplotlib && {command}"


def _figures(values: Mapping[str, Any]) -> str:
  """"accuracy 76.8000  f1 80.1000": the numbers of `values`."""
  return "  ".join(f"{k} {v:.4f}" for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool))


def _baseline(baseline: Mapping[str, Any] | None) -> str:
  """"; always guessing the commonest class (gui): accuracy 29.0000", or ""."""
  if not baseline:
    return ""
  return f"; always guessing the commonest class ({baseline['always']}): {_figures(baseline)}"


def say_fine_tuning_is_done(workdir: str, results: Mapping[str, Any]) -> None:
  """A fine-tuning run's last lines (process 0): its dev figures beside their
  baseline (`results["baseline"]`, where it has one), the files it wrote, and
  the commands to look at its metrics and convert its model."""
  if not _process_0():
    return
  dev = {split: values for split, values in results.items()
         if isinstance(values, Mapping) and split != "baseline"}
  baselines = results.get("baseline") or {}
  lines = [f"Done. {split}: {_figures(values)}" + _baseline(baselines.get(split))
           for split, values in dev.items() if _figures(values)] or ["Done."]
  written = sorted(name for name in files.listdir(workdir)
                   if name.endswith((".json", ".tsv", ".csv", ".txt", ".jsonl"))
                   and name != "config.json" or name in ("submission", "model"))
  lines.append(f"Wrote to {workdir}: {', '.join(written)}")
  if "tensorboard" in files.listdir(workdir):
    lines.append(f"Look:    {tensorboard_command(files.join(workdir, 'tensorboard'))}")
  if "model" in written:
    model = files.join(workdir, "model")
    lines.append("Convert (to Hugging Face's format): python -m bertjax.tools.convert "
                 f"--input={shlex.quote(model)} --output={shlex.quote(model + '_hf')}")
  metrics.log("\n".join(lines))
