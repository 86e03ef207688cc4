"""What a run's steps achieve per second, and how long they wait for input.

A `Meter` keeps two windows of steps: since the last log line, and since the
phase began or the last evaluation ended (the line before an evaluation or at
a phase's end reports that one). Each step adds its rows (padding included)
and its useful work (real tokens, sequences and model FLOPs, counted on the
device by `bertjax.train`), so a window whose steps grew (a batch-size warmup)
is rated by all of its steps' work, not by its last step's size; the time
the loop waits for the next batch is input wait; time the loop is held by a
checkpoint save is left out. Each window also samples the CPU time of the
machine and of this process (`bertjax.cpu_load`): the cores other processes
kept busy meanwhile.
"""

from __future__ import annotations

import dataclasses
import math
import time

from bertjax import cpu_load

# A run that waits for input longer than this share of its time is input-bound.
INPUT_BOUND_SHARE = 0.05


@dataclasses.dataclass
class _Window:
  start: float
  step: int
  rows: float = 0.0
  real_tokens: float = 0.0
  sequences: float = 0.0
  model_flops: float = 0.0
  input_wait: float = 0.0
  cpu: cpu_load.Sample | None = None


@dataclasses.dataclass(frozen=True)
class Rates:
  """Per-second figures of a window of steps."""

  seconds_per_step: float
  rows_per_s: float  # rows of the window's steps, padding included
  real_tokens_per_s: float
  sequences_per_s: float
  model_flops_per_s: float
  input_wait_share: float  # of the window's time spent waiting for a batch
  other_cores: float | None = None  # cores other processes kept busy (None: unknown)

  @property
  def input_bound(self) -> bool:
    return self.input_wait_share > INPUT_BOUND_SHARE


class Meter:
  """Throughput of the steps since the last log line and since a restart."""

  def __init__(self, step: int = 0):
    self.restart(step)

  def restart(self, step: int) -> None:
    """Both windows start now, at `step` (a phase's start, an evaluation's end)."""
    now, cpu = time.perf_counter(), cpu_load.sample()
    self._line, self._interval = _Window(now, step, cpu=cpu), _Window(now, step, cpu=cpu)

  def add(self, rows: float, real_tokens: float, sequences: float, model_flops: float) -> None:
    """A finished step's rows and useful work."""
    for window in (self._line, self._interval):
      window.rows += rows
      window.real_tokens += real_tokens
      window.sequences += sequences
      window.model_flops += model_flops

  def waited(self, seconds: float) -> None:
    """The loop waited `seconds` for the next batch."""
    self._line.input_wait += seconds
    self._interval.input_wait += seconds

  def hold(self, seconds: float) -> None:
    """Leaves out `seconds` the loop was held (a checkpoint save starting)."""
    self._line.start += seconds
    self._interval.start += seconds

  def take(self, step: int, whole_interval: bool = False) -> Rates:
    """The rates of the steps up to `step` since the last `take` (or, with
    `whole_interval`, since the restart); the line window starts again."""
    now, cpu = time.perf_counter(), cpu_load.sample()
    window = self._interval if whole_interval else self._line
    seconds = max(now - window.start, 1e-9)
    rates = Rates(seconds / max(step - window.step, 1), window.rows / seconds,
                  window.real_tokens / seconds,
                  window.sequences / seconds, window.model_flops / seconds,
                  min(window.input_wait / seconds, 1.0), cpu_load.other_cores(window.cpu, cpu))
    self._line = _Window(now, step, cpu=cpu)
    return rates


# One loader process's rate, mlm_nsp sequences a second on one core, as
# 1 / (_PER_SEQUENCE_S + _PER_TOKEN_S * length): the fit of the loader's rates
# at lengths 128 and 512 with BERT's uncased vocabulary
# (`python -m bertjax.tools.benchmark_data`,
# docs/benchmarks.md#pre-training-data-on-one-core).
_PER_SEQUENCE_S = 6.7e-5
_PER_TOKEN_S = 9.1e-8
# The share of the chips' peak a step might reach, and the margin on top: the
# rule sizes the pipeline for a fast step, not for today's.
_PLANNED_MFU = 0.6
_MARGIN = 2.0


def loader_sequences_per_s(length: int) -> float:
  """What one loader process delivers (mlm_nsp, one core), by the fit above."""
  return loader_rows_per_s(length)


def loader_rows_per_s(length: int, sequences_per_row: float = 1.0) -> float:
  """Rows of `length` tokens one loader process delivers, by the same fit: a
  packed row's sequences share its tokens, each adding its own per-sequence cost."""
  return 1.0 / (sequences_per_row * _PER_SEQUENCE_S + _PER_TOKEN_S * length)


def loader_workers(*, platform: str, length: int, flops_per_row: float, local_devices: int,
                   peak_tflops: float | None, cpus: int, sequences_per_row: float = 1.0) -> int:
  """The loader processes a host needs to feed its devices (`data.worker_count=-1`).

  On CPUs the pipeline runs in the training process (0). Accelerators consume
  up to `local_devices * peak * 0.6 / flops_per_row` rows a second; the rule
  takes twice that over one process's rate of such rows (`loader_rows_per_s`,
  rows of `sequences_per_row` sequences: for packed rows, as many as the
  data's documents fill), at least 1 and at most the host's
  cores less two (the trainer and the prefetch thread). An accelerator without
  a peak in `bertjax.flops` gets 4.

  Args:
    platform: "cpu", "gpu" or "tpu".
    length: Tokens per row.
    flops_per_row: Model FLOPs of one training row of `length` tokens.
    local_devices: Accelerators of this host.
    peak_tflops: One device's peak (`bertjax.flops.peak_tflops`), or None.
    cpus: The host's cores.
    sequences_per_row: Sequences in one row.

  Returns:
    The number of loader processes.
  """
  if platform == "cpu" or cpus < 3:
    return 0
  if peak_tflops is None:
    return min(cpus - 2, 4)
  rows = local_devices * peak_tflops * 1e12 * _PLANNED_MFU / flops_per_row
  delivered = loader_rows_per_s(length, sequences_per_row)
  return max(1, min(cpus - 2, math.ceil(_MARGIN * rows / delivered)))
