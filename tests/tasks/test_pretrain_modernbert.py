"""ModernBERT's recipe through `python -m bertjax.main`: configs/modernbert_pretrain.py
scaled down (L4/H32 on the test vocabulary, two devices), its batch-size
warmup (2, 4, 6 rows a step, then 8), its two phases (the rotary base raised
and a batch of its own for the long phase), StableAdamW and the
warmup-stable-decay schedule with a restart, exact resume after kill -9 in
the warmup and in the long phase, and the run's model exported to transformers.
"""

import json
import os
import signal
import sys

import numpy as np
import pytest

from tests.tasks.test_pretrain import ROOT, _env, _losses, _run, _saved_steps, _start_and_stop

TOTAL, SWITCH, DECAY, RAMP, RESTART = 90, 50, 20, 24, 40


def _args(workdir, prepared_dir, **overrides):
  settings = {
      "data.dir": prepared_dir, "data.host_sharding": "rows", "data.eval_percent": 10.0,
      "data.vocab_size": 210, "data.shuffle_window": 200,
      "model.vocab_size": 210, "model.hidden_size": 32, "model.num_layers": 4,
      "model.num_heads": 2, "model.intermediate_size": 48, "model.max_position_embeddings": 64,
      "model.local_attention": 8, "model.dtype": "float32",
      "train.batch_size": 8, "train.long_batch_size": 16, "train.accumulation_steps": 4,
      "train.batch_ramp_start": 2, "train.batch_ramp_steps": RAMP, "train.total_steps": TOTAL,
      "train.max_seq_length": 32, "train.max_predictions": 23, "train.long_from_step": SWITCH,
      "train.long_seq_length": 64, "train.long_max_predictions": 38,
      "optimizer.warmup_steps": 10, "optimizer.decay_steps": DECAY,
      "optimizer.learning_rate": 2e-3, "optimizer.long_learning_rate": 1e-3,
      "optimizer.restarts": f"(({RESTART}, 1.5e-3, 2e-5),)",
      "checkpoint.every_steps": 15, "eval.every_steps": 45, "eval.batches": 2,
      "eval.batch_size": 8, "log_every_steps": 1, **overrides}
  return ([sys.executable, "-m", "bertjax.main", "--config=configs/modernbert_pretrain.py",
           f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in settings.items()])


@pytest.fixture(scope="module")
def uninterrupted(prepared_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("modernbert"))
  result = _run(_args(workdir, prepared_dir), _env(2))
  return workdir, result.stderr


def _records(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def test_the_recipe_runs_both_phases(uninterrupted):
  workdir, log = uninterrupted
  assert "Phase 0: steps 0-50 at length 32, 8 rows a step" in log
  assert "Batch-size warmup: 2, 4, ... 6 a step over steps 0-24, then 8" in log
  for rows in (2, 4, 6, 8):  # one program for each batch size of the warmup
    assert f"Compiled the step for length 32 ({rows} a step)" in log
  assert ("Restart at step 40 (optimizer.restarts[0]): learning rate 0.0015, weight decay 2e-05, "
          "the optimizer's moments kept") in log
  assert "Phase 1: steps 50-90 at length 64, 16 rows a step, global_rope_theta=160000.0" in log
  assert "Compiled the step for length 64 (16 a step)" in log
  train = {r["step"]: r for r in _records(workdir) if "train/loss" in r}
  assert sorted(train) == list(range(1, TOTAL + 1))
  assert train[SWITCH]["train/max_seq_length"] == 32
  assert train[SWITCH + 1]["train/max_seq_length"] == 64
  # One sequence a document, its first tokens (most of the test's documents
  # fill a 32-token row alone); packed rows take the shorter ones in twos.
  per_row = [train[s]["train/sequences_per_s"] * 32 / train[s]["train/tokens_per_s"]
             for s in range(5, SWITCH)]
  assert np.median(per_row) == pytest.approx(1.0) and max(per_row) > 1.05
  # Warmup to 2e-3, the plateau, 1.5e-3 from the restart, 1e-3 from the
  # switch, then 1-sqrt to 0.1% of it.
  rate = lambda step: train[step + 1]["train/learning_rate"]  # logged: the step's own
  assert rate(5) == pytest.approx(1e-3) and rate(RESTART - 1) == pytest.approx(2e-3)
  assert rate(RESTART) == pytest.approx(1.5e-3) and rate(SWITCH - 1) == pytest.approx(1.5e-3)
  assert rate(SWITCH) == pytest.approx(1e-3) and rate(TOTAL - DECAY) == pytest.approx(1e-3)
  assert rate(TOTAL - 5) == pytest.approx(1e-3 * (0.001 + 0.999 * (1 - np.sqrt(15 / 20))))
  first, last = (np.mean([train[s]["train/loss"] for s in steps])
                 for steps in (range(1, 6), range(SWITCH - 5, SWITCH)))
  assert last < first - 0.5  # it learns
  saved = json.load(open(os.path.join(workdir, "config.json")))
  assert saved["model"]["family"] == "modernbert" and saved["optimizer"]["name"] == "stableadamw"


@pytest.mark.parametrize("kill_at,resumed", [
    (17, (0, RAMP)),             # in the batch-size warmup
    (SWITCH + 25, (SWITCH, TOTAL)),  # in the long phase
])
def test_kill_and_restart_reproduces_every_loss(uninterrupted, prepared_dir, tmp_path, kill_at,
                                                resumed):
  expected = {step: values[0] for step, values in _losses(uninterrupted[0]).items()}
  workdir = str(tmp_path)
  args = _args(workdir, prepared_dir, **{"checkpoint.every_steps": 5})
  code, _ = _start_and_stop(args, _env(2), workdir, kill_at, signal.SIGKILL)
  assert code == -signal.SIGKILL
  killed_at = max(_losses(workdir))
  restart_from = _saved_steps(workdir)[-1]
  assert resumed[0] < restart_from <= killed_at < resumed[1]
  _run(args, _env(2))
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL + 1))
  for step, values in losses.items():
    assert values == [expected[step]] * len(values), step  # bit-identical, reruns included


