"""Weights & Biases (`bertjax.trackers`) in its offline mode: what the metrics
writer writes and the config reach the W&B run, read back from the files W&B
wrote with its own reader (`wandb leet inspect --json`); process 0 only; a
pre-training run killed with SIGKILL goes on as the same W&B run, its steps in
order and each once."""

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from bertjax import errors, metrics, trackers
from tests.tasks.finetuning import set_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
  """W&B writes nothing outside the test's directory and reaches no server."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
  monkeypatch.setenv("WANDB_SILENT", "true")
  yield
  # W&B's client tells the processes started after it where its service is:
  # a run of bertjax started by a later test has a service of its own.
  os.environ.pop("WANDB_SERVICE", None)


def _config(name="glue", **changes):
  """A shipped config with W&B on, offline."""
  from bertjax.configs import demo, demo_finetune

  config = (demo if name == "pretrain" else demo_finetune).get_config()
  return set_fields(config, {"wandb.project": "bertjax-tests", "wandb.mode": "offline",
                             **changes})


def _runs(workdir):
  """Each W&B offline file in the workdir, oldest first: its records as W&B's
  own reader prints them."""
  paths = sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb")))
  runs = []
  for path in paths:
    result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    runs.append([json.loads(line) for line in result.stdout.splitlines()
                 if line.startswith("{")])
  return sorted(runs, key=lambda records: _run_record(records)["start_time"])


def _history(records):
  """step -> the metrics of the step (W&B's own `_` fields left out)."""
  rows = [r["history"] for r in records if r["type"] == "history"]
  return [(row["step"].get("num", 0),
           {k: v for k, v in row["item"].items() if not k.startswith("_")}) for row in rows]


def _run_record(records):
  return next(r["run"] for r in records if r["type"] == "run")


def test_every_metric_and_the_config_reach_the_wandb_run(tmp_path):
  workdir = str(tmp_path / "run")
  writer = metrics.MetricWriter(workdir, config=_config(**{"wandb.tags": ("demo", "tests")}))
  writer.write(10, {"loss": 1.5, "accuracy": 0.25}, "train/")
  writer.write(20, {"loss": 0.75, "accuracy": 0.5}, "train/")
  writer.write(20, {"accuracy": 81.25}, "dev/")
  writer.close()
  (records,) = _runs(workdir)
  assert _history(records) == [
      (10, {"train/loss": 1.5, "train/accuracy": 0.25}),
      (20, {"train/loss": 0.75, "train/accuracy": 0.5, "dev/accuracy": 81.25})]
  run = _run_record(records)
  assert run["project"] == "bertjax-tests" and run["tags"] == ["demo", "tests"]
  config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
  config.update(next(r["config"]["update"] for r in records[::-1] if r["type"] == "config"))
  assert config["train"]["learning_rate"] == 3e-4 and config["data"]["task"] == "stdlib_topics"
  assert config["wandb"]["project"] == "bertjax-tests"
  # A fine-tuning rerun is a run of its own: no id is kept for it.
  assert not os.path.exists(os.path.join(workdir, trackers.RUN_FILE))


def test_only_process_0_writes(tmp_path):
  workdir = str(tmp_path / "run")
  writer = metrics.MetricWriter(workdir, enabled=False, config=_config())
  writer.write(1, {"loss": 1.0}, "train/")
  writer.close()
  assert not os.path.exists(workdir) and not os.path.exists(tmp_path / "wandb_dir")


def test_a_resumed_pretraining_run_goes_on_as_the_same_run_each_step_once(tmp_path):
  """A rerun from the checkpoint of step 3 repeats steps 4 and 5, which W&B holds."""
  workdir = str(tmp_path / "run")
  config = _config("pretrain")
  first = metrics.MetricWriter(workdir, config=config)
  for step in range(1, 6):
    first.write(step, {"loss": 10.0 - step}, "train/")
  first.close()
  run_id = trackers.read_run_id(workdir)
  second = metrics.MetricWriter(workdir, config=config)
  for step in range(4, 9):
    second.write(step, {"loss": 10.0 - step}, "train/")
  second.close()
  before, after = _runs(workdir)
  assert [step for step, _ in _history(before)] == [1, 2, 3, 4, 5]
  assert _history(after) == [(step, {"train/loss": 10.0 - step}) for step in (6, 7, 8)]
  assert _run_record(before)["run_id"] == _run_record(after)["run_id"] == run_id


def test_a_pretraining_run_that_turns_wandb_on_sends_what_it_logged_before(tmp_path):
  workdir = str(tmp_path / "run")
  before = metrics.MetricWriter(workdir, config=_config("pretrain", **{"wandb.project": ""}))
  for step in (1, 2, 3):
    before.write(step, {"loss": 10.0 - step}, "train/")
  before.close()
  writer = metrics.MetricWriter(workdir, config=_config("pretrain"))
  writer.write(2, {"compile_s": 1.0}, "setup/")  # a resume from step 2's checkpoint
  writer.write(3, {"loss": 7.0}, "train/")
  writer.write(4, {"loss": 6.0}, "train/")
  writer.close()
  (records,) = _runs(workdir)
  assert _history(records) == [(step, {"train/loss": 10.0 - step}) for step in (1, 2, 3, 4)]


def test_a_wrong_mode_and_a_missing_client_are_refused_in_one_line(monkeypatch):
  with pytest.raises(errors.UsageError, match=r"^--config.wandb.mode='offlne': give one of "
                                              "online, offline, disabled$"):
    trackers.check(_config(**{"wandb.mode": "offlne"}))
  monkeypatch.setitem(sys.modules, "wandb", None)  # as where it is not installed
  with pytest.raises(errors.MissingDependencyError,
                     match=r"wandb is not installed: pip install 'bertjax\[wandb\]'"):
    trackers.check(_config())
  trackers.check(_config(**{"wandb.project": ""}))  # W&B not asked for: nothing needed


def test_the_command_says_in_one_line_to_install_the_extra_before_it_starts(tmp_path):
  code = ("import sys; sys.modules['wandb'] = None  # as where it is not installed\n"
          "from bertjax import main; main.run()")
  result = subprocess.run(
      [sys.executable, "-c", code, "--config=configs/demo_finetune.py",
       f"--workdir={tmp_path / 'run'}", "--config.wandb.project=bertjax-tests"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: --config.wandb.project is set but wandb is not installed: pip install "
      "'bertjax[wandb]', or leave out --config.wandb.project"]
  assert not os.path.exists(tmp_path / "run")


def test_a_run_killed_with_sigkill_resumes_as_the_same_wandb_run(prepared_dir, tmp_path):
  from tests.tasks import test_pretrain

  workdir = str(tmp_path / "run")
  args = test_pretrain._args(workdir, prepared_dir, **{
      "train.total_steps": 100, "train.long_from_step": -1, "checkpoint.every_steps": 23,
      "eval.every_steps": 50, "wandb.project": "bertjax-tests", "wandb.mode": "offline"})
  env = {**{k: v for k, v in test_pretrain._env().items() if k != "WANDB_SERVICE"}, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
         "WANDB_DIR": str(tmp_path / "wandb_dir")}
  code, log = test_pretrain._start_and_stop(args, env, workdir, 35, signal.SIGKILL)
  assert code == -signal.SIGKILL, log[-3000:]
  rerun = test_pretrain._run(args, env)
  assert f"W&B: going on with run {trackers.read_run_id(workdir)}" in rerun.stderr

  killed, resumed = _runs(workdir)
  assert _run_record(killed)["run_id"] == _run_record(resumed)["run_id"] == trackers.read_run_id(
      workdir)
  steps = [step for records in (killed, resumed) for step, _ in _history(records)]
  assert steps == sorted(set(steps))  # in order, each once, across the kill
  sessions = []  # metrics.jsonl's runs: each a new one where the steps go back
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    record = json.loads(line)
    step = record.pop("step")
    if not sessions or step < max(sessions[-1]):
      sessions.append({})
    sessions[-1].setdefault(step, {}).update(record)
  assert len(sessions) == 2
  first = {}  # step -> its values in the first run that wrote it
  for session in sessions:
    for step, values in session.items():
      first.setdefault(step, values)
  sent = {step: row for records in (killed, resumed) for step, row in _history(records)}
  # Every metric of every step, as metrics.jsonl first has it (W&B's history
  # holds numbers only).
  assert sorted(sent) == sorted(first)
  for step, values in first.items():
    assert sent[step] == pytest.approx(values), step
  assert all("train/loss" in sent[step] for step in range(1, 101))
  assert {"eval/mlm_accuracy", "checkpoint/save_blocking_s"} <= set(sent[100])


def test_a_run_that_fails_or_is_preempted_is_recorded_so_in_wandb(tmp_path):
  """W&B records the exit status a run ends with: 0 when it ends well, the
  command's status when it fails (1: a bug), and a preempted run (143) is
  marked preempting first, one that must end at once too (offline, its files
  are written all the same)."""
  from bertjax import preemption

  workdir = str(tmp_path / "run")
  for error in (None, ValueError("a bug"), SystemExit(143), preemption.ExitAtOnce(143)):
    writer = metrics.MetricWriter(workdir, config=_config("pretrain"))
    writer.close(error)
  ends = [[(r["type"], r.get("exit", {}).get("exit_code", 0)) for r in records
           if r["type"] in ("exit", "preempting")] for records in _runs(workdir)]
  assert ends == [[("exit", 0)], [("exit", 1)], *[[("preempting", 0), ("exit", 143)]] * 2]


def test_a_pretraining_run_that_fails_is_a_failed_wandb_run_and_its_error_surfaces(
    prepared_dir, tmp_path):
  from bertjax import checkpoint
  from bertjax.tasks import pretrain
  from tests.tasks.test_pretrain import _demo_config

  workdir = str(tmp_path / "run")
  settings = {"wandb.project": "bertjax-tests", "wandb.mode": "offline",
              "train.total_steps": 3, "eval.every_steps": 3}
  pretrain.run(_demo_config(prepared_dir, **settings), workdir)
  changed = _demo_config(prepared_dir, **settings, **{"model.intermediate_size": 128})
  with pytest.raises(checkpoint.CheckpointMismatchError) as raised:
    pretrain.run(changed, workdir)  # its checkpoint is of another model
  first, failed = _runs(workdir)
  assert [r["exit"]["exit_code"] for r in first if r["type"] == "exit"] == [0]
  assert [r["exit"]["exit_code"] for r in failed if r["type"] == "exit"] == [
      trackers.exit_status(raised.value)] != [0]


def _cannot_start(monkeypatch, tmp_path):
  """Online W&B with no key to log in with: `wandb.init` fails, as for a
  person who has not run `wandb login`."""
  monkeypatch.delenv("WANDB_MODE")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc
  return _config(**{"wandb.mode": "online"})


def test_a_wandb_run_that_cannot_start_leaves_no_metrics_file_open(monkeypatch, tmp_path):
  config = _cannot_start(monkeypatch, tmp_path)
  workdir = str(tmp_path / "run")
  with pytest.raises(errors.UsageError, match=r"^W&B could not start the run .*wandb login"):
    metrics.MetricWriter(workdir, config=config)
  assert not os.path.exists(os.path.join(workdir, "metrics.jsonl"))
  assert not os.path.exists(os.path.join(workdir, "tensorboard"))


# One of two processes of a run: W&B starts on process 0, then every process
# meets in a collective, as the trainer's do.
_TWO_HOSTS = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from bertjax import hosts, metrics, usage
from tests.test_trackers import _config

process_id, port, workdir = sys.argv[1:]


def main():
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                             process_id=int(process_id))
  writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0,
                                config=_config(**{"wandb.mode": "online"}))
  hosts.barrier("trained")
  writer.close()


usage.run(main)
"""


def test_every_host_stops_in_one_line_when_wandb_cannot_start(monkeypatch, tmp_path):
  from tests.tasks.test_pretrain import _free_port

  _cannot_start(monkeypatch, tmp_path)
  port = _free_port()
  processes = [subprocess.Popen(
      [sys.executable, "-c", _TWO_HOSTS, str(i), str(port), str(tmp_path / "run")], cwd=ROOT,
      env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True) for i in range(2)]
  try:
    stderr = [p.communicate(timeout=120)[1] for p in processes]
  finally:
    for process in processes:
      process.kill()
  assert [p.returncode for p in processes] == [2, 2], stderr
  assert stderr[0].strip().splitlines()[-1].startswith("error: W&B could not start the run (")
  assert stderr[1].strip().splitlines()[-1].startswith(
      "error: starting the W&B run failed on process 0 of 2: W&B could not start the run (")
