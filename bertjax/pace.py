"""Whether a run goes as fast as this machine should take it.

A shipped config's step reaches a known share of the CPU's matmul peak (MFU)
on a quiet machine, measured (docs/benchmarks.md#expected-speed-on-a-cpu):
times this CPU's own peak (`bertjax.flops.quiet_cpu_peak`, the best rate
measured on it while other processes left it alone), that gives the rate to
expect here. A progress line says how far the run is from it, and how many
cores other processes kept busy meanwhile (`bertjax.cpu_load`), e.g. "1.6x
slower than expected on this CPU (~271 sequences/s): other processes are
using 0.8 of its 2 cores" (docs/training.md shows such a line). A CPU
whose peak was never measured quiet (a first run on a machine busy from the
start) has no rate to expect yet: the line says so, and names the other
processes' share.

Only what was measured is expected: the config as shipped (its model, its
objective, its lengths and batch sizes; its step count may change), one CPU
device, no other XLA_FLAGS, and a CPU of as many cores as the one measured
(a small model's MFU depends on them). Any other run gets the other
processes' share alone.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

import ml_collections

from bertjax import cpu_load, flops
from bertjax.models import EncoderConfig
from bertjax.phases import Phase, phases

# A run this many times slower (or faster) than expected is said to be.
SLOWER = 1.5
# Other processes that keep this share of the cores busy are said to.
BUSY_SHARE = 0.25


@dataclasses.dataclass(frozen=True)
class QuietStep:
  """A shipped config's step as measured on a quiet CPU."""

  config: str    # the module under `bertjax.configs`
  phase: int     # the phase's index
  rows: int      # rows (sequences, or packed rows) a step
  cores: int     # the CPU's cores
  mfu: float     # model FLOP/s over the CPU's best float32 matmul rate


# docs/benchmarks.md#expected-speed-on-a-cpu: the median MFU of the progress
# lines (20 steps each) whose steps had the CPU to themselves (other processes
# under 0.1 core), on the 2-core CPU VM (AVX-512), against its best float32
# matmul rate, 0.494 TFLOP/s. The first line of each batch size, whose first
# steps run slower, is left out.
QUIET_STEPS = (
    QuietStep("demo", 0, 32, 2, 0.216),
    QuietStep("modernbert_demo", 0, 8, 2, 0.173),
    QuietStep("modernbert_demo", 0, 16, 2, 0.172),
    QuietStep("modernbert_demo", 0, 24, 2, 0.170),
    QuietStep("modernbert_demo", 0, 32, 2, 0.166),
)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What a progress line says of the run's speed."""

  text: str | None   # None: nothing worth a word
  slower: float | None  # expected / observed rate (None: nothing expected)
  busy: bool  # other processes keep `BUSY_SHARE` of the cores busy
  awaiting_peak: bool = False  # a rate would be expected once the CPU's peak is measured quiet


def judge(observed: float, expected: float | None, other_cores: float | None, cores: int,
          unit: str = "sequences/s", awaiting_peak: bool = False) -> Verdict:
  """Says how a rate compares with the one expected on this CPU, and why.

  Args:
    observed: The run's rate (`unit`).
    expected: The rate a quiet machine gives this config, or None (unknown).
    other_cores: The cores other processes kept busy meanwhile (None: unknown).
    cores: The machine's cores.
    unit: What the rates count.
    awaiting_peak: A rate would be expected, but this CPU's peak was never
      measured quiet (`bertjax.flops.quiet_cpu_peak`).

  Returns:
    The verdict: how many times slower or faster than expected (from 1.5x),
    or as fast; and other processes' share where it is `BUSY_SHARE` of the
    cores, or where the run is slow without them; awaiting the peak, that no
    rate is expected yet, and other processes' share whatever it is.
  """
  busy = other_cores is not None and other_cores >= BUSY_SHARE * cores
  others = None if other_cores is None else f"{other_cores:.1f} of its {cores} cores"
  if expected is None and awaiting_peak:
    text = ("no rate expected on this CPU yet: its matmul peak has not been measured while "
            "other processes left it alone")
    return Verdict(text + (f"; other processes are using {others}" if others else ""), None,
                   busy, awaiting_peak=True)
  if expected is None or expected <= 0 or observed <= 0:
    return Verdict(f"other processes are using {others}" if busy else None, None, busy)
  slower = expected / observed
  figure = f"~{expected:,.0f} {unit}" if expected >= 10 else f"~{expected:.2g} {unit}"
  if slower >= SLOWER:
    text = f"{slower:.1f}x slower than expected on this CPU ({figure})"
  elif slower <= 1 / SLOWER:
    text = f"{1 / slower:.1f}x faster than expected on this CPU ({figure})"
  else:
    text = f"as fast as expected on this CPU ({figure})"
  if busy:
    text += f": other processes are using {others}"
  elif slower >= SLOWER and others is not None:
    text += f", though other processes use only {others}"
  return Verdict(text, slower, busy)


