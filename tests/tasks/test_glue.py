"""GLUE fine-tuning end to end: a tiny pre-training run and a Hugging Face
checkpoint, fine-tuned on small learnable tasks written in GLUE's formats."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.envs import cpu_env
from tests.tasks.finetuning import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILLER = "the quick brown fox jump over lazy world test".split()


def _sentence(rng, keyword):
  words = list(rng.choice(FILLER, rng.integers(3, 8)))
  words.insert(rng.integers(0, len(words) + 1), keyword)
  return " ".join(words)


def write_sst2(directory, seed=0, train=512, dev=128, test=40):
  """SST-2's layout; the label says whether "hello" (1) or "dog" (0) is in the sentence."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  for name, count in (("train.tsv", train), ("dev.tsv", dev)):
    labels = rng.integers(0, 2, count)
    lines = ["sentence\tlabel"] + [f"{_sentence(rng, 'hello' if y else 'dog')}\t{y}"
                                   for y in labels]
    open(os.path.join(directory, name), "w").write("\n".join(lines) + "\n")
  lines = ["index\tsentence"] + [f"{i}\t{_sentence(rng, 'hello')}" for i in range(test)]
  open(os.path.join(directory, "test.tsv"), "w").write("\n".join(lines) + "\n")


def write_rte(directory, seed=0, train=512, dev=128):
  """RTE's layout; "entailment" when the second sentence holds "hello"."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  for name, count in (("train.tsv", train), ("dev.tsv", dev)):
    labels = rng.integers(0, 2, count)
    lines = ["index\tsentence1\tsentence2\tlabel"] + [
        f"{i}\t{_sentence(rng, 'world')}\t{_sentence(rng, 'hello' if y else 'dog')}\t"
        f"{'entailment' if y else 'not_entailment'}" for i, y in enumerate(labels)]
    open(os.path.join(directory, name), "w").write("\n".join(lines) + "\n")


def _glue_config(task, init_checkpoint, data_dir, **changes):
  from bertjax.configs import glue as glue_config

  changes = {"data.dir": data_dir, "train.epochs": 4.0, **changes}
  return tiny_config(glue_config.get_config(task), init_checkpoint,
                     changes.pop("max_seq_length", 16), **changes)


def _pretrain(prepared_dir, workdir, objective="mlm_nsp"):
  """A short bertjax pre-training run (L2/H32 on the test vocabulary)."""
  from bertjax.configs import demo
  from bertjax.tasks import pretrain

  config = demo.get_config()
  config.objective = objective
  config.data.dir = prepared_dir
  config.model.vocab_size = 210
  config.model.hidden_size, config.model.num_heads, config.model.intermediate_size = 32, 2, 64
  config.train.batch_size, config.eval.batch_size = 8, 8
  config.train.max_seq_length, config.train.max_predictions = 32, 5
  config.train.total_steps, config.optimizer.warmup_steps = 20, 2
  config.eval.every_steps = 0
  pretrain.run(config, workdir)
  return workdir


@pytest.fixture(scope="module")
def pretrained_run(prepared_dir, tmp_path_factory):
  return _pretrain(prepared_dir, str(tmp_path_factory.mktemp("pretrained")))


def test_fine_tunes_from_a_pretraining_run(pretrained_run, tmp_path, absl_caplog):
  from bertjax.tasks import glue

  data = str(tmp_path / "SST-2")
  write_sst2(data)
  workdir = str(tmp_path / "run")
  caplog = absl_caplog
  with caplog.at_level("INFO"):
    result = glue.run(_glue_config("sst2", pretrained_run, data), workdir)
  assert "initialised randomly: classifier/bias, classifier/kernel" in caplog.text
  # Log lines with the time left; the last lines say what was made and what next.
  assert re.search(r"step 20/64  loss \S+  accuracy \S+ .* eta \dm\d\ds", caplog.text)
  dev_labels = [line.rsplit("\t", 1)[1] for line in open(os.path.join(data, "dev.tsv"))
                .read().splitlines()[1:]]
  commonest = max(sorted(set(dev_labels)), key=dev_labels.count)
  share = 100.0 * dev_labels.count(commonest) / len(dev_labels)
  # The dev figures beside what always guessing dev's commonest class scores.
  assert re.search(r"Done\. dev: accuracy (9\d|100)\.\d{4}; always guessing the commonest "
                   rf"class \({commonest}\): accuracy {share:.4f}", caplog.text)
  assert (f"Wrote to {workdir}: dev_predictions.tsv, metrics.jsonl, model, results.json, "
          "submission") in caplog.text
  assert f"--input={workdir}/model --output={workdir}/model_hf" in caplog.text
  assert result["dev"]["accuracy"] > 95.0, result
  assert [h["step"] for h in result["epochs"]] == [16, 32, 48, 64]
  saved = json.load(open(os.path.join(workdir, "results.json")))
  assert saved["dev"] == result["dev"]
  assert saved["baseline"] == {"dev": {"always": commonest, "accuracy": share}}
  submission = open(os.path.join(workdir, "submission", "SST-2.tsv")).read().splitlines()
  assert submission[0] == "index\tprediction" and len(submission) == 41
  assert submission[1].startswith("0\t")
  assert sum(line.endswith("\t1") for line in submission[1:]) >= 38  # every test row has "hello"
  dev_rows = open(os.path.join(workdir, "dev_predictions.tsv")).read().splitlines()
  assert len(dev_rows) == 129 and dev_rows[0] == "index\tprediction\tlabel"
  assert [row.split("\t")[2] for row in dev_rows[1:]] == dev_labels  # the gold labels
  correct = [row.split("\t")[1] == row.split("\t")[2] for row in dev_rows[1:]]
  assert 100.0 * sum(correct) / len(correct) == pytest.approx(result["dev"]["accuracy"])

  # The fine-tuned model loads back with its labels and predicts the same.
  import bertjax
  tuned = bertjax.load_pretrained(os.path.join(workdir, "model"))
  assert tuned.task == "sequence_classification" and tuned.labels == ["0", "1"]


def test_fine_tunes_on_the_demo_task_offline(pretrained_run, tmp_path):
  """configs/demo_finetune.py: the standard library's sentences by area, read
  offline; a short run writes what a GLUE run writes, without a test set.
  (The demo's own model learns it: docs/benchmarks.md; the tests' model has a
  210-word vocabulary, so this run checks the path, not the learning.)"""
  import bertjax
  from bertjax.configs import demo_finetune
  from bertjax.data import stdlib_topics
  from bertjax.tasks import glue

  config = tiny_config(demo_finetune.get_config(), pretrained_run, 32, **{"train.epochs": 0.05})
  workdir = str(tmp_path / "run")
  result = glue.run(config, workdir)
  dev = stdlib_topics.read_split("dev")
  assert result["task"] == "stdlib_topics" and 0.0 <= result["dev"]["accuracy"] <= 100.0
  assert result["epochs"][0]["step"] == int(len(stdlib_topics.read_split("train")) / 32 * 0.05)
  rows = open(os.path.join(workdir, "dev_predictions.tsv")).read().splitlines()
  assert len(rows) == len(dev) + 1
  assert {row.split("\t")[1] for row in rows[1:]} <= set(stdlib_topics.AREAS)
  assert [row.split("\t")[2] for row in rows[1:]] == [e.label for e in dev]
  # The baseline the docs quote: always guessing the commonest area.
  areas = [e.label for e in dev]
  assert result["baseline"]["dev"]["always"] == "gui" == max(set(areas), key=areas.count)
  assert f"{result['baseline']['dev']['accuracy']:.1f}" == "29.0"
  assert not os.path.exists(os.path.join(workdir, "submission"))
  assert bertjax.load_pretrained(os.path.join(workdir, "model")).labels == list(
      stdlib_topics.AREAS)
  config.data.task = "sst2"
  with pytest.raises(ValueError, match="config.data.source='demo' has one task, "
                                       "'stdlib_topics', not 'sst2'"):
    glue.run(config, str(tmp_path / "other"))


def test_the_baseline_and_the_gold_labels_of_a_class_task_and_of_sts_b(tmp_path):
  from bertjax.data import glue as glue_data
  from bertjax.tasks import glue

  def examples(labels):
    return [glue_data.Example(f"dev-{i}", "a", "b", label, i) for i, label in enumerate(labels)]

  cola = glue_data.task_spec("cola")
  dev = examples(["1", "0", "1", "1"])
  # Always "1": 75% accurate, no correlation with the gold labels.
  assert glue.baseline(cola, dev) == {"always": "1", "matthews_corr": 0.0, "accuracy": 75.0}
  mrpc = examples(["1", "0", "1", "1"])
  assert glue.baseline(glue_data.task_spec("mrpc"), mrpc) == {
      "always": "1", "f1": pytest.approx(100 * 6 / 7), "accuracy": 75.0}
  stsb = glue_data.task_spec("stsb")
  assert glue.baseline(stsb, examples([4.2, 1.0])) is None  # a constant has no correlation
  path = str(tmp_path / "dev_predictions.tsv")
  dev = examples([4.25, 0.0])
  glue.write_predictions(path, dev, glue.label_strings(stsb, np.array([3.5, 5.5])),
                         glue.gold_strings(stsb, dev))
  assert open(path).read() == "index\tprediction\tlabel\n0\t3.500\t4.250\n1\t5.000\t0.000\n"


def test_a_left_to_right_model_fine_tunes(prepared_dir, tmp_path):
  """Table 5's "LTR & No NSP" row: the causal model keeps its mask and its
  classifier reads the last token, which has seen the whole input ([CLS], under
  the causal mask, sees only itself: every input would get the same logits)."""
  import bertjax
  from bertjax.tasks import glue

  run = _pretrain(prepared_dir, str(tmp_path / "ltr"), objective="ltr")
  data = str(tmp_path / "SST-2")
  write_sst2(data)
  result = glue.run(_glue_config("sst2", run, data), str(tmp_path / "run"))
  assert result["dev"]["accuracy"] > 90.0, result
  tuned = bertjax.load_pretrained(str(tmp_path / "run" / "model"))
  assert tuned.config.causal and tuned.task == "sequence_classification"
  # transformers' classifier pools [CLS]: no export that would compute otherwise.
  with pytest.raises(ValueError, match="pools its last token"):
    bertjax.export_hf(tuned, str(tmp_path / "hf"))
  assert not os.path.exists(tmp_path / "hf")


def test_fine_tunes_an_imported_hugging_face_checkpoint_with_main(tiny_hf_checkpoint, tmp_path):
  hf_dir = tiny_hf_checkpoint
  data = str(tmp_path / "RTE")
  write_rte(data)
  workdir = str(tmp_path / "run")
  env = cpu_env(2)
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/glue.py:rte",
       f"--workdir={workdir}", f"--config.init_checkpoint={hf_dir}",
       f"--config.data.dir={data}", "--config.model.dtype=float32",
       "--config.max_seq_length=32", "--config.train.learning_rate=2e-3",
       "--config.train.epochs=6"], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  results = json.load(open(os.path.join(workdir, "results.json")))
  assert results["dev"]["accuracy"] > 90.0, results
  assert json.load(open(os.path.join(workdir, "config.json")))["data"]["task"] == "rte"
  assert not os.path.exists(os.path.join(workdir, "submission", "RTE.tsv"))  # no test.tsv


def test_config_needs_a_task_and_a_sound_setup(tmp_path, pretrained_run):
  from bertjax.configs import glue as glue_config
  from bertjax.tasks import glue

  with pytest.raises(ValueError, match="needs a GLUE task as its argument, one of cola"):
    glue_config.get_config(None)
  data = str(tmp_path / "SST-2")
  write_sst2(data, train=7)  # int(7 / 32 * 4) = 0 steps
  with pytest.raises(ValueError, match=r"7 training examples x train.epochs=4.0 make no batch"):
    glue.run(_glue_config("sst2", pretrained_run, data), str(tmp_path / "a"))
  with pytest.raises(ValueError, match="max_seq_length=512 is above"):
    glue.run(_glue_config("sst2", pretrained_run, data, max_seq_length=512),
             str(tmp_path / "b"))
  with pytest.raises(ValueError, match="SST-2/train.tsv: no usable rows"):  # SST-2 files
    glue.run(_glue_config("rte", pretrained_run, data), str(tmp_path / "c"))
  with pytest.raises(FileNotFoundError, match="config.data.dir must hold the rte TSVs"):
    glue.run(_glue_config("rte", pretrained_run, str(tmp_path)), str(tmp_path / "d"))


def test_two_processes_fine_tune_like_one(tiny_hf_checkpoint, tmp_path):
  import socket

  data = str(tmp_path / "RTE")
  write_rte(data, train=128, dev=64)

  def command(workdir):
    return [sys.executable, "-m", "bertjax.main", "--config=configs/glue.py:rte",
            f"--workdir={workdir}", f"--config.init_checkpoint={tiny_hf_checkpoint}",
            f"--config.data.dir={data}", "--config.model.dtype=float32",
            "--config.max_seq_length=32", "--config.train.learning_rate=2e-3",
            "--config.train.epochs=2", "--config.log_every_steps=1"]

  one = str(tmp_path / "one")
  result = subprocess.run(command(one), cwd=ROOT, capture_output=True, text=True,
                          env=cpu_env(2),
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  two = str(tmp_path / "two")
  processes = [subprocess.Popen(
      command(two) + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                      f"--process_id={i}"], cwd=ROOT, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True,
      env=cpu_env(1, JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")) for i in range(2)]
  outputs = [p.communicate(timeout=600)[1] for p in processes]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output[-3000:]

  def losses(workdir):
    lines = open(os.path.join(workdir, "metrics.jsonl")).read().splitlines()
    return [json.loads(line)["train/loss"] for line in lines if "train/loss" in line]
  # The same global batches on a 2-device mesh; only reduction order may differ.
  np.testing.assert_allclose(losses(two), losses(one), rtol=1e-4)
  assert open(os.path.join(two, "dev_predictions.tsv")).read() == open(
      os.path.join(one, "dev_predictions.tsv")).read()
  assert os.path.isfile(os.path.join(two, "model", "bertjax.json"))


def test_sharded_mesh_fine_tunes_like_data_parallel(pretrained_run, tmp_path):
  from bertjax.tasks import glue

  data = str(tmp_path / "SST-2")
  write_sst2(data, train=128, dev=32, test=4)

  def losses(workdir):
    lines = open(os.path.join(workdir, "metrics.jsonl")).read().splitlines()
    return [json.loads(line)["train/loss"] for line in lines if "train/loss" in line]

  runs = {}
  for name, mesh in (("data", (-1, 1, 1)), ("mixed", (2, 2, 2))):
    config = _glue_config("sst2", pretrained_run, data, **{
        "train.epochs": 2.0, "log_every_steps": 1, "mesh.data": mesh[0], "mesh.fsdp": mesh[1],
        "mesh.tensor": mesh[2]})
    runs[name] = glue.run(config, str(tmp_path / name))
    runs[name]["losses"] = losses(str(tmp_path / name))
  # Parameters sharded over fsdp and tensor give the data-parallel run's losses.
  np.testing.assert_allclose(runs["mixed"]["losses"], runs["data"]["losses"], rtol=1e-4)
  assert len(runs["data"]["losses"]) == 8


def test_fine_tuning_takes_the_papers_dropout_whatever_the_checkpoint_says(pretrained_run,
                                                                           tmp_path):
  """bertjax's pre-training leaves attention dropout out (the fused kernels
  have none); fine-tuning runs the paper's 0.1 on every layer and on the
  attention probabilities, on an attention kernel that has it. A negative
  setting keeps the checkpoint's."""
  import bertjax
  from bertjax.tasks import finetune

  data = str(tmp_path / "SST-2")
  config = _glue_config("sst2", pretrained_run, data)
  assert bertjax.load_pretrained(pretrained_run).config.attention_dropout_prob == 0.0
  bundle = finetune.load_model(config, "sequence_classification", ["0", "1"])
  assert (bundle.config.hidden_dropout_prob, bundle.config.attention_dropout_prob) == (0.1, 0.1)
  config.model.attention_dropout_prob = -1.0
  assert finetune.load_model(config, "sequence_classification",
                             ["0", "1"]).config.attention_dropout_prob == 0.0

  # A model saved to run the splash kernel (no attention dropout) fine-tunes on "auto".
  splash = bertjax.load_pretrained(pretrained_run)
  splash.config = splash.config.replace(attention_impl="splash")
  bertjax.save_pretrained(splash, str(tmp_path / "splash"))
  config = _glue_config("sst2", str(tmp_path / "splash"), data)
  bundle = finetune.load_model(config, "sequence_classification", ["0", "1"])
  assert bundle.config.attention_impl == "auto"
  assert bundle.config.attention_dropout_prob == 0.1
