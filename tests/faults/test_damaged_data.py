"""Damaged and changed data are named, never read as if they were whole.

A shard with flipped bytes, a shard cut short, a vocabulary edited after the
data was built with it, an input that changed between two runs of a build,
and inputs that cannot be read: each is one line naming the file and what
makes it right, from the commands users run, and a rerun completes.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bertjax import errors
from bertjax.data import builder, loader, shards
from bertjax.data.tokenizers import WordPieceTokenizer
from tests import reference
from tests.conftest import write_corpus


def _tool(name, *args):
  return subprocess.run([sys.executable, "-m", f"bertjax.tools.{name}", *args],
                        capture_output=True, text=True, timeout=600)


def _last_line(result, code=2):
  assert result.returncode == code, result.stdout[-2000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith("error: "), line
  return line


def _vocab_and_corpus_dir(tmp_path):
  vocab = str(tmp_path / "vocab.txt")
  reference.write_vocab(vocab)
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  return vocab, corpus


@pytest.fixture
def built(tmp_path):
  """(data dir, corpus dir, vocab): 3 shards built from two corpus files."""
  vocab, corpus = _vocab_and_corpus_dir(tmp_path)
  write_corpus(corpus / "a.txt", num_documents=80)
  write_corpus(corpus / "b.txt", num_documents=40, seed=1)
  data = str(tmp_path / "data")
  builder.prepare(f"{corpus}/*.txt", data, WordPieceTokenizer(vocab), num_shards=3,
                  show_progress=False)
  return data, corpus, vocab


def _flip_every_chunk(path):
  """Flips a byte in every 2 KiB of a shard's records (riegeli's chunk hashes
  catch each), leaving its size as it was."""
  data = bytearray(open(path, "rb").read())
  for offset in range(100, len(data) - 4096, 2048):
    data[offset] ^= 0xFF
  open(path, "wb").write(bytes(data))


def test_a_shard_with_flipped_bytes_is_named_when_read(built):
  data, _, _ = built
  damaged = os.path.join(data, shards.shard_name(1, 3))
  _flip_every_chunk(damaged)
  with pytest.raises(errors.CorruptFileError) as error:
    source = loader.DocumentSource(data)  # a damaged footer is met here
    for index in range(len(source)):
      source[index]  # a damaged record, here
  message = str(error.value)
  assert message.startswith(f"{damaged} is damaged: ") and "cannot be" in message
  assert f"delete {shards.stats_path(damaged)} and rerun" in message


def test_a_training_run_on_a_flipped_shard_stops_in_one_line_from_its_loader_workers(
    built, tmp_path):
  """The damage is met in a grain worker process: the one line still names it."""
  from tests.faults.test_training import _tiny
  from tests.tasks.test_pretrain import ROOT, _env

  data, _, _ = built
  for index in range(3):
    _flip_every_chunk(os.path.join(data, shards.shard_name(index, 3)))
  args = _tiny(str(tmp_path / "run"), data, **{"data.worker_count": 1})
  result = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=600)
  line = _last_line(result)
  assert f"{data}/documents-0000" in line and "is damaged" in line, line
  assert "and rerun python -m bertjax.tools.prepare_pretraining_data" in line, line


def test_a_shard_cut_short_is_refused_and_the_builder_makes_it_again(built, tmp_path):
  data, corpus, vocab = built
  cut = os.path.join(data, shards.shard_name(2, 3))
  whole = open(cut, "rb").read()
  with open(cut, "r+b") as f:
    f.truncate(len(whole) // 2)
  with pytest.raises(errors.CorruptFileError, match=f"{cut} is damaged \\({len(whole) // 2} "
                                                    f"bytes, {len(whole)} when it was built"):
    loader.DocumentSource(data)
  again = _tool("prepare_pretraining_data", f"--input={corpus}/*.txt", f"--vocab={vocab}",
                f"--output_dir={data}", "--num_shards=3", "--num_workers=1")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "is damaged" in again.stderr and "Building 1 of this host's 3 shards" in again.stderr
  assert open(cut, "rb").read() == whole
  assert len(loader.DocumentSource(data)) == 120


def test_a_vocabulary_edited_after_the_build_is_refused_where_the_data_is_read(built, tmp_path):
  from tests.faults.test_training import _tiny
  from tests.tasks.test_pretrain import ROOT, _env

  data, _, _ = built
  copy = os.path.join(data, "vocab.txt")
  tokens = open(copy).read().splitlines()
  tokens[100], tokens[101] = tokens[101], tokens[100]  # two words swapped: same size
  open(copy, "w").write("\n".join(tokens) + "\n")
  result = subprocess.run(_tiny(str(tmp_path / "run"), data), cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)
  line = _last_line(result)
  assert f"{copy} is not the vocabulary the data in {data} was built with" in line, line
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_a_run_built_vocabulary_edited_since_is_refused(tmp_path):
  """A run that built its own data (data.build_from) checks its vocab.txt."""
  from bertjax.tasks import pretrain_data
  from bertjax.configs import demo

  corpus = write_corpus(tmp_path / "corpus.txt", num_documents=60)
  config = demo.get_config()
  config.data.build_from, config.data.vocab_size = str(corpus), 300
  workdir = str(tmp_path / "run")
  pretrain_data.prepare_data(config, workdir)
  vocab = os.path.join(workdir, "vocab.txt")
  with open(vocab, "a") as f:
    f.write("extra\n")
  with pytest.raises(errors.CorruptFileError, match=f"{vocab} is not the vocabulary "):
    pretrain_data.prepare_data(config, workdir)


def test_an_input_that_changed_since_the_build_is_said_and_rebuilt_only_when_asked(built):
  data, corpus, vocab = built
  args = [f"--input={corpus}/*.txt", f"--vocab={vocab}", f"--output_dir={data}",
          "--num_shards=3", "--num_workers=1"]
  assert _tool("prepare_pretraining_data", *args).returncode == 0  # the same input: kept
  before = {name: open(os.path.join(data, name), "rb").read() for name in os.listdir(data)}
  write_corpus(corpus / "c.txt", num_documents=30, seed=2)
  with open(corpus / "b.txt", "a") as f:
    f.write("One more sentence for the last document.\n")
  line = _last_line(_tool("prepare_pretraining_data", *args))
  assert f"{data} holds a dataset built from the input as it was then; since then: 1 file(s) "
  assert f"added ({corpus}/c.txt)" in line and f"1 of another size ({corpus}/b.txt" in line
  assert "pass --overwrite to build it anew" in line, line
  assert {name: open(os.path.join(data, name), "rb").read()
          for name in os.listdir(data)} == before  # untouched
  rebuilt = _tool("prepare_pretraining_data", *args, "--overwrite")
  assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
  # 120 + 30 documents, and the line added after b.txt's last blank line: one more.
  assert "documents:  151 read = 151 used" in rebuilt.stdout


def test_a_build_cut_short_never_finishes_from_an_input_that_changed(built):
  """Finished shards of the old input and new shards of the new one would
  mix (documents twice, or never): the rerun refuses instead."""
  data, corpus, vocab = built
  os.remove(shards.stats_path(os.path.join(data, shards.shard_name(2, 3))))  # unfinished
  shutil.copy(corpus / "b.txt", corpus / "b2.txt")
  line = _last_line(_tool("prepare_pretraining_data", f"--input={corpus}/*.txt",
                          f"--vocab={vocab}", f"--output_dir={data}", "--num_shards=3"))
  assert f"added ({corpus}/b2.txt)" in line, line
  with pytest.raises(errors.UsageError, match="unfinished"):
    shards.complete_shards(data)  # still not complete: nothing was marked finished


def test_inputs_that_cannot_be_read_are_named_like_skipped_ones(tmp_path):
  vocab, corpus = _vocab_and_corpus_dir(tmp_path)
  write_corpus(corpus / "good.txt", num_documents=10)
  os.symlink(tmp_path / "gone.txt", corpus / "broken.txt")
  os.symlink(corpus / "loop_b.txt", corpus / "loop_a.txt")  # unreadable, even for root
  os.symlink(corpus / "loop_a.txt", corpus / "loop_b.txt")
  result = _tool("prepare_pretraining_data", f"--input={corpus}/*.txt", f"--vocab={vocab}",
                 f"--output_dir={tmp_path / 'out'}", "--num_shards=1")
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f"skipped files: 1 (link to a missing file): {corpus}/broken.txt"
          in result.stdout), result.stdout
  assert (f"skipped files: 2 (unreadable (Too many levels of symbolic links)): "
          f"{corpus}/loop_a.txt, {corpus}/loop_b.txt" in result.stdout), result.stdout
  info = json.load(open(tmp_path / "out" / shards.INFO_FILE))
  assert info["input_files"][f"{corpus}/broken.txt"][2] == "link to a missing file"
  if os.geteuid() != 0:  # root reads every file
    os.chmod(corpus / "good.txt", 0)
    result = _tool("train_vocab", f"--input={corpus}/*.txt", f"--output={tmp_path / 'v.txt'}")
    assert "unreadable (Permission denied)" in result.stdout + result.stderr