def test_the_run_exports_its_long_phase_model_to_transformers(uninterrupted, tmp_path):
  import torch
  import transformers

  import bertjax

  workdir, _ = uninterrupted
  bundle = bertjax.load_pretrained(workdir)
  assert bundle.config.global_rope_theta == 160_000.0  # as the last phase computed
  out = str(tmp_path / "hf")
  result = _run([sys.executable, "-m", "bertjax.tools.convert", f"--input={workdir}",
                 "--to=hf", f"--output={out}"], _env(1))
  assert "masked_lm model" in result.stdout
  saved = json.load(open(os.path.join(out, "config.json")))
  assert saved["rope_parameters"]["full_attention"]["rope_theta"] == 160_000.0
  model = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager")
  ids = bundle.tokenizer.encode("the quick brown fox", "jumps over the dog")
  ours = bundle.model().apply({"params": bundle.params}, np.asarray([ids]))["mlm_logits"]
  with torch.no_grad():
    theirs = model(torch.tensor([ids])).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)
  assert os.path.isdir(ROOT)


def _packer_sizes(min_size, max_size, warmup_tokens, tokens_per_unit, steps):
  """The batch size (in units of the first) of each step under ModernBERT's
  `BatchSizeWarmupScheduler` (src/sequence_packer.py), transcribed: sizes
  `range(min_size, max_size)`, each until a token threshold in proportion to
  the sizes so far, then `max_size` once the warmup's tokens are counted;
  each step counts the tokens of its full rows."""
  import math

  total = sum(range(min_size, max_size))
  thresholds, cumsum = [], 0
  for size in range(min_size, max_size):
    cumsum += size
    thresholds.append(math.ceil(warmup_tokens / total * cumsum))
  sizes, counted = [], 0
  for _ in range(steps):
    size = max_size if counted >= warmup_tokens else next(
        (min_size + i for i, t in enumerate(thresholds) if counted < t), max_size)
    sizes.append(size)
    counted += size * tokens_per_unit
  return sizes


@pytest.mark.parametrize("start,batch,stage_steps", [(8, 48, 5), (448, 4928, 3), (4, 8, 7)])
def test_the_warmup_steps_through_the_sizes_as_modernberts_packer(start, batch, stage_steps):
  """1, 2, ... of the first batch, each for an equal run of steps, up to one
  short of the whole batch, which comes once the warmup's tokens are used:
  step for step the sizes of ModernBERT's packer, with `batch_ramp_steps` as
  the config computes it from those tokens (their steps at half the batch)."""
  from bertjax.phases import Phase

  length, full = 128, batch // start
  warmup_tokens = sum(range(1, full)) * stage_steps * start * length
  ramp_steps = round(warmup_tokens / (batch // 2 * length))
  phase = Phase(0, 0, 10 * ramp_steps, length, 20, batch, ramp_start=start,
                ramp_steps=ramp_steps)
  steps = ramp_steps + 10
  assert phase.loader_batch == start
  assert [phase.parts(step) for step in range(steps)] == _packer_sizes(
      1, full, warmup_tokens, start * length, steps)
  assert Phase(1, 100, 200, 512, 80, 48).parts(150) == 1  # no warmup: whole batches


def test_the_recipes_warmup_is_modernberts():
  """ModernBERT-base: 768, ... 3,840 sequences, 4,238-4,239 steps each (50B
  tokens of 1,024-token rows), then 4,608."""
  from bertjax.configs import modernbert_pretrain
  from bertjax.phases import phases

  phase = phases(modernbert_pretrain.get_config())[0]
  sizes = [phase.parts(step) * phase.loader_batch for step in range(phase.ramp_steps + 1)]
  runs = {size: sizes.count(size) for size in sorted(set(sizes))}
  assert list(runs) == [768, 1536, 2304, 3072, 3840, 4608]
  assert all(4238 <= runs[size] <= 4239 for size in list(runs)[:-1])
  tokens = sum(sizes[:-1]) * 1024
  assert tokens == pytest.approx(50e9, rel=1e-4)


@pytest.mark.parametrize("changes, says", [
    ({"train.batch_ramp_start": 5}, "must divide train.batch_size=4608"),
    ({"train.batch_ramp_start": 9}, "batch of 9 rows does not divide"),  # over 8 devices
    ({"train.batch_ramp_steps": 10**7}, "is longer than the first phase"),
    ({"objective": "mlm_nsp"}, "ModernBERT pre-trains with masked LM only"),
])
def test_warmup_settings_that_cannot_run_are_refused(changes, says):
  from bertjax import errors
  from bertjax.configs import modernbert_pretrain
  from bertjax.tasks import pretrain

  config = modernbert_pretrain.get_config()
  config.update_from_flattened_dict(changes)
  with pytest.raises(errors.UsageError, match=says):
    pretrain.validate(config, 8)
