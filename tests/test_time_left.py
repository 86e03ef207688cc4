"""The time a run has left: every remaining step by its work, evaluations
and compiles, against a count made here step by step."""

import importlib

import ml_collections
import pytest

from bertjax import flops, throughput, time_left
from bertjax.models import EncoderConfig
from bertjax.phases import Phase, phases


def _config(**train):
  config = ml_collections.ConfigDict({
      "model": {"num_layers": 2, "hidden_size": 128, "num_heads": 2, "intermediate_size": 512,
                "vocab_size": 8000, "max_position_embeddings": 512},
      "train": {"total_steps": 1000, "batch_size": 32, "max_seq_length": 128,
                "max_predictions": 20, "long_from_step": -1, "long_seq_length": 512,
                "long_max_predictions": 80, "batch_ramp_start": 0, "batch_ramp_steps": 0,
                **train},
      "eval": {"every_steps": 500, "batches": 20, "batch_size": 64}})
  return config, phases(config), EncoderConfig.from_run_config(config)


def _row_flops(model, length, predictions, training=True):
  return length * flops.flops_per_token(model, length, predictions, training)


def test_one_phase_without_a_warmup_is_its_steps_and_evaluations():
  config, run, model = _config()
  left = time_left.TimeLeft(config, run, model)
  per_flop = 0.1 / (32 * _row_flops(model, 128, 20))
  evaluation = 20 * 64 * _row_flops(model, 128, 20, training=False) * per_flop
  # At step 10: 990 steps of 0.1 s, the evaluations at 500 and 1000 at the
  # steps' rate for their forward passes.
  assert left.seconds(10, 0.1 / 32) == pytest.approx(99.0 + 2 * evaluation)
  left.evaluated(run[0], 3.0)  # then as long as the last one took
  assert left.seconds(600, 0.1 / 32) == pytest.approx(40.0 + 3.0)
  assert left.seconds(1000, 0.1 / 32) == pytest.approx(0.0)
  assert left.seconds(1000, 0.1 / 32, evaluating_now=True) == pytest.approx(3.0)
  assert left.seconds(500, 0.1 / 32, evaluating_now=True) == pytest.approx(50.0 + 6.0)


def test_a_warmups_larger_batches_count_more():
  """The ModernBERT demo's warmup: 8, 16, 24 rows over 300 steps, then 32. The
  first line, 10 steps in at 8 rows, counts the rest by their rows, and the
  compiles of the three batch sizes not compiled yet."""
  config, run, model = _config(total_steps=2000, batch_ramp_start=8, batch_ramp_steps=300)
  config.eval.every_steps = 0
  left = time_left.TimeLeft(config, run, model)
  left.compiled(run[0], 1, 2.0)
  rows = sum(run[0].parts(s) * 8 for s in range(10, 2000))
  assert rows == 90 * 8 + 100 * 16 + 100 * 24 + 1700 * 32
  assert left.seconds(10, 0.05 / 8) == pytest.approx(0.05 * rows / 8 + 3 * 2.0)
  # The rule before, 0.05 s for each of 1,990 steps, said 99.5 s: 3.8x too little.
  assert left.seconds(10, 0.05 / 8) / (0.05 * 1990) > 3.7
  for parts in (2, 3, 4):
    left.compiled(run[0], parts, 2.0)
  assert left.seconds(400, 0.2 / 32) == pytest.approx(0.2 * 1600)


def test_a_phase_at_length_512_counts_by_its_flops():
  config, run, model = _config(long_from_step=900)
  left = time_left.TimeLeft(config, run, model)
  left.compiled(run[0], 1, 1.5)
  short, long = _row_flops(model, 128, 20), _row_flops(model, 512, 80)
  assert long > 4 * short  # attention grows with the square of the length
  per_flop = 0.1 / (32 * short)
  evaluations = 20 * 64 * (_row_flops(model, 128, 20, False) + _row_flops(model, 512, 80, False))
  assert left.seconds(100, 0.1 / 32) == pytest.approx(
      0.1 * 800 + 0.1 * 100 * long / short + evaluations * per_flop + 1.5)
  assert left.seconds(950, 0.4 / 32) == pytest.approx(0.4 * 50
                                                     + 20 * 64 * _row_flops(model, 512, 80, False)
                                                     * 0.4 / (32 * long) + 1.5)


