"""What a run tells its user at the end: commands that paste back into a
shell as printed, from any directory."""

import json
import os
import shlex

import ml_collections

from bertjax import metrics, runs, usage


def _printed(monkeypatch, say, *args):
  lines = []
  monkeypatch.setattr(metrics, "log", lines.append)
  say(*args)
  return "\n".join(lines).splitlines()


def _command(lines, label):
  line = next(line for line in lines if line.startswith(label))
  return shlex.split(line[len(label):])


def test_the_next_steps_paste_back_with_any_path(monkeypatch, tmp_path):
  """A workdir with a space, a quote and a dollar: the printed commands split,
  as a shell splits them, into the arguments meant."""
  workdir = str(tmp_path / "my run's $HOME")
  lines = _printed(monkeypatch, runs.say_pretraining_is_done, workdir, 100,
                   {"mlm_accuracy": 0.5}, 100)
  assert _command(lines, "Convert:") == [
      "python", "-m", "bertjax.tools.convert", f"--input={workdir}", "--to=hf",
      f"--output={workdir}_hf"]
  fine_tune = _command(lines, "Fine-tune:")
  assert fine_tune[fine_tune.index("--config=configs/glue.py:sst2") + 1:] == [
      f"--config.init_checkpoint={workdir}", "--config.data.dir=glue_data/SST-2",
      f"--workdir={workdir}_sst2", "#", "the", "GLUE", "SST-2", "files:", "docs/finetuning.md"]
  assert _command(lines, "Plot:")[-4:] == [
      "-m", "bertjax.tools.plot", f"--runs={workdir}",
      f"--output={os.path.join(workdir, 'curves.png')}"]
  look = _command(lines, "Look:")
  assert look[-3:] == ["tensorboard", "--logdir", os.path.join(workdir, "tensorboard")]


def test_the_demo_fine_tunes_on_its_offline_task(monkeypatch, tmp_path):
  workdir = str(tmp_path / "my demo")
  lines = _printed(monkeypatch, runs.say_pretraining_is_done, workdir, 100,
                   {"mlm_accuracy": 0.5}, 100, True)
  assert _command(lines, "Fine-tune:") == [
      "python", "-m", "bertjax.main", "--config=configs/demo_finetune.py",
      f"--config.init_checkpoint={workdir}", f"--workdir={workdir}_topics"]


def test_tensorboard_is_installed_first_where_it_is_missing(monkeypatch):
  monkeypatch.setattr(runs.shutil, "which", lambda name: None)
  assert runs.tensorboard_command("/a b").startswith("pip install tensorboard && tensorboard")
  monkeypatch.setattr(runs.shutil, "which", lambda name: "/usr/bin/" + name)
  assert runs.tensorboard_command("/a b") == "tensorboard --logdir '/a b'"


def test_a_shipped_config_is_found_from_any_directory(monkeypatch, tmp_path):
  """`--config=configs/NAME.py[:arg]`, as the docs and the printed commands
  write it, names the installed config where the working directory has no
  such file; a file of that name there comes first."""
  from bertjax import configs

  installed = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), "glue.py")
  monkeypatch.chdir(tmp_path)
  assert usage.shipped_configs(["main", "--config=configs/glue.py:sst2", "--workdir=w"]) == [
      "main", f"--config={installed}:sst2", "--workdir=w"]
  assert usage.shipped_configs(["main", "--config", "configs/glue.py"]) == [
      "main", "--config", installed]
  unknown = ["main", "--config=configs/nothing.py", "--config=other/glue.py"]
  assert usage.shipped_configs(unknown) == unknown
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "glue.py").write_text("")
  assert usage.shipped_configs(["main", "--config=configs/glue.py:sst2"]) == [
      "main", "--config=configs/glue.py:sst2"]


def test_a_rerun_says_what_it_changes_of_the_schedule(monkeypatch, tmp_path):
  from bertjax.configs import modernbert_pretrain

  config = modernbert_pretrain.get_config("large")
  workdir = str(tmp_path)
  assert runs.schedule_changes(config, workdir) == []  # a new run
  runs.save_config(config, workdir)
  assert runs.schedule_changes(config, workdir) == []  # restarts' tuples read back as lists
  config.train.total_steps += 1000
  config.optimizer.restarts = ((200_000, 5e-5, 1e-6),)
  assert runs.schedule_changes(config, workdir) == [
      f"train.total_steps {config.train.total_steps - 1000} -> {config.train.total_steps}",
      "optimizer.restarts [[180332, 5e-05, 1e-06]] -> [[200000, 5e-05, 1e-06]]"]


def test_a_rerun_of_a_finished_run_shows_its_last_held_out_figures(monkeypatch, tmp_path):
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 500, "eval/mlm_accuracy": 0.25}\n{"step": 600, "train/loss": 2.0}\n'
      '{"step": 1000, "eval/mlm_accuracy": 0.5, "eval/mlm_loss": 3.0}\n{"step": 10')
  lines = _printed(monkeypatch, runs.say_pretraining_is_done, str(tmp_path), 1000, {}, 0)
  assert "Held-out at step 1000: mlm_accuracy 0.5000  mlm_loss 3.0000" in lines


def test_a_setting_a_later_bertjax_added_is_no_change(tmp_path):
  """A run saved before a field existed is its rerun's (the field's value now is
  the one it ran without); a setting it saved and the rerun changes is not."""
  saved = {"init_checkpoint": "/models/a", "train": {"learning_rate": 2e-5}}
  (tmp_path / runs.CONFIG_FILE).write_text(json.dumps(saved), encoding="utf-8")
  now = ml_collections.ConfigDict({**saved, "train": {"learning_rate": 2e-5, "ramp": 5},
                                   "data": {"file_format": ""}})
  assert runs.settings_changes(now, str(tmp_path)) == []
  now.init_checkpoint, now.train.learning_rate = "/models/b", 3e-5
  assert runs.settings_changes(now, str(tmp_path)) == [
      "init_checkpoint: /models/a then, /models/b now", "train.learning_rate: 2e-05 then, "
      "3e-05 now"]
