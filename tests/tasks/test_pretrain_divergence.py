"""The divergence guard in a pre-training run (bertjax.tasks.pretrain): its
range starts anew with a phase, and the last step's save follows its rule.

Tiny in-process runs; the losses the guard sees are scaled by a patch (the
tiny model's own losses move too little to leave a range).
"""

import os

import pytest

from bertjax import divergence, errors
from tests.tasks.finetuning import tiny_pretrain_config


def _scaled_losses(monkeypatch, scale):
  """The guard sees step s's loss times `scale(s)`."""
  update = divergence.DivergenceGuard.update

  def scaled(self, step, loss, advice, grad_norm=None):
    return update(self, step, loss * scale(step), advice, grad_norm)

  monkeypatch.setattr(divergence.DivergenceGuard, "update", scaled)


def _saved_steps(workdir):
  return sorted(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints"))
                if name.isdigit())


def test_the_long_phase_at_6x_the_losses_starts_the_range_anew(prepared_dir, tmp_path,
                                                               monkeypatch, absl_caplog):
  """From 128 to 512 tokens the loss is of other sequences: phase 1's range is
  its own. (Re-basing is off here: the new range alone keeps the run going.)"""
  from bertjax.tasks import pretrain

  _scaled_losses(monkeypatch, lambda step: 6.0 if step > 15 else 1.0)
  workdir = str(tmp_path)
  pretrain.run(tiny_pretrain_config(prepared_dir, **{
      "train.long_from_step": 15, "divergence.steps": 4, "divergence.max_shift": 0.0}), workdir)
  assert _saved_steps(workdir)[-1] == 30
  assert "The loss's range starts anew (phase 0 -> 1)" in absl_caplog.text
  assert "waits" not in absl_caplog.text  # no save held back


@pytest.mark.parametrize("scale,saved", [(6.0, True), (1e9, False)])
def test_the_last_steps_save_follows_the_rule_of_every_save(prepared_dir, tmp_path, monkeypatch,
                                                            absl_caplog, scale, saved):
  """A last loss 6x up, gradients bounded, is a level the run ended at: saved.
  One 1e9x up is a blow-up: not saved, and the run stops saying so."""
  from bertjax.tasks import pretrain

  _scaled_losses(monkeypatch, lambda step: scale if step == 30 else 1.0)
  workdir = str(tmp_path)
  config = tiny_pretrain_config(prepared_dir)
  if saved:
    pretrain.run(config, workdir)
    assert _saved_steps(workdir)[-1] == 30
    assert "The loss's range is re-based at step 30: step 30 held a new level" in absl_caplog.text
  else:
    with pytest.raises(errors.TrainingStoppedError, match=r"the loss diverged: .* at step 30, .*"
                       r"beyond divergence\.max_shift=10 .*; the run ended there: its last "
                       r"step is not saved; a rerun resumes from step 20"):
      pretrain.run(config, workdir)
    assert _saved_steps(workdir) == [10, 20]


def test_a_blow_up_in_the_long_phase_names_the_long_phases_learning_rate(prepared_dir, tmp_path,
                                                                        monkeypatch):
  """The long phase of a warmup-stable-decay run has a rate of its own: the
  one to lower when it blows up."""
  from bertjax.tasks import pretrain

  _scaled_losses(monkeypatch, lambda step: 1e9 if step >= 26 else 1.0)
  config = tiny_pretrain_config(prepared_dir, **{
      "train.long_from_step": 15, "optimizer.schedule": "wsd", "optimizer.decay_steps": 5,
      "optimizer.long_learning_rate": 5e-4})
  with pytest.raises(errors.TrainingStoppedError,
                     match=r"lower optimizer\.long_learning_rate \(now 0\.0005\)"):
    pretrain.run(config, str(tmp_path))
