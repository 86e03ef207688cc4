"""The divergence guard (bertjax.divergence): a finite loss that left its range."""

import math
import re

import pytest

from bertjax import divergence, errors


def _advice():
  return "a rerun resumes from step 20: lower optimizer.learning_rate"


def _fed(guard, losses, start=1, grad_norms=None):
  for step, loss in enumerate(losses, start):
    norm = None if grad_norms is None else grad_norms[step - start]
    guard.update(step, loss, _advice, norm)


def _level(median, count, spread=0.04):
  """`count` losses about `median`, up and down by `spread` of it (a batch's noise)."""
  return [median * (1 + spread * ((-1) ** i) * (i % 3) / 2) for i in range(count)]


def test_a_spike_that_comes_back_only_holds_the_saves_back():
  guard = divergence.DivergenceGuard(factor=3.0, steps=5)
  _fed(guard, [10.0, 9.0, 8.0, 7.5, 7.0])
  _fed(guard, [40.0, 35.0], start=6)  # out of range: a save now would keep these weights
  assert guard.out_of_range and "loss 35 at step 7" in guard.describe()
  assert guard.diverged_from() == 5  # step 6's loss is that of the weights saved at step 5
  _fed(guard, [7.2], start=8)
  assert not guard.out_of_range and guard.diverged_from() is None
  assert guard.recent == [10.0, 9.0, 8.0, 7.5, 7.0, 7.2]  # the spike never became the range


def test_steps_out_of_range_in_a_row_stop_the_run_saying_where_a_rerun_resumes():
  guard = divergence.DivergenceGuard(factor=3.0, steps=4)
  _fed(guard, [10.0, 9.0, 8.0])
  with pytest.raises(errors.TrainingStoppedError) as error:
    _fed(guard, [1e3, 1e8, 1e12, 1.2e16], start=4)  # a learning rate of 1e4
  message = str(error.value)
  assert message.startswith("the loss diverged: 1.2e+16 at step 7, above 3 x its recent "
                            "median (9) for 4 steps in a row since step 4")
  assert message.endswith(_advice())


def test_non_finite_losses_are_left_to_the_skip_guard_and_0_turns_it_off():
  guard = divergence.DivergenceGuard(factor=3.0, steps=2)
  _fed(guard, [5.0, math.nan, math.inf, math.nan])
  assert not guard.out_of_range
  off = divergence.DivergenceGuard(factor=0, steps=1)
  _fed(off, [1.0, 1e30, 1e30])
  assert not off.out_of_range


def test_a_converged_fine_tuning_loss_is_not_divergence_below_the_margin():
  guard = divergence.DivergenceGuard(factor=3.0, steps=3)
  _fed(guard, [0.01] * 50)
  _fed(guard, [0.05, 0.4, 0.9], start=51)  # 5x to 90x the median, under 1 nat above it
  assert not guard.out_of_range
  _fed(guard, [1.2], start=54)
  assert guard.out_of_range


def test_the_range_goes_on_from_a_checkpoint():
  guard = divergence.DivergenceGuard(factor=3.0, steps=2, window=3)
  guard.begin({"phase": 0, "data": "a1"}, _advice, "")
  _fed(guard, [9.0, 8.0, 7.0, 6.0], grad_norms=[1.0, 1.0, 0.9, 0.8])
  assert guard.state() == {"recent_losses": [8.0, 7.0, 6.0], "recent_grad_norms": [1.0, 0.9, 0.8],
                           "recent_of": {"phase": 0, "data": "a1"}}
  resumed = divergence.DivergenceGuard.from_config(_settings(steps=2, window=3), guard.state())
  resumed.begin({"phase": 0, "data": "a1"}, _advice, "")
  _fed(resumed, [30.0], start=5)
  assert resumed.out_of_range  # against the checkpoint's range, not the first loss after it


@pytest.mark.parametrize("settings", [dict(factor=0.5, steps=3), dict(factor=3.0, steps=0),
                                      dict(factor=3.0, steps=3, max_shift=2.0),
                                      dict(factor=3.0, steps=3, max_rise=0.9),
                                      dict(factor=3.0, steps=3, max_grad_ratio=0.5)])
def test_settings_that_make_no_sense_are_refused(settings):
  with pytest.raises(errors.UsageError, match="divergence"):
    divergence.DivergenceGuard(**settings)


def _settings(**changes):
  from bertjax.configs import common

  settings = common.divergence_config()
  settings.update(changes)
  return settings


# A shift: the loss moves to a new level and stays there.


