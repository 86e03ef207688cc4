"""A shortened pre-training run: every part of its schedule that does not fit
is refused at once, with values that do, before anything is built."""

import os
import re
import subprocess
import sys

import pytest

from bertjax import schedule_fit, usage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shipped(name, argument=""):
  return usage.load_config_file(os.path.join(ROOT, "configs", f"{name}.py"), argument)


def _fits(line):
  """The `--config.x=value` flags a refusal says fit, as {field: value}."""
  fits = line.split("; these fit: ", 1)[1]
  return {field: int(value) for field, value in re.findall(r"--config\.([\w.]+)=(\d+)", fits)}


@pytest.mark.parametrize("name,argument,conflicts", [
    ("modernbert_demo", "", ["train.batch_ramp_steps=300", "optimizer.warmup_steps=300",
                             "optimizer.decay_steps=400"]),
    ("demo", "", ["optimizer.warmup_steps=300"]),
    ("base_pretrain", "", ["optimizer.warmup_steps=10000"]),
    ("large_pretrain", "", ["optimizer.warmup_steps=10000"]),
    ("base_pretrain", "lamb", ["optimizer.warmup_steps=1563"]),
    ("modernbert_pretrain", "", ["train.batch_ramp_steps=", "optimizer.warmup_steps=",
                                 "optimizer.decay_steps="]),
])
def test_a_shortened_run_is_refused_once_with_values_that_fit(name, argument, conflicts):
  config = _shipped(name, argument)
  config.train.total_steps = 100
  line = schedule_fit.misfit(config)
  assert line.startswith("the schedule does not fit in --config.train.total_steps=100: "), line
  for conflict in conflicts:
    assert f"--config.{conflict}" in line.split("; these fit: ")[0], line
  fits = _fits(line)
  assert len(fits) == len(conflicts)
  config.update_from_flattened_dict(fits)
  assert schedule_fit.misfit(config) is None  # what it says fits does


def test_what_fits_also_passes_the_runs_own_checks():
  """The ModernBERT demo at 100 steps with the values the refusal gives: its
  batch-size warmup divides, and its optimizer builds."""
  from bertjax.tasks import pretrain_checks

  config = _shipped("modernbert_demo")
  config.train.total_steps = 100
  config.update_from_flattened_dict(_fits(schedule_fit.misfit(config)))
  pretrain_checks.validate(config, 8)


def test_a_restart_past_the_end_is_named_and_a_run_that_fits_is_not_refused():
  config = _shipped("modernbert_pretrain", "large")
  assert schedule_fit.misfit(config) is None
  config.train.total_steps = 100
  assert "optimizer.restarts (set in the config file) restarts at step" in (
      schedule_fit.misfit(config))
  finetuning = _shipped("glue", "mrpc")
  assert schedule_fit.misfit(finetuning) is None


@pytest.mark.parametrize("config,says", [
    ("modernbert_demo.py", "--config.train.batch_ramp_steps=300 is longer than the run; "
     "--config.optimizer.warmup_steps=300 is the whole run; --config.optimizer.decay_steps=400 "
     "does not fit after the warmup"),
    ("demo.py", "--config.optimizer.warmup_steps=300 is the whole run; these fit: "
     "--config.optimizer.warmup_steps=10 "),
    ("base_pretrain.py", "--config.optimizer.warmup_steps=10000 is the whole run"),
    ("large_pretrain.py", "--config.optimizer.warmup_steps=10000 is the whole run"),
])
def test_the_command_refuses_it_in_one_line_before_anything_is_made(tmp_path, config, says):
  """From another directory: exit 2, one line naming every conflict, and no
  vocabulary, data or workdir."""
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.main", f"--config=configs/{config}",
       f"--workdir={tmp_path / 'run'}", "--config.train.total_steps=100"],
      cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith("error: the schedule does not fit in --config.train.total_steps=100: "
                         + says), line
  assert os.listdir(tmp_path) == []
