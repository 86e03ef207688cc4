"""Paths as users type them: resolved once where they enter (bertjax.paths)."""

import os
import subprocess
import sys

from bertjax import paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_local_path_is_made_absolute_against_the_directory_it_was_typed_in(tmp_path,
                                                                             monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.resolve("runs/demo") == str(tmp_path / "runs" / "demo")
  assert paths.resolve("./a/../b") == str(tmp_path / "b")
  assert paths.resolve("~/x") == os.path.join(os.path.expanduser("~"), "x")
  for kept in ("gs://bucket/run", "", None, "/abs/path"):
    assert paths.resolve(kept) == kept


def test_a_hub_id_stays_an_id_unless_such_a_path_exists(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.resolve_model("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"
  (tmp_path / "org" / "model").mkdir(parents=True)
  assert paths.resolve_model("org/model") == str(tmp_path / "org" / "model")
  assert paths.resolve_model("models/a/b") == str(tmp_path / "models" / "a" / "b")  # 3 parts
  assert paths.resolve_model("gs://b/m") == "gs://b/m"


def test_a_corpus_source_resolves_each_local_part(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.resolve_inputs("demo:stdlib") == "demo:stdlib"
  assert paths.resolve_inputs("tfds:wikipedia/20230601.en:train") == (
      "tfds:wikipedia/20230601.en:train")
  assert paths.resolve_inputs("a.txt, corpus/*.txt,gs://b/c/*.gz") == ",".join(
      [str(tmp_path / "a.txt"), str(tmp_path / "corpus" / "*.txt"), "gs://b/c/*.gz"])


def test_a_config_has_its_path_fields_resolved_and_nothing_else(tmp_path, monkeypatch):
  from bertjax.configs import glue, squad

  monkeypatch.chdir(tmp_path)
  (tmp_path / "runs" / "bert").mkdir(parents=True)  # else `runs/bert` reads as a Hub id
  config = glue.get_config("mrpc")
  config.init_checkpoint, config.data.dir = "runs/bert", "glue_data/MRPC"
  paths.resolve_config(config)
  assert config.init_checkpoint == str(tmp_path / "runs" / "bert")
  assert config.data.dir == str(tmp_path / "glue_data" / "MRPC")
  config = squad.get_config("v1.1")
  config.data.train_file, config.init_checkpoint = "train-v1.1.json", "org/name"
  paths.resolve_config(config)
  assert config.data.train_file == str(tmp_path / "train-v1.1.json")
  assert config.init_checkpoint == "org/name"  # a Hub id
  config = squad.get_config("v1.1")
  config.data.source, config.data.train_file = "tfds", "train"  # a TFDS split, not a path
  paths.resolve_config(config)
  assert config.data.train_file == "train"


def _run(args, cwd, **kwargs):
  return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=300, **kwargs)


def test_configs_load_from_any_directory_and_a_users_config_builds_on_them(tmp_path):
  """A shipped config by its path from elsewhere, and a config file of the
  user's own, kept beside their data, that starts from a shipped one."""
  mine = tmp_path / "my_configs" / "small_run.py"
  mine.parent.mkdir()
  mine.write_text(
      "from bertjax.configs import base_pretrain, common\n\n"
      "def get_config(arg=None):\n"
      "  config = base_pretrain.get_config(arg)\n"
      "  config.model.update(common.model_config('bert_L2_H128'))\n"
      "  config.data.dir = 'data/wiki'\n"
      "  return config\n")
  script = ("import sys; from absl import flags; from ml_collections import config_flags\n"
            "from bertjax import usage\n"
            "c = config_flags.DEFINE_config_file('config', lock_config=True)\n"
            "usage.parse_flags(sys.argv)\n"
            "print(c.value.model.num_layers, c.value.data.dir, c.value.objective)\n")
  shipped = _run(["-c", script, f"--config={ROOT}/configs/base_pretrain.py:no_nsp"], tmp_path)
  assert shipped.returncode == 0, shipped.stderr
  assert shipped.stdout.split() == ["12", "mlm_pairs"]  # (data.dir is empty)
  own = _run(["-c", script, "--config=my_configs/small_run.py:ltr"], tmp_path)
  assert own.returncode == 0, own.stderr
  assert own.stdout.split() == ["2", str(tmp_path / "data" / "wiki"), "ltr"]


def test_a_config_of_the_old_imports_is_one_line_saying_where_they_went(tmp_path):
  old = tmp_path / "old.py"
  old.write_text("from configs import common\n\ndef get_config(arg=None):\n"
                 "  return common.pretrain_config()\n")
  result = _run(["-m", "bertjax.main", f"--config={old}", "--workdir=w"], tmp_path)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith("error: --config: ")
  assert "bertjax.configs" in result.stderr and "Traceback" not in result.stderr


def test_path_flags_are_resolved_as_they_are_parsed(tmp_path, monkeypatch):
  from absl import flags

  monkeypatch.chdir(tmp_path)
  values = flags.FlagValues()
  output = paths.DEFINE_path("output", None, "a path", flag_values=values)
  model = paths.DEFINE_path("model", None, "a model", kind="model", flag_values=values)
  inputs = paths.DEFINE_path("input", "demo:stdlib", "a corpus", kind="inputs",
                             flag_values=values)
  values(["prog", "--output=out/x", "--model=org/name"])
  assert output.value == str(tmp_path / "out" / "x")
  assert model.value == "org/name" and inputs.value == "demo:stdlib"
  values(["prog", "--input=a.txt,b/*.txt"])
  assert inputs.value == f"{tmp_path / 'a.txt'},{tmp_path / 'b' / '*.txt'}"


def test_the_data_tools_take_relative_paths_from_any_directory(tmp_path):
  from bertjax.data import shards
  from tests.conftest import write_corpus

  (tmp_path / "corpus").mkdir()
  write_corpus(tmp_path / "corpus" / "a.txt", num_documents=30)
  vocab = _run(["-m", "bertjax.tools.train_vocab", "--input=corpus/*.txt",
                "--output=vocab/vocab.txt", "--vocab_size=300"], tmp_path)
  assert vocab.returncode == 0, vocab.stderr[-3000:]
  assert f"Wrote {tmp_path / 'vocab' / 'vocab.txt'}" in vocab.stdout
  data = _run(["-m", "bertjax.tools.prepare_pretraining_data", "--input=corpus/*.txt",
               "--vocab=vocab/vocab.txt", "--output_dir=data", "--num_shards=2"], tmp_path)
  assert data.returncode == 0, data.stderr[-3000:]
  info = shards.read_info(str(tmp_path / "data"))
  assert info["input"] == str(tmp_path / "corpus" / "*.txt")  # the same files from anywhere
  assert list(info["input_files"]) == [str(tmp_path / "corpus" / "a.txt")]