def quiet_mfu(config: ml_collections.ConfigDict, phase: Phase, rows: int, *, platform: str,
              devices: int, cores: int) -> float | None:
  """The MFU a quiet CPU reaches on this step of `config`, where a shipped
  config's step of the same settings was measured (`QUIET_STEPS`), else None."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  if (platform != "cpu" or devices != 1
      or any(flag != "--xla_force_host_platform_device_count=1" for flag in flags)):
    return None
  mine = _settings(config, phase)
  for known in QUIET_STEPS:
    if (known.rows == rows and known.phase == phase.index and known.cores == cores
        and _settings_of(known.config, known.phase) == mine):
      return known.mfu
  return None


def _settings(config: ml_collections.ConfigDict, phase: Phase) -> tuple[Any, ...]:
  """What a step's speed depends on (a shortened run keeps them all)."""
  model = EncoderConfig.from_run_config(config)
  return (sorted(phase.model(model).to_dict().items()), config.objective,
          phase.max_seq_length, phase.max_predictions, phase.batch_size, phase.loader_batch,
          config.train.accumulation_steps, config.data.max_sequences_per_row)


def _settings_of(name: str, phase_index: int) -> tuple[Any, ...] | None:
  config = importlib.import_module(f"bertjax.configs.{name}").get_config()
  known = [phase for phase in phases(config) if phase.index == phase_index]
  return _settings(config, known[0]) if known else None


class Pace:
  """A run's judge of its progress lines: each line's figures, and a word on
  its first line and whenever the verdict changes (slow, or other processes busy)."""

  def __init__(self, config: ml_collections.ConfigDict, platform: str, devices: int,
               cores: int | None = None):
    self.config, self.platform, self.devices = config, platform, devices
    self.cores = cores or cpu_load.cores()
    self.phases = phases(config)
    self.dtype = EncoderConfig.from_run_config(config).dtype  # the CPU peak's
    self._said: tuple[bool, bool, bool] | None = None  # (slow, busy, awaiting) as last said
    self._quiet: dict[tuple[int, int], float | None] = {}  # (phase, rows) -> quiet MFU

  def say(self, step: int, rows: int, values: dict[str, float],
          other_cores: float | None) -> str | None:
    """Adds `expected_sequences_per_s` and `other_processes_cores` to a
    progress line's `values` where known; returns what the line should say.

    The rate expected is the quiet MFU times this CPU's quiet peak, in
    sequences: `sequences_per_s` over `tflops_per_s_per_device` (one CPU device).
    """
    phase = [phase for phase in self.phases if phase.start < max(step, 1)][-1]
    if (phase.index, rows) not in self._quiet:
      self._quiet[(phase.index, rows)] = quiet_mfu(
          self.config, phase, rows, platform=self.platform, devices=self.devices,
          cores=self.cores)
    mfu, expected, awaiting_peak = self._quiet[(phase.index, rows)], None, False
    if mfu is not None and values.get("tflops_per_s_per_device"):
      peak = flops.quiet_cpu_peak(self.dtype)
      if peak:
        expected = values["sequences_per_s"] * mfu * peak / values["tflops_per_s_per_device"]
        values["expected_sequences_per_s"] = expected
      else:
        awaiting_peak = True
    if other_cores is not None:
      values["other_processes_cores"] = other_cores
    verdict = judge(values["sequences_per_s"], expected, other_cores, self.cores,
                    awaiting_peak=awaiting_peak)
    state = (verdict.slower is not None and verdict.slower >= SLOWER, verdict.busy,
             verdict.awaiting_peak)
    said, self._said = self._said, state
    return verdict.text if said is None or state != said else None