def test_a_window_through_a_warmup_is_timed_by_all_its_rows(monkeypatch):
  """The ModernBERT demo's first line, 12 warmup steps: steps 1-10 take 8, 8,
  8, 8, 16, 16, 16, 16, 24 and 24 rows (14.4 on average), not the last step's
  24. At 1 ms a row, the rest is timed at 1 ms a row."""
  config, run, model = _config(total_steps=40, batch_ramp_start=8, batch_ramp_steps=12)
  config.eval.every_steps = 0
  now = [0.0]
  monkeypatch.setattr(throughput.time, "perf_counter", lambda: now[0])
  meter = throughput.Meter(step=0)
  sizes = [run[0].parts(step) * 8 for step in range(10)]
  assert sizes == [8] * 4 + [16] * 4 + [24] * 2
  for rows in sizes:
    now[0] += rows * 1e-3
    meter.add(rows, real_tokens=rows * 128, sequences=rows, model_flops=0.0)
  rates = meter.take(10)
  assert rates.rows_per_s == pytest.approx(1000)
  left = time_left.TimeLeft(config, run, model)
  left.compiled(run[0], 1, 0.0)
  for parts in (2, 3, 4):
    left.compiled(run[0], parts, 0.0)
  rest = 2 * 24 + 28 * 32
  assert left.seconds(10, 1 / rates.rows_per_s) == pytest.approx(rest * 1e-3)


def _rows_and_programs_step_by_step(phase, step):
  """The phase's rows after `step` steps and its loader-batch counts, a step at a time."""
  sizes = [phase.parts(s) for s in range(max(step, phase.start), phase.end)]
  return sum(sizes) * phase.loader_batch, {(phase.index, parts) for parts in set(sizes)}


@pytest.mark.parametrize("name, arg", [("modernbert_pretrain", "base"),
                                       ("modernbert_pretrain", "large"),
                                       ("modernbert_demo", None), ("demo", None)])
def test_the_warmups_sizes_counted_by_runs_match_a_count_step_by_step(name, arg, monkeypatch):
  """The shipped configs' warmups (ModernBERT base: 21,193 steps), counted a
  run of equal sizes at a time: the same rows and compiles as step by step,
  at each size's first and last steps, the phases' ends and between; and a
  progress line no longer asks every warmup step its size."""
  module = importlib.import_module(f"bertjax.configs.{name}")
  config = module.get_config(arg) if arg else module.get_config()
  run = phases(config)
  left = time_left.TimeLeft(config, run, EncoderConfig.from_run_config(config))
  steps = {0, 1, 7, config.train.total_steps - 1, config.train.total_steps}
  for phase in run:
    sizes = phase.batch_size // phase.loader_batch - 1
    for j in range(sizes + 1):
      edge = phase.start + -(-j * phase.ramp_steps // max(sizes, 1))
      steps |= {edge - 1, edge, edge + 1}
    steps |= {phase.start, phase.start + phase.ramp_steps // 3, phase.end - 1, phase.end}
  for step in sorted(s for s in steps if 0 <= s <= config.train.total_steps):
    programs = set()
    for phase in run:
      rows, needed = _rows_and_programs_step_by_step(phase, step)
      assert left._rows_left(phase, step) == rows, (phase, step)
      programs |= needed
    assert left._programs_left(step) == programs, step
  asked = []
  monkeypatch.setattr(Phase, "parts", lambda self, step: asked.append(step) or 1)
  for phase in run:
    left._rows_left(phase, 1000)
  left._programs_left(1000)
  assert len(asked) < 100
