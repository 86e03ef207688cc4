"""What a run tells its user at the end: commands that paste back into a
shell as printed, from any directory."""

import os
import shlex

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
  assert f"--config.init_checkpoint={workdir}" in fine_tune
  assert f"--workdir={workdir}_sst2" in fine_tune
  look = _command(lines, "Look:")
  assert look[-3:] == ["tensorboard", "--logdir", os.path.join(workdir, "tensorboard")]


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