def test_a_sustained_rise_at_a_data_mix_change_rebases_the_range_and_saves_go_on(absl_caplog):
  guard = divergence.DivergenceGuard.from_config(_settings(steps=10))
  _fed(guard, _level(2.0, 30), grad_norms=[1.0] * 30)
  # A new mix of harder text: 4x the loss, flat, gradients up 1.5x at most.
  shifted = _level(8.0, 10)
  _fed(guard, shifted[:9], start=31, grad_norms=[1.5] * 9)
  assert guard.out_of_range  # the saves wait, as for a spike ...
  _fed(guard, shifted[9:], start=40, grad_norms=[1.5])
  assert not guard.out_of_range and guard.diverged_from() is None  # ... until it is a level
  assert guard.recent == shifted and guard.bound() == pytest.approx(3 * 8.0, rel=0.05)
  assert ("The loss's range is re-based at step 40: the 10 steps since step 31 held a new "
          "level (median 8") in absl_caplog.text
  _fed(guard, [8.1, 7.9], start=41, grad_norms=[1.4, 1.3])  # in range at the new level
  assert not guard.out_of_range
  _fed(guard, [40.0], start=43, grad_norms=[1.0])  # and a spike above it is still seen
  assert guard.out_of_range


def test_a_small_loss_that_settles_higher_is_rebased_after_a_settling_step():
  guard = divergence.DivergenceGuard.from_config(_settings(steps=6))
  _fed(guard, _level(0.3, 20), grad_norms=[0.5] * 20)
  # Up by 1.6 nats and 6x: out of range by both bounds. The first step
  # overshoots; the level then stays (a falling start is no rise).
  settled = [2.6, 2.0, 1.9, 1.95, 1.9, 1.92]
  _fed(guard, settled, start=21, grad_norms=[3.0, 1.0, 0.9, 0.9, 1.0, 0.8])
  assert not guard.out_of_range and guard.recent == settled


# A blow-up still stops the run, saying why it is no shift.


def test_a_flat_level_orders_of_magnitude_up_stops_the_run():
  # Steps with overflowing gradients are skipped: the weights stop, and so
  # does the loss, at 1e16 (a learning rate mistyped as 1e4).
  guard = divergence.DivergenceGuard.from_config(_settings(steps=5))
  _fed(guard, _level(4.0, 20), grad_norms=[1.0] * 20)
  with pytest.raises(errors.TrainingStoppedError) as error:
    _fed(guard, _level(1.3e16, 5), start=21, grad_norms=[math.inf] * 5)
  message = str(error.value)
  assert re.search(r"for 5 steps in a row since step 21, up to 3\.\d+e\+15 x that median, "
                   r"beyond divergence\.max_shift=10 \(a blow-up, not a new level\); no "
                   r"checkpoint was saved since; ", message), message
  assert message.endswith(_advice())


def test_a_loss_that_keeps_rising_stops_the_run_though_each_step_is_within_the_shift():
  guard = divergence.DivergenceGuard.from_config(_settings(steps=8))
  _fed(guard, _level(2.0, 20), grad_norms=[1.0] * 20)
  rising = [6.5 * 1.12 ** i for i in range(8)]  # 6.5 ... 16: under 10 x 2 every step
  with pytest.raises(errors.TrainingStoppedError, match=r"since step 21, still rising \(the "
                     r"later half of those steps 1\.57 x the earlier.*max_rise=1\.2\)"):
    _fed(guard, rising, start=21, grad_norms=[1.2] * 8)


@pytest.mark.parametrize("norm,says", [(45.0, "gradient norms up to 45 x their recent median"),
                                       (math.nan, "non-finite gradient norms")])
def test_a_level_whose_gradients_blew_up_stops_the_run(norm, says):
  guard = divergence.DivergenceGuard.from_config(_settings(steps=4))
  _fed(guard, _level(3.0, 20), grad_norms=[1.0] * 20)
  with pytest.raises(errors.TrainingStoppedError, match=says):
    _fed(guard, [12.0, 12.2, 11.9, 12.1], start=21, grad_norms=[1.1, norm, 1.0, 1.2])


def test_max_shift_0_stops_at_any_level_as_the_guard_always_did():
  guard = divergence.DivergenceGuard.from_config(_settings(steps=3, max_shift=0))
  _fed(guard, _level(2.0, 10), grad_norms=[1.0] * 10)
  with pytest.raises(errors.TrainingStoppedError, match="max_shift=0 never re-bases"):
    _fed(guard, [7.0, 7.0, 7.0], start=11, grad_norms=[1.0] * 3)


# A phase or a change of data starts the range anew.


