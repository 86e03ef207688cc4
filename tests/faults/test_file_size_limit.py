"""A file-size limit in the writers: "File too large" (EFBIG) is said in one
line naming the path, the limit and what to do, as a full disk is; nothing
finished is lost, no staging file is left, and the same command completes
once the limit is raised.

The limit is real: the command runs under RLIMIT_FSIZE (`ulimit -f`) with
SIGXFSZ ignored, as Python itself ignores it, so a write past the limit fails
with EFBIG in the command and in its worker processes alike.
"""

import os
import resource
import signal
import subprocess
import sys

import pytest

from bertjax.data import shards
from tests.conftest import corpus_and_vocab, staging_files

def _limited(limit):
  def set_limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  return set_limit


def _tool(name, *args, limit=None):
  return subprocess.run([sys.executable, "-m", f"bertjax.tools.{name}", *args],
                        capture_output=True, text=True, timeout=600,
                        preexec_fn=_limited(limit) if limit else None)


def _limit_line(result, path):
  """The command's last line: the limit reached, named, with what to do."""
  assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith(f"error: writing {path} failed: a file reached this process's "
                         "file-size limit ("), line
  assert "ulimit -f" in line and "rerun the same command" in line, line
  return line


def _shard_sizes(directory):
  return {name: os.path.getsize(os.path.join(directory, name))
          for name in os.listdir(directory) if name.endswith(".array_record")}


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
  """(corpus, vocab): the first half of the documents one sentence repeated
  (their shards compress small), the second half as written, so a limit can
  fall between the shards' sizes."""
  root = tmp_path_factory.mktemp("file_size_inputs")
  corpus, vocab = corpus_and_vocab(root, 3000)
  documents = open(corpus, encoding="utf-8").read().strip("\n").split("\n\n")
  half = len(documents) // 2
  repeated = ["\n".join([document.split("\n")[0]] * 8) for document in documents[:half]]
  with open(corpus, "w", encoding="utf-8") as f:
    f.write("\n\n".join(repeated + documents[half:]) + "\n")
  return corpus, vocab


def test_a_data_build_past_a_file_size_limit_keeps_its_shards_and_finishes_later(
    uneven, tmp_path):
  corpus, vocab = uneven
  args = [f"--input={corpus}", f"--vocab={vocab}", "--num_shards=8", "--num_workers=2"]
  whole = str(tmp_path / "whole")
  assert _tool("prepare_pretraining_data", *args, f"--output_dir={whole}").returncode == 0
  sizes = _shard_sizes(whole)
  assert min(sizes.values()) < max(sizes.values()), sizes
  limit = (min(sizes.values()) + max(sizes.values())) // 2

  out = str(tmp_path / "data")
  result = _tool("prepare_pretraining_data", *args, f"--output_dir={out}", limit=limit)
  line = _limit_line(result, out)
  assert "more --num_shards" in line and "the shards finished before are kept" in line, line
  assert not staging_files(out)
  finished = sorted(name[:-len(".stats.json")] + ".array_record" for name in os.listdir(out)
                    if name.endswith(".stats.json"))
  assert 0 < len(finished) < 8, finished
  assert {name: os.path.getsize(os.path.join(out, name)) for name in finished} == {
      name: sizes[name] for name in finished}  # each whole
  assert set(_shard_sizes(out)) == set(finished)  # no unfinished shard left

  again = _tool("prepare_pretraining_data", *args, f"--output_dir={out}")
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Building {8 - len(finished)} of this host's 8 shards" in again.stderr
  assert shards.read_stats(out).documents_used == shards.read_stats(whole).documents_used


def test_a_vocabulary_past_a_file_size_limit_leaves_the_old_one(tmp_path):
  output = str(tmp_path / "vocab.txt")
  with open(output, "w", encoding="utf-8") as f:
    f.write("[PAD]\n[UNK]\nthe old one\n")
  args = ["--input=demo:stdlib", f"--output={output}", "--vocab_size=2000", "--overwrite"]
  result = _tool("train_vocab", *args, limit=8 << 10)
  assert f"{output} is as it was" in _limit_line(result, output)
  assert open(output, encoding="utf-8").read() == "[PAD]\n[UNK]\nthe old one\n"
  assert not staging_files(str(tmp_path))
  assert _tool("train_vocab", *args).returncode == 0
  assert os.path.getsize(output) > 8 << 10
