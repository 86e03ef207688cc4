"""The learning-rate x seed sweep: every pair runs once, the best dev run wins."""

import json
import os
import subprocess
import sys

from tests.envs import cpu_env
from tests.tasks.test_glue import write_sst2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sweep_runs_each_pair_selects_on_dev_and_resumes(tiny_hf_checkpoint, tmp_path):
  data = str(tmp_path / "SST-2")
  write_sst2(data, train=128, dev=64, test=4)
  workdir = str(tmp_path / "sweep")
  command = [sys.executable, "-m", "bertjax.tools.sweep", "--config=configs/glue.py:sst2",
             f"--workdir={workdir}", f"--config.init_checkpoint={tiny_hf_checkpoint}",
             f"--config.data.dir={data}", "--config.model.dtype=float32",
             "--config.max_seq_length=16", "--config.train.epochs=2",
             "--learning_rates=3e-3,1e-6", "--seeds=0,1"]
  env = cpu_env(2)
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.load(open(os.path.join(workdir, "sweep.json")))
  runs = summary["runs"]
  assert [(r["learning_rate"], r["seed"]) for r in runs] == [
      (3e-3, 0), (3e-3, 1), (1e-6, 0), (1e-6, 1)]
  for run in runs:
    results = json.load(open(os.path.join(run["workdir"], "results.json")))
    assert run["dev"] == results["dev"]["accuracy"] and run["metric"] == "accuracy"
    config = json.load(open(os.path.join(run["workdir"], "config.json")))
    assert (config["train"]["learning_rate"], config["seed"]) == (run["learning_rate"],
                                                                 run["seed"])
  assert summary["best"]["dev"] == max(r["dev"] for r in runs)
  # Different seeds are different restarts (output layer, data order, dropout).
  def losses(run):
    lines = open(os.path.join(run["workdir"], "metrics.jsonl")).read().splitlines()
    return [json.loads(line)["train/loss"] for line in lines if "train/loss" in line]
  assert losses(runs[0]) != losses(runs[1])
  table = open(os.path.join(workdir, "sweep.md")).read()
  assert "| learning rate | seed | dev accuracy |" in table and "(best)" in table
  assert "| 0.003 | 2 |" in table  # the per-rate summary

  # A rerun reads the finished runs instead of training again.
  again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
  assert again.returncode == 0 and again.stderr.count("done before") == 4

  # Another checkpoint: the finished runs are not this sweep's, and are refused
  # before anything runs.
  import shutil

  other = str(tmp_path / "other_checkpoint")
  shutil.copytree(tiny_hf_checkpoint, other)
  before = {run["workdir"]: os.path.getmtime(os.path.join(run["workdir"], "results.json"))
            for run in runs}
  table = open(os.path.join(workdir, "sweep.json")).read()
  moved = [arg for arg in command if not arg.startswith("--config.init_checkpoint=")]
  moved.append(f"--config.init_checkpoint={other}")
  refused = subprocess.run(moved, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert "Traceback" not in refused.stderr and "done before" not in refused.stderr
  line = refused.stderr.strip().splitlines()[-1]
  first = os.path.join(workdir, "lr0.003_seed0")
  assert line.startswith(f"error: {first} holds a finished run of other settings "
                         f"(init_checkpoint: {tiny_hf_checkpoint} then, {other} now)"), line
  assert "the 3 other runs" in line and "another --workdir" in line, line
  assert open(os.path.join(workdir, "sweep.json")).read() == table
  assert {w: os.path.getmtime(os.path.join(w, "results.json")) for w in before} == before


def test_a_run_stopped_while_its_model_is_saved_is_not_taken_as_done(tiny_hf_checkpoint,
                                                                     tmp_path, monkeypatch):
  """results.json is written last: a run stopped before it (here while its
  model is saved) is run again by the sweep, never read as finished."""
  import pytest

  from bertjax.tasks import glue
  from bertjax.tools import sweep
  from tests.tasks.test_glue import _glue_config

  data = str(tmp_path / "SST-2")
  write_sst2(data, train=64, dev=32, test=4)
  config = _glue_config("sst2", tiny_hf_checkpoint, data, **{"train.epochs": 1.0})
  saved = glue.save_pretrained

  def stopped(*args, **kwargs):
    raise KeyboardInterrupt  # Ctrl-C (or SIGTERM, SIGHUP) as the model is written

  monkeypatch.setattr(glue, "save_pretrained", stopped)
  workdir = str(tmp_path / "sweep")
  with pytest.raises(KeyboardInterrupt):
    sweep.sweep(config, workdir, [3e-3], [0])
  run = os.path.join(workdir, sweep.run_name(3e-3, 0))
  assert not os.path.exists(os.path.join(run, "results.json"))
  monkeypatch.setattr(glue, "save_pretrained", saved)
  summary = sweep.sweep(config, workdir, [3e-3], [0])
  assert os.path.isdir(os.path.join(run, "model"))
  assert summary["runs"][0]["dev"] == json.load(open(os.path.join(run, "results.json")))[
      "dev"]["accuracy"]


def test_a_rate_or_seed_outside_its_fields_range_is_refused_before_any_run(tmp_path):
  workdir = tmp_path / "sweep"
  for flag, said in (("--learning_rates=2e-5,-1e-5", "--learning_rates: -1e-05 must be > 0, as "
                      "each run's config.train.learning_rate"),
                     ("--seeds=0,-1", "--seeds: -1 must be >= 0, as each run's config.seed")):
    result = subprocess.run([sys.executable, "-m", "bertjax.tools.sweep",
                             "--config=configs/glue.py:rte", f"--workdir={workdir}", flag],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [f"error: {said} (--verbosity=1 shows where)"]
    assert not workdir.exists()
