"""The divergence guard (bertjax.divergence): a finite loss that left its range."""

import math

import pytest

from bertjax import divergence, errors


def _advice():
  return "a rerun resumes from step 20: lower optimizer.learning_rate"


def _fed(guard, losses, start=1):
  for step, loss in enumerate(losses, start):
    guard.update(step, loss, _advice)


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
  _fed(guard, [9.0, 8.0, 7.0, 6.0])
  assert guard.state() == {"recent_losses": [8.0, 7.0, 6.0]}
  resumed = divergence.DivergenceGuard(3.0, 2, 3, guard.state()["recent_losses"])
  _fed(resumed, [30.0], start=5)
  assert resumed.out_of_range  # against the checkpoint's range, not the first loss after it


@pytest.mark.parametrize("settings", [dict(factor=0.5, steps=3), dict(factor=3.0, steps=0)])
def test_settings_that_make_no_sense_are_refused(settings):
  with pytest.raises(errors.UsageError, match="divergence"):
    divergence.DivergenceGuard(**settings)