def test_a_phase_switch_at_3x_starts_the_range_anew():
  guard = divergence.DivergenceGuard.from_config(_settings(steps=5, max_shift=0))
  guard.begin({"phase": 0, "data": "a1"}, _advice, "phase 0 ended there")
  _fed(guard, _level(2.5, 40), grad_norms=[1.0] * 40)
  guard.begin({"phase": 0, "data": "a1"}, _advice, "")  # the same phase and data: kept
  assert guard.recent == _level(2.5, 40)
  guard.begin({"phase": 1, "data": "a1"}, _advice, "phase 0 ended there")  # 128 -> 512 tokens
  assert guard.recent == [] and guard.state()["recent_grad_norms"] == []
  _fed(guard, _level(8.5, 30), start=41, grad_norms=[2.0] * 30)  # 3.4 x phase 0's losses
  assert not guard.out_of_range and guard.recent == _level(8.5, 30)
  assert guard.state()["recent_of"] == {"phase": 1, "data": "a1"}


def test_a_checkpoints_losses_of_phase_1_are_not_the_range_of_phase_2(absl_caplog):
  saved = {"phase": 0, "loader": None, "recent_losses": [2.0] * 50,
           "recent_grad_norms": [1.0] * 50, "recent_of": {"phase": 0, "data": "a1"}}
  guard = divergence.DivergenceGuard.from_config(_settings(steps=3, max_shift=0), saved)
  guard.begin({"phase": 1, "data": "a1"}, _advice, "phase 0 ended there")
  assert guard.recent == []
  assert "The loss's range starts anew (phase 0 -> 1)" in absl_caplog.text
  _fed(guard, [7.5, 7.0, 6.8, 6.9], start=901)
  assert not guard.out_of_range


def test_a_resume_on_other_data_starts_the_range_anew_and_older_checkpoints_are_of_their_phase():
  saved = {"phase": 0, "recent_losses": [2.0] * 50, "recent_of": {"phase": 0, "data": "a1"}}
  guard = divergence.DivergenceGuard.from_config(_settings(steps=3, max_shift=0), saved)
  guard.begin({"phase": 0, "data": "b2"}, _advice, "")  # --config.data.dir of a new mix
  _fed(guard, [6.5, 6.6, 6.4, 6.5], start=51)
  assert guard.recent == [6.5, 6.6, 6.4, 6.5]
  # A checkpoint saved before the range said what it is of: of its loader's phase.
  older = {"phase": 1, "recent_losses": [2.0] * 50}
  kept = divergence.DivergenceGuard.from_config(_settings(), older, of={"phase": 1, "data": "a1"})
  kept.begin({"phase": 1, "data": "a1"}, _advice, "")
  assert kept.recent == [2.0] * 50
  ended = divergence.DivergenceGuard.from_config(_settings(), older, of={"phase": 0, "data": "a1"})
  ended.begin({"phase": 1, "data": "a1"}, _advice, "")
  assert ended.recent == []


def test_steps_out_of_range_when_a_phase_ends_are_judged_then_not_forgotten():
  guard = divergence.DivergenceGuard.from_config(_settings(steps=20))
  guard.begin({"phase": 0, "data": "a1"}, _advice, "phase 0 ended there")
  _fed(guard, _level(2.0, 30), grad_norms=[1.0] * 30)
  _fed(guard, [1e3, 1e7, 1e11], start=31, grad_norms=[30.0, 1e4, math.inf])
  with pytest.raises(errors.TrainingStoppedError, match=r"since step 31, up to .*; phase 0 "
                     r"ended there, with no checkpoint saved since; a rerun resumes"):
    guard.begin({"phase": 1, "data": "a1"}, _advice,
                "phase 0 ended there, with no checkpoint saved since")


# The last step: no step after it to wait for.


def test_a_last_step_out_of_range_at_a_new_level_is_rebased_and_saved(absl_caplog):
  guard = divergence.DivergenceGuard.from_config(_settings())
  _fed(guard, _level(3.0, 60), grad_norms=[1.0] * 60)
  _fed(guard, [11.0, 10.8], start=61, grad_norms=[1.3, 1.2])  # 2 steps of 20
  guard.conclude(_advice, "the run ended there: its last step is not saved")
  assert not guard.out_of_range  # the trainer saves it
  assert "re-based at step 62: the 2 steps since step 61 held a new level" in absl_caplog.text


def test_a_last_step_that_blew_up_is_not_saved_and_says_so():
  guard = divergence.DivergenceGuard.from_config(_settings())
  _fed(guard, _level(3.0, 60), grad_norms=[1.0] * 60)
  _fed(guard, [4e9], start=61, grad_norms=[2e5])
  with pytest.raises(errors.TrainingStoppedError) as error:
    guard.conclude(_advice, "the run ended there: its last step is not saved")
  assert str(error.value).startswith("the loss diverged: 4e+09 at step 61, above 3 x its recent "
                                     "median (3), up to 1.33e+09 x that median")
  assert "; the run ended there: its last step is not saved; a rerun resumes" in str(error.value)
  quiet = divergence.DivergenceGuard.from_config(_settings())
  _fed(quiet, [3.0, 3.1])
  quiet.conclude(_advice, "")  # in range: nothing to judge
  assert quiet.recent == [3.0, 3.1]
