"""Throughput windows and the loader-process rule."""

import math

import pytest

from bertjax import flops, throughput
from bertjax.models import EncoderConfig


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_windows_rate_the_work_and_leave_out_held_time(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(throughput.time, "perf_counter", clock)
  meter = throughput.Meter(step=10)
  for _ in range(4):  # 4 steps of 2 s, each waiting 0.5 s for its batch
    clock.now += 2
    meter.add(rows=8, real_tokens=1000, sequences=8, model_flops=1e12)
    meter.waited(0.5)
  clock.now += 3
  meter.hold(3)  # a checkpoint save held the loop: not the steps' time
  rates = meter.take(14)
  assert rates.seconds_per_step == pytest.approx(2.0)
  assert rates.rows_per_s == pytest.approx(4)
  assert rates.real_tokens_per_s == pytest.approx(500)
  assert rates.sequences_per_s == pytest.approx(4)
  assert rates.model_flops_per_s == pytest.approx(5e11)
  assert rates.input_wait_share == pytest.approx(0.25) and rates.input_bound
  clock.now += 1
  meter.add(rows=1, real_tokens=100, sequences=1, model_flops=0)
  line = meter.take(15)  # the line window starts again at each take
  assert line.seconds_per_step == pytest.approx(1.0) and line.input_wait_share == 0
  interval = meter.take(15, whole_interval=True)  # the phase so far
  assert interval.seconds_per_step == pytest.approx(9 / 5)
  assert interval.real_tokens_per_s == pytest.approx(4100 / 9)
  assert interval.rows_per_s == pytest.approx(33 / 9)
  assert not throughput.Rates(1, 1, 1, 1, 1, 0.04).input_bound


def test_loader_processes_follow_what_the_devices_consume():
  base = EncoderConfig.from_preset("bert_base")
  per_row = 128 * flops.flops_per_token(base, 128, 20)
  rule = lambda **k: throughput.loader_workers(
      **{"platform": "gpu", "length": 128, "flops_per_row": per_row,
         "local_devices": 8, "peak_tflops": 989.0, "cpus": 224, **k})
  # 8 H200s at 60% of their peak take 8 * 989e12 * 0.6 / per_row rows a second;
  # twice that over one process's rate.
  wanted = 8 * 989e12 * 0.6 / per_row
  assert rule() == math.ceil(2 * wanted / throughput.loader_sequences_per_s(128))
  assert 8 <= rule() <= 16
  assert rule(local_devices=1) < rule()
  # Packed rows of up to 3 sequences: the same tokens a row, 3 sequences' own
  # costs (3 x 67 us + 128 x 0.091 us against 67 + 11.6 us: 2.7x the time).
  assert rule(sequences_per_row=3) == math.ceil(
      2 * wanted / throughput.loader_rows_per_s(128, 3))
  assert throughput.loader_rows_per_s(128, 3) == pytest.approx(
      throughput.loader_sequences_per_s(128) / 2.70, rel=0.01)
  assert rule(cpus=6) == 4            # the host's cores less two
  assert rule(platform="cpu") == 0    # the demo: in the training process
  assert rule(peak_tflops=None) == 4  # an accelerator not in the table
  # One process's rate, the fit of the measured 12,665 (128) and 8,811 (512).
  assert throughput.loader_sequences_per_s(128) == pytest.approx(12_665, rel=0.02)
  assert throughput.loader_sequences_per_s(512) == pytest.approx(8_811, rel=0.02)


def test_packed_rows_are_sized_by_the_datas_documents(prepared_dir, tmp_path):
  """The loader is sized for rows of as many sequences as documents of the
  prepared data's mean length fill, at most `data.max_sequences_per_row`."""
  from bertjax.configs import modernbert_pretrain
  from bertjax.data import shards
  from bertjax.tasks.pretrain_data import sequences_per_row

  config = modernbert_pretrain.get_config()
  stats = shards.read_stats(prepared_dir)
  mean = stats.tokens / stats.documents_used + 2
  assert stats.documents_used == 120
  assert sequences_per_row(config, prepared_dir, 1024) == pytest.approx(1024 / mean)
  assert sequences_per_row(config, prepared_dir, 8) == 1.0  # documents longer than a row
  config.data.max_sequences_per_row = 2
  assert sequences_per_row(config, prepared_dir, 1024) == 2.0
  config.data.max_sequences_per_row = 256
  assert sequences_per_row(config, str(tmp_path), 1024) == 256.0  # no counts: the most
  config.data.truncate_documents = False  # a document's sequences: not counted
  assert sequences_per_row(config, prepared_dir, 1024) == 256.0
  config.data.truncate_documents, config.data.static = True, True
  assert sequences_per_row(config, prepared_dir, 1024) == 256.0
