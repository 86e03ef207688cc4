"""`python -m bertjax.main` end to end: exact resume after kill -9 and SIGTERM,
two processes against one, config errors, skips, fine-tuning from the run.

The runs are tiny (L2/H32 on the test vocabulary, batches of 8) and long
enough (400 steps, 128 -> 512 switch at 200, scaled down to lengths 32 and 64)
that a kill lands mid-run.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.envs import cpu_env
from tests.tasks.finetuning import set_fields

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOTAL, SWITCH = 400, 200


def _args(workdir, prepared_dir, **overrides):
  settings = {
      "data.dir": prepared_dir, "data.host_sharding": "rows", "data.eval_percent": 10.0,
      "model.vocab_size": 210, "model.hidden_size": 32, "model.num_layers": 2,
      "model.num_heads": 2, "model.intermediate_size": 64, "model.max_position_embeddings": 64,
      "model.hidden_dropout_prob": 0.1, "model.attention_dropout_prob": 0.1,
      "train.batch_size": 8, "train.total_steps": TOTAL, "train.max_seq_length": 32,
      "train.max_predictions": 5, "train.long_from_step": SWITCH, "train.long_seq_length": 64,
      "train.long_max_predictions": 10, "optimizer.warmup_steps": 20,
      "checkpoint.every_steps": 23, "eval.every_steps": 100, "eval.batches": 2,
      "eval.batch_size": 8, "log_every_steps": 1, **overrides}
  return ([sys.executable, "-m", "bertjax.main", "--config=configs/demo.py",
           f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in settings.items()])


def _env(devices=4):
  return cpu_env(devices)


def _losses(workdir):
  """step -> every logged training loss of that step (reruns log a step again)."""
  losses = {}
  path = os.path.join(workdir, "metrics.jsonl")
  for line in open(path, encoding="utf-8"):
    record = json.loads(line)
    if "train/loss" in record:
      losses.setdefault(record["step"], []).append(record["train/loss"])
  return losses


def _run(args, env, timeout=600):
  result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
  assert result.returncode == 0, result.stderr[-4000:]
  return result


def _logged_step(path):
  """The last training step in a metrics file being written (a last line may be partial)."""
  last = 0
  for line in open(path, encoding="utf-8"):
    if line.endswith("\n") and "train/loss" in line:
      last = max(last, json.loads(line)["step"])
  return last


def _start_and_stop(args, env, workdir, at_step, sig):
  """Starts a run and sends `sig` once it has logged `at_step`; returns (exit code, log)."""
  log_path = os.path.join(workdir + ".log")
  with open(log_path, "w") as log:  # a file, not a pipe nobody reads while polling
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=log)
    path = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
      if os.path.exists(path) and _logged_step(path) >= at_step:
        process.send_signal(sig)
        break
      time.sleep(0.02)
    process.wait(timeout=600)
  return process.returncode, open(log_path).read()


@pytest.fixture(scope="module")
def uninterrupted(prepared_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  _run(_args(workdir, prepared_dir), _env())
  return workdir


def test_demo_config_trains_and_evaluates(uninterrupted):
  losses = _losses(uninterrupted)
  assert sorted(losses) == list(range(1, TOTAL + 1))
  records = [json.loads(line) for line in open(os.path.join(uninterrupted, "metrics.jsonl"))]
  evals = [r for r in records if "eval/mlm_accuracy" in r]
  assert [r["step"] for r in evals] == [100, 200, 300, 400]
  train = {r["step"]: r for r in records if "train/loss" in r}
  assert train[SWITCH]["train/max_seq_length"] == 32 and train[SWITCH + 1][
      "train/max_seq_length"] == 64
  for name in ("train/mfu", "train/tokens_per_s", "train/learning_rate", "train/grad_norm",
               "train/nsp_accuracy", "train/eta_s"):
    assert name in train[50], name
  # Evaluation is left out of the throughput of the steps around it.
  rates = [train[s]["train/tokens_per_s"] for s in range(2, TOTAL + 1)]
  for step in (100, 200, 300, 101, 201, 301):
    assert train[step]["train/tokens_per_s"] < 5 * np.median(rates), step
  # It learns: the masked LM beats its first steps clearly.
  assert np.mean([train[s]["train/loss"] for s in range(1, 11)]) > np.mean(
      [train[s]["train/loss"] for s in range(190, 201)]) + 0.5
  assert evals[-1]["eval/mlm_accuracy"] > 0.1
  setup = [r for r in records if "setup/compile_s" in r]
  assert len(setup) == 2 and "setup/temp_size" in setup[0]
  saved = json.load(open(os.path.join(uninterrupted, "config.json")))
  assert saved["train"]["total_steps"] == TOTAL and saved["model"]["hidden_size"] == 32
  assert os.listdir(os.path.join(uninterrupted, "tensorboard"))


def _saved_steps(workdir):
  return sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())


@pytest.mark.parametrize("every,kill_at", [
    (23, 60),            # restores mid-way through the first phase
    (SWITCH, SWITCH + 10),  # restores the checkpoint taken at the 32 -> 64 switch
])
def test_kill_and_restart_reproduces_every_loss_exactly(uninterrupted, prepared_dir, tmp_path,
                                                        every, kill_at):
  expected = {step: values[0] for step, values in _losses(uninterrupted).items()}
  workdir = str(tmp_path)
  args = _args(workdir, prepared_dir, **{"checkpoint.every_steps": every})
  code, _ = _start_and_stop(args, _env(), workdir, kill_at, signal.SIGKILL)
  assert code == -signal.SIGKILL
  killed_at = max(_losses(workdir))
  assert kill_at <= killed_at < TOTAL
  restart_from = _saved_steps(workdir)[-1]
  if every == SWITCH and killed_at < 2 * SWITCH:
    assert restart_from == SWITCH
  _run(args, _env())
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL + 1))
  for step, values in losses.items():
    assert values == [expected[step]] * len(values), step  # bit-identical, reruns included
  # The steps after the restored checkpoint ran twice, with the same losses.
  assert all(len(losses[s]) == 2 for s in range(restart_from + 1, killed_at + 1))


def test_static_masking_from_the_config_runs_and_resumes_exactly(uninterrupted, prepared_dir,
                                                                 tmp_path):
  """`data.static`: both phases' instances masked once into the data directory
  before training (lengths 32 and 64 here), then read; a kill and a rerun
  (which reuses them) give every loss of an uninterrupted static run."""
  import shutil

  data = str(tmp_path / "data")
  shutil.copytree(prepared_dir, data)
  static = {"data.dir": data, "data.static": True, "data.static_dupe_factor": 2,
            "train.total_steps": 40, "train.long_from_step": 20, "eval.every_steps": 20,
            "checkpoint.every_steps": 10}
  whole = str(tmp_path / "whole")
  _run(_args(whole, data, **static), _env())
  assert sorted(n for n in os.listdir(data) if n.endswith("_info.json")) == [
      "dataset_info.json", "instances32_info.json", "instances64_info.json"]
  built = {n: os.path.getmtime(os.path.join(data, n)) for n in os.listdir(data)
           if n.startswith("instances") and n.endswith(".array_record")}
  expected = {step: values[0] for step, values in _losses(whole).items()}
  assert sorted(expected) == list(range(1, 41))
  # Step 1 (learning rate 0) is the same model on another batch than the
  # dynamic pipeline's: the static instances were read.
  assert expected[1] != _losses(uninterrupted)[1][0]

  workdir = str(tmp_path / "killed")
  args = _args(workdir, data, **static)
  code, _ = _start_and_stop(args, _env(), workdir, 25, signal.SIGKILL)
  assert code == -signal.SIGKILL
  _run(args, _env())
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, 41))
  for step, values in losses.items():
    assert values == [expected[step]] * len(values), step
  assert {n: os.path.getmtime(os.path.join(data, n)) for n in built} == built  # reused


def test_packed_rows_train_log_real_throughput_and_resume_exactly(uninterrupted, prepared_dir,
                                                                  tmp_path):
  """Rows of up to 3 sequences (both phases): fewer padding slots than the
  unpacked run, throughput of real tokens and MFU logged; a preemption and a
  rerun (which asks for other loader processes, and keeps the checkpoint's)
  give every loss of the uninterrupted packed run."""
  packed = {"data.max_sequences_per_row": 3, "data.packing_window": 200,
            "train.total_steps": 40, "train.long_from_step": 20, "eval.every_steps": 20,
            "checkpoint.every_steps": 10}
  whole = str(tmp_path / "whole")
  result = _run(_args(whole, prepared_dir, **packed), _env())
  assert "Input pipeline: 0 worker process(es) for length 32" in result.stderr
  records = [json.loads(line) for line in open(os.path.join(whole, "metrics.jsonl"))]
  train = {r["step"]: r for r in records if "train/loss" in r}
  unpacked = {r["step"]: r for r in map(json.loads, open(os.path.join(
      uninterrupted, "metrics.jsonl"))) if "train/loss" in r}
  # At 64 tokens the rows hold more than one sequence (at 32, 5 masked
  # positions a row leave no room for another pair's).
  padding = lambda run, first: np.mean([run[s]["train/padding"] for s in range(first, first + 20)])
  packed_64, unpacked_64 = padding(train, 21), padding(unpacked, SWITCH + 1)
  assert packed_64 < 0.5 * unpacked_64, (packed_64, unpacked_64)
  assert train[30]["train/sequences_per_s"] > 1.1 * train[30]["train/tokens_per_s"] / 64
  for step in (10, 30):
    assert train[step]["train/real_tokens_per_s"] <= train[step]["train/tokens_per_s"]
    assert 0 <= train[step]["train/input_wait"] <= 1 and train[step]["train/mfu"] > 0
  expected = {step: values[0] for step, values in _losses(whole).items()}
  assert sorted(expected) == list(range(1, 41))
  evals = [r for r in records if "eval/nsp_accuracy" in r]
  assert [r["step"] for r in evals] == [20, 40]

  workdir = str(tmp_path / "killed")
  code, _ = _start_and_stop(_args(workdir, prepared_dir, **packed), _env(), workdir, 33,
                            signal.SIGTERM)
  assert code == 143 and 20 < _saved_steps(workdir)[-1] < 40  # saved in the second phase
  result = _run(_args(workdir, prepared_dir, **packed, **{"data.worker_count": 2}), _env())
  assert "data.worker_count=2, but the checkpoint's loader position is of 0" in result.stderr
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, 41))
  for step, values in losses.items():
    assert values == [expected[step]] * len(values), step


def test_sigterm_saves_exits_and_resumes(uninterrupted, prepared_dir, tmp_path):
  expected = {step: values[0] for step, values in _losses(uninterrupted).items()}
  workdir = str(tmp_path)
  args = _args(workdir, prepared_dir)
  code, stderr = _start_and_stop(args, _env(), workdir, SWITCH + 30, signal.SIGTERM)
  assert code == 143, stderr[-3000:]
  assert "Preempted: checkpoint saved at step" in stderr
  stopped = max(_losses(workdir))
  assert _saved_steps(workdir)[-1] == stopped  # saved at the step it stopped at
  _run(args, _env())
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL + 1))
  for step, values in losses.items():
    assert values == [expected[step]], step  # nothing ran twice


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one(uninterrupted, prepared_dir, tmp_path):
  expected = {step: values[0] for step, values in _losses(uninterrupted).items()}
  port = _free_port()
  workdir = str(tmp_path)
  processes = [subprocess.Popen(
      _args(workdir, prepared_dir, **{"train.total_steps": 60, "train.long_from_step": 30})
      + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=ROOT, env={**_env(devices=2), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"},
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=600)[1] for p in processes]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output[-4000:]
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, 61))
  # The same global batches over the same 4-device mesh; the all-reduces cross
  # a process boundary, so float32 sums may round differently. (Past the
  # 20 warmup steps the schedules differ: this run is shorter.)
  np.testing.assert_allclose([losses[s][0] for s in range(1, 21)],
                             [expected[s] for s in range(1, 21)], rtol=2e-5)


def test_fine_tuning_takes_the_encoder_from_the_run(uninterrupted, caplog):
  import jax

  import bertjax

  with caplog.at_level("WARNING"):
    bundle = bertjax.load_pretrained(uninterrupted, task="sequence_classification",
                                     labels=["a", "b"])
  assert "initialised randomly: classifier/bias, classifier/kernel" in caplog.text
  assert "cls.predictions" in caplog.text  # the pre-training heads it left out
  pretrained = bertjax.load_pretrained(uninterrupted)
  from bertjax import checkpoint
  _, step, params = checkpoint.params_from_run(uninterrupted)
  assert step == TOTAL
  jax.tree.map(np.testing.assert_array_equal, params["bert"], pretrained.params["bert"])
  assert pretrained.task == "pretraining" and pretrained.tokenizer is not None
  jax.tree.map(np.testing.assert_array_equal, bundle.params["bert"], pretrained.params["bert"])
  features = bertjax.encode(pretrained, ["the quick brown fox"])
  assert features["sequence_output"].shape[2] == 32


def _demo_config(prepared_dir, **changes):
  from bertjax.configs import demo

  config = demo.get_config()
  config.data.dir = prepared_dir
  config.model.vocab_size = 210
  config.model.hidden_size, config.model.num_heads = 32, 2
  config.model.intermediate_size = 64
  config.train.batch_size, config.eval.batch_size = 8, 8
  config.train.max_seq_length, config.train.max_predictions = 32, 5
  config.train.total_steps, config.optimizer.warmup_steps = 10, 2
  return set_fields(config, changes)


@pytest.mark.parametrize("changes,message", [
    ({"train.batch_size": 12}, "micro-batch of 12 sequences .* does not divide over the 8 data "
                               "shards"),
    ({"train.accumulation_steps": 3}, "train.batch_size=8 is not divisible by "
                                      "train.accumulation_steps=3"),
    ({"mesh.data": 3, "mesh.fsdp": -1}, "mesh sizes .* do not divide the 8 devices"),
    ({"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 1}, "cover 4 devices, but there are 8"),
    ({"model.num_heads": 3}, "hidden_size=32 is not divisible by num_heads=3"),
    ({"train.max_seq_length": 256}, "sequence length 256 is above the model's "
                                    "max_position_embeddings=128"),
    ({"train.max_predictions": 2}, "max_predictions=2 is too small for masked_lm_prob=0.15 at "
                                   "max_seq_length=32"),
    ({"optimizer.warmup_steps": 10}, r"total_steps=10: --config.optimizer.warmup_steps=10 is "
                                     "the whole run"),
    ({"optimizer.warmup_steps": -1}, "optimizer.warmup_steps=-1: must be >= 0"),
])
def test_config_errors_before_compiling(prepared_dir, changes, message):
  from bertjax.tasks import pretrain

  with pytest.raises(ValueError, match=message):
    pretrain.validate(_demo_config(prepared_dir, **changes), 8)


def test_throughput_leaves_out_checkpoints_and_holds_at_interval_ends(prepared_dir, tmp_path):
  """The steps after a checkpoint save (each slowed by 3 s here) report the
  rate of the steps alone: the save's time is left out (and logged), from the
  one-step windows and from the interval averaged at an evaluation. With
  synchronous CPU dispatch, each step runs as it is launched, which shifts
  every fetch-to-fetch window. (A step here takes about 15 ms, a few times
  that on a busy machine: a save counted in would add 3 s to a one-step
  window and 0.6 s a step to a five-step interval.)"""
  workdir = str(tmp_path / "run")
  args = _args(workdir, prepared_dir, **{"train.total_steps": 20, "eval.every_steps": 5,
                                         "train.long_from_step": -1,
                                         "optimizer.warmup_steps": 5,
                                         "checkpoint.every_steps": 5})
  slow_save_main = (
      "import time, jax; jax.config.update('jax_cpu_enable_async_dispatch', False)\n"
      "from bertjax import checkpoint, main\n"
      "save = checkpoint.Checkpointer.save\n"
      "def slow_save(*args, **kwargs):\n"
      "  time.sleep(3)\n"
      "  return save(*args, **kwargs)\n"
      "checkpoint.Checkpointer.save = slow_save\n"
      "main.run()")
  _run([sys.executable, "-c", slow_save_main, *args[3:]], _env())
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  seconds = {r["step"]: 8 * 32 / r["train/tokens_per_s"] for r in records if "train/loss" in r}
  saves = {r["step"]: r["checkpoint/save_blocking_s"] for r in records
           if "checkpoint/save_blocking_s" in r}
  assert sorted(saves) == [5, 10, 15, 20] and min(saves.values()) >= 3
  for step in (6, 11, 16):  # one-step windows that begin with a save
    assert seconds[step] < 1.5, (step, seconds)
  for step in (10, 15, 20):  # intervals since an evaluation, with a save at their start
    assert seconds[step] < 0.3, (step, seconds)


def test_a_vocabulary_larger_than_the_embeddings_is_refused(prepared_dir):
  from bertjax.data import shards
  from bertjax.tasks import pretrain_data

  data_vocab = shards.read_info(prepared_dir)["vocab_size"]
  pretrain_data.check_vocabulary(_demo_config(prepared_dir), prepared_dir)
  pretrain_data.check_vocabulary(_demo_config(prepared_dir, **{"model.vocab_size": 256}),
                                 prepared_dir)  # a padded table is fine
  with pytest.raises(ValueError, match=f"prepared with a {data_vocab}-token vocabulary, larger "
                                       f"than model.vocab_size=200: set "
                                       f"--config.model.vocab_size={data_vocab}"):
    pretrain_data.check_vocabulary(_demo_config(prepared_dir, **{"model.vocab_size": 200}),
                                   prepared_dir)


def test_a_checkpoint_of_another_shape_is_refused(uninterrupted, prepared_dir, tmp_path):
  result = subprocess.run(_args(uninterrupted, prepared_dir, **{"model.hidden_size": 64}),
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
  assert result.returncode != 0
  assert "the checkpoint does not fit this run's model and optimizer" in result.stderr


def test_consecutive_non_finite_steps_stop_the_run(prepared_dir, tmp_path, monkeypatch):
  from bertjax.data import loader
  from bertjax.tasks import pretrain

  original = loader.make_dataset

  def poisoned(config, *args, **kwargs):
    def poison(batch):
      return {**batch, "masked_weights": batch["masked_weights"] * np.nan}
    return original(config, *args, **kwargs).map(poison)

  monkeypatch.setattr(loader, "make_dataset", poisoned)
  config = _demo_config(prepared_dir, max_consecutive_skips=3, log_every_steps=1)
  with pytest.raises(FloatingPointError, match="3 consecutive steps had a non-finite loss"):
    pretrain.run(config, str(tmp_path))
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["train/skipped_total"] for r in records if "train/skipped_total" in r] == [1, 2]


def test_profile_switch_writes_a_trace(prepared_dir, tmp_path):
  from bertjax.tasks import pretrain

  config = _demo_config(prepared_dir, **{"profile.start_step": 2, "profile.num_steps": 3,
                                         "train.total_steps": 6, "eval.every_steps": 0})
  pretrain.run(config, str(tmp_path))
  traces = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "profile") for f in files]
  assert any(f.endswith(".xplane.pb") for f in traces), traces


def test_a_run_says_how_fast_it_goes_10_steps_in_and_ends_with_a_held_out_evaluation(
    prepared_dir, tmp_path):
  """The first line comes 10 steps into each session (not after the first
  `log_every_steps`), and a run whose length is no multiple of
  `eval.every_steps` is evaluated at its last step all the same."""
  from bertjax.tasks import pretrain

  import jax

  config = _demo_config(prepared_dir, **{"train.total_steps": 25, "log_every_steps": 100,
                                         "eval.every_steps": 100, "eval.batches": 1,
                                         "checkpoint.every_steps": 20,
                                         "price_per_chip_hour": 2.5})
  workdir = str(tmp_path)
  pretrain.run(config, workdir)
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records if "train/eta_s" in r] == [10, 25]
  first = next(r for r in records if "train/eta_s" in r)  # the rest of the run, priced
  assert first["train/cost_left"] == pytest.approx(
      first["train/eta_s"] / 3600 * jax.device_count() * 2.5)
  # The time left: 15 steps, and the evaluation at step 25 (8 rows forward,
  # a third of a step's FLOPs a row, before one is timed).
  seconds_per_step = 8 * 32 / first["train/tokens_per_s"]
  assert first["train/eta_s"] == pytest.approx((15 + 1 / 3) * seconds_per_step)
  assert first["train/other_processes_cores"] >= 0  # measured during its steps (Linux)
  assert [r["step"] for r in records if "eval/mlm_accuracy" in r] == [25]
  config.train.total_steps = 40  # a rerun goes on from step 25's checkpoint
  pretrain.run(config, workdir)
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records if "train/eta_s" in r] == [10, 25, 35, 40]


def test_a_cpu_run_measures_its_peak_again_and_keeps_the_best(prepared_dir, tmp_path,
                                                              monkeypatch):
  """MFU on a CPU is against the best matmul rate seen (bertjax.flops): the run
  measures it again now and then, and each line divides by the latest best."""
  from bertjax import flops
  from bertjax.tasks import pretrain
  from tests.tasks.finetuning import tiny_pretrain_config

  rates = iter([0.5, 0.25, 1.0, 0.75] + [1.0] * 100)
  measured = []

  def peak(dtype="float32"):
    measured.append(next(rates))
    return max(measured), "a test's rates"

  monkeypatch.setattr(flops, "cpu_peak_tflops", peak)
  monkeypatch.setattr(pretrain, "_CPU_PEAK_EVERY_SECONDS", 0.0)  # at every progress line
  workdir = str(tmp_path / "run")
  pretrain.run(tiny_pretrain_config(prepared_dir, **{"checkpoint.every_steps": 30}), workdir)
  lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))
           if '"train/mfu"' in line]
  assert len(lines) >= 3 and len(measured) == len(lines) + 1  # the start, then each line
  for line, best in zip(lines, [max(measured[:i + 2]) for i in range(len(lines))]):
    assert line["train/mfu"] == pytest.approx(line["train/tflops_per_s_per_device"] / best)
