"""A full disk in every writer: one line naming the path and what to free,
nothing finished lost, no staging file left, and the same command completes
once there is room again.

The disk is a small tmpfs (`small_disk` in tests/conftest.py; root only, as CI
runs), filled to a chosen number of bytes; the writers are the real commands.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bertjax import errors, metrics
from bertjax.data import shards
from tests.conftest import corpus_and_vocab, staging_files


def _tool(name, *args, cwd=None):
  return subprocess.run([sys.executable, "-m", f"bertjax.tools.{name}", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=600)


def _full_disk_line(result, path):
  """The command's last line: the full disk, named, with what to do."""
  assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith(f"error: writing {path}") and "the disk is full (" in line, line
  assert "free space on that disk" in line and "rerun the same command" in line, line
  return line


def _size(directory):
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(directory) for name in names)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  return corpus_and_vocab(tmp_path_factory.mktemp("full_disk_inputs"), 3000)


def test_a_data_build_that_fills_the_disk_keeps_its_shards_and_finishes_later(
    inputs, tmp_path, small_disk):
  corpus, vocab = inputs
  args = [f"--input={corpus}", f"--vocab={vocab}", "--num_shards=8", "--num_workers=2"]
  whole = tmp_path / "whole"
  assert _tool("prepare_pretraining_data", *args, f"--output_dir={whole}").returncode == 0
  disk = small_disk("48m")
  out = os.path.join(disk.path, "data")
  disk.fill(leave=_size(whole) // 2)
  result = _tool("prepare_pretraining_data", *args, f"--output_dir={out}")
  line = _full_disk_line(result, out)
  assert "the shards finished before are kept" in line
  assert not staging_files(disk.path)
  finished = [name for name in os.listdir(out) if name.endswith(".stats.json")]
  assert 0 < len(finished) < 8  # some finished, each whole (its recorded size)
  assert not shards.damaged_shards([os.path.join(out, n.replace(".stats.json",
                                                               ".array_record"))
                                    for n in finished])
  disk.free()
  again = _tool("prepare_pretraining_data", *args, f"--output_dir={out}")
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Building {8 - len(finished)} of this host's 8 shards" in again.stderr
  assert shards.read_stats(out).documents_used == shards.read_stats(str(whole)).documents_used

  # The static instances of the same data, on a disk full again.
  disk.fill(leave=64 << 10)
  static = [*args, f"--output_dir={out}", "--static_dupe_factor=5", "--max_seq_length=32",
            "--max_predictions=5"]
  result = _tool("prepare_pretraining_data", *static)
  assert "the instance shards finished before are kept" in _full_disk_line(result, out)
  assert not staging_files(disk.path)
  disk.free()
  assert _tool("prepare_pretraining_data", *static).returncode == 0
  assert len(shards.complete_shards(out, shards.static_kind(32))) == 8


def test_a_vocabulary_and_an_export_on_a_full_disk_leave_what_was_there(
    inputs, tiny_hf_checkpoint, small_disk):
  corpus, _ = inputs
  disk = small_disk("1m")
  output = os.path.join(disk.path, "vocab.txt")
  with open(output, "w") as f:
    f.write("[PAD]\n[UNK]\nthe old one\n")
  disk.fill(leave=0)
  result = _tool("train_vocab", f"--input={corpus}", f"--output={output}", "--vocab_size=300",
                 "--overwrite")
  assert f"{output} is as it was" in _full_disk_line(result, output)
  assert open(output).read() == "[PAD]\n[UNK]\nthe old one\n" and not staging_files(disk.path)

  exported = os.path.join(disk.path, "bert")
  result = _tool("convert", f"--input={tiny_hf_checkpoint}", f"--output={exported}")
  assert f"nothing was written to {exported}" in _full_disk_line(result, exported)
  assert not os.path.exists(exported) and not staging_files(disk.path)
  disk.free()
  assert _tool("convert", f"--input={tiny_hf_checkpoint}",
               f"--output={exported}").returncode == 0


def test_metrics_on_a_full_disk_stop_with_every_line_before_whole(small_disk):
  disk = small_disk("64k")
  path = os.path.join(disk.path, "metrics.jsonl")
  appender = metrics.AppendFile(path)
  line = (json.dumps({"step": 0, "train/loss": 1.0, "pad": "x" * 900}) + "\n").encode()
  with pytest.raises(errors.StorageFullError, match=f"writing {path} failed: the disk is full"):
    for _ in range(1000):
      appender.append(line)
  kept = open(path, "rb").read()
  assert kept and len(kept) % len(line) == 0  # whole lines only: the partial one was cut
  os.truncate(path, len(line))  # room again
  appender.append(line)
  appender.close()
  assert [json.loads(text)["step"] for text in open(path)] == [0, 0]


def test_a_checkpoint_save_on_a_full_disk_stops_in_one_line_and_the_rerun_resumes(
    prepared_dir, small_disk):
  from tests.faults.test_training import _tiny
  from tests.tasks.test_pretrain import ROOT, _env, _losses, _saved_steps

  disk = small_disk("16m")
  workdir = os.path.join(disk.path, "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 20, "eval.every_steps": 0,
                                         "optimizer.warmup_steps": 5})
  first = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  step_size = _size(os.path.join(workdir, "checkpoints", "20"))
  disk.fill(leave=step_size // 2)  # room for metrics lines, not for a checkpoint
  longer = _tiny(workdir, prepared_dir, **{"train.total_steps": 40, "eval.every_steps": 0,
                                           "optimizer.warmup_steps": 5})
  result = subprocess.run(longer, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 2, result.stderr[-3000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith(f"error: saving the checkpoint of step 30 to {workdir}/checkpoints "
                         "failed: the disk is full ("), result.stderr[-5000:]
  assert "resume from step 20" in line and "free space on that disk" in line, line
  assert _saved_steps(workdir) == [10, 20] and not staging_files(workdir)
  disk.free()
  again = subprocess.run(longer, cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert _saved_steps(workdir)[-1] == 40 and max(_losses(workdir)) == 40
  shutil.rmtree(workdir)
