"""What a progress line says of a run's speed: the judgement of a rate
against the one a quiet CPU gives, and which runs have one to expect."""

import pytest

from bertjax import flops, pace
from bertjax.configs import demo, modernbert_demo
from bertjax.phases import phases


@pytest.mark.parametrize("observed, expected, others, says", [
    # A busy second core: the figure, how much slower, and why.
    (95.0, 285.0, 1.0, "3.0x slower than expected on this CPU (~285 sequences/s): other "
                       "processes are using 1.0 of its 2 cores"),
    # Slow with the machine to itself: said, and that it is not the others.
    (95.0, 285.0, 0.1, "3.0x slower than expected on this CPU (~285 sequences/s), though "
                       "other processes use only 0.1 of its 2 cores"),
    (95.0, 285.0, None, "3.0x slower than expected on this CPU (~285 sequences/s)"),
    # Within 1.5x either way: as expected (a first window's warm-up is in it).
    (240.0, 285.0, 0.0, "as fast as expected on this CPU (~285 sequences/s)"),
    (240.0, 285.0, 0.6, "as fast as expected on this CPU (~285 sequences/s): other processes "
                        "are using 0.6 of its 2 cores"),
    (500.0, 285.0, 0.0, "1.8x faster than expected on this CPU (~285 sequences/s)"),
    (1.5, 4.5, 0.0, "3.0x slower than expected on this CPU (~4.5 sequences/s), though other "
                    "processes use only 0.0 of its 2 cores"),
    # Nothing to expect: the others' share alone, when it is worth a word.
    (95.0, None, 1.2, "other processes are using 1.2 of its 2 cores"),
    (95.0, None, 0.2, None),
    (95.0, None, None, None),
])
def test_a_rate_is_judged_against_the_expected_one(observed, expected, others, says):
  verdict = pace.judge(observed, expected, others, cores=2)
  assert verdict.text == says
  assert verdict.busy == (others is not None and others >= 0.5)
  assert verdict.slower == (None if expected is None else pytest.approx(expected / observed))


def _shortened(module, **train):
  config = module.get_config()
  for name, value in train.items():
    setattr(config.train, name, value)
  return config


def test_a_shipped_config_shortened_is_known_and_a_changed_one_is_not(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")
  config = _shortened(demo, total_steps=40)
  phase = phases(config)[0]
  known = dict(platform="cpu", devices=1, cores=2)
  assert pace.quiet_mfu(config, phase, 32, **known) == next(
      step.mfu for step in pace.QUIET_STEPS if step.config == "demo")
  assert pace.quiet_mfu(config, phase, 32, **{**known, "cores": 8}) is None
  assert pace.quiet_mfu(config, phase, 32, **{**known, "devices": 8}) is None
  assert pace.quiet_mfu(config, phase, 32, **{**known, "platform": "gpu"}) is None
  wider = _shortened(demo)
  wider.model.hidden_size = 256
  assert pace.quiet_mfu(wider, phases(wider)[0], 32, **known) is None
  larger = _shortened(demo, batch_size=64)
  assert pace.quiet_mfu(larger, phases(larger)[0], 64, **known) is None
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
  assert pace.quiet_mfu(config, phase, 32, **known) is not None
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")  # slower code
  assert pace.quiet_mfu(config, phase, 32, **known) is None


def test_each_batch_size_of_a_warmup_has_its_own_figure(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")
  config = _shortened(modernbert_demo, total_steps=40, batch_ramp_steps=12)
  phase = phases(config)[0]
  figures = [pace.quiet_mfu(config, phase, rows, platform="cpu", devices=1, cores=2)
             for rows in (8, 16, 24, 32)]
  assert figures == [step.mfu for step in pace.QUIET_STEPS if step.config == "modernbert_demo"]
  assert pace.quiet_mfu(config, phase, 12, platform="cpu", devices=1, cores=2) is None


def test_a_run_says_its_speed_on_its_first_line_and_when_it_changes(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setattr(flops, "quiet_cpu_peak", lambda dtype: 0.5)  # TFLOP/s
  judge = pace.Pace(_shortened(demo, total_steps=400), "cpu", 1, cores=2)
  quiet = next(step.mfu for step in pace.QUIET_STEPS if step.config == "demo")

  def line(step, mfu, others):
    values = {"sequences_per_s": 100.0 * mfu / quiet, "tflops_per_s_per_device": mfu * 0.5}
    return judge.say(step, 32, values, others), values

  said, values = line(10, quiet / 3, 1.0)
  assert said == ("3.0x slower than expected on this CPU (~100 sequences/s): other processes "
                  "are using 1.0 of its 2 cores")
  assert values["expected_sequences_per_s"] == pytest.approx(100)
  assert values["other_processes_cores"] == 1.0
  assert line(20, quiet / 3, 1.1)[0] is None  # the same news
  assert line(30, quiet, 0.0)[0] == "as fast as expected on this CPU (~100 sequences/s)"
  assert line(40, quiet * 0.9, 0.1)[0] is None
  unknown = pace.Pace(_shortened(demo, batch_size=64), "cpu", 1, cores=2)
  values = {"sequences_per_s": 100.0, "tflops_per_s_per_device": 0.05}
  assert unknown.say(10, 64, values, 0.1) is None and "expected_sequences_per_s" not in values
  assert unknown.say(20, 64, values, 1.5) == "other processes are using 1.5 of its 2 cores"


def test_a_cpu_whose_peak_was_never_measured_quiet_has_no_rate_to_expect_yet(monkeypatch,
                                                                              tmp_path):
  """A first run on a busy machine (no record of a quiet peak): the line says
  no rate is expected yet and names the other processes' share, even a small
  one; once a quiet peak is recorded, the next line has its figure."""
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  judge = pace.Pace(_shortened(demo, total_steps=400), "cpu", 1, cores=2)
  values = {"sequences_per_s": 100.0, "tflops_per_s_per_device": 0.05}
  assert judge.say(10, 32, values, 0.9) == (
      "no rate expected on this CPU yet: its matmul peak has not been measured while other "
      "processes left it alone; other processes are using 0.9 of its 2 cores")
  assert "expected_sequences_per_s" not in values
  assert judge.say(20, 32, dict(values), 0.9) is None  # the same news
  assert judge.say(30, 32, dict(values), 0.2) == (
      "no rate expected on this CPU yet: its matmul peak has not been measured while other "
      "processes left it alone; other processes are using 0.2 of its 2 cores")
  flops._record(flops.cpu_peak_record(), flops._cpu_key("float32"), 0.5)
  quiet = next(step.mfu for step in pace.QUIET_STEPS if step.config == "demo")
  values = {"sequences_per_s": 100.0, "tflops_per_s_per_device": 0.5 * quiet / 2}
  assert judge.say(40, 32, values, 0.0) == (
      "2.0x slower than expected on this CPU (~200 sequences/s), though other processes use "
      "only 0.0 of its 2 cores")
  assert values["expected_sequences_per_s"] == pytest.approx(200)
