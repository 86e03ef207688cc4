"""Faults in building data and vocabularies: nothing lost, and one clear message.

Each test is a fault a user meets (unusable input over an existing dataset or
vocabulary, a stray NUL byte, UTF-16 or gzip files, hosts sharing a file
system) and checks that finished work survives and the message says what to do.
"""

import gzip
import json
import os
import socket
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from tqdm import tqdm

from bertjax import files
from bertjax.data import builder, corpus, shards, vocabulary
from bertjax.data.tokenizers import WordPieceTokenizer
from tests import reference
from tests.conftest import write_corpus

# Lines that read as text but hold no token: every document of it is skipped.
_UNUSABLE = "\u200b\u200b\n\n\u200c\u200d\n\n   \n\u2060\n".encode()


@pytest.fixture()
def vocab(tmp_path):
  path = tmp_path / "vocab.txt"
  reference.write_vocab(str(path))
  return str(path)


def _tool(name, *args):
  return subprocess.run([sys.executable, "-m", f"bertjax.tools.{name}", *args],
                        capture_output=True, text=True, timeout=300)


def _error_line(result):
  """The tool's error: the last line of stderr, after which nothing follows, as
  every command says one (`error: ...`, exit status 2)."""
  assert result.returncode == 2, result.stdout + result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith("error: "), line
  return line


def _snapshot(directory):
  return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def test_failed_overwrite_keeps_the_old_dataset(tmp_path, vocab):
  good = write_corpus(tmp_path / "good.txt", num_documents=20)
  out = tmp_path / "out"
  builder.prepare(str(good), str(out), WordPieceTokenizer(vocab), num_shards=2,
                  show_progress=False)
  before = _snapshot(out)
  junk = tmp_path / "junk.txt"
  junk.write_bytes(_UNUSABLE)
  result = _tool("prepare_pretraining_data", f"--input={junk}", f"--vocab={vocab}",
                 f"--output_dir={out}", "--num_shards=2", "--num_workers=1", "--overwrite")
  line = _error_line(result)
  assert str(junk) in line, line
  assert "no usable document" in line and "kept" in line, line
  assert "documents:  3 read = 0 used + 3 skipped" in result.stdout  # the summary, as ever
  assert _snapshot(out) == before  # the old dataset, byte for byte
  assert len(shards.complete_shards(str(out))) == 2
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".out")]  # no staging left


def test_failed_overwrite_on_gcs_keeps_the_old_dataset(tmp_path, vocab, gcs):
  """On gs:// the new dataset is uploaded only once it holds a usable document."""
  remote = gcs.url_of("overwrite/out")
  good = write_corpus(tmp_path / "good.txt", num_documents=12)
  builder.prepare(str(good), remote, WordPieceTokenizer(vocab), num_shards=2,
                  show_progress=False)
  before = {name: files.read_bytes(files.join(remote, name)) for name in files.listdir(remote)}
  junk = tmp_path / "junk.txt"
  junk.write_bytes(_UNUSABLE)
  with pytest.raises(ValueError, match="no usable document") as error:
    builder.prepare(str(junk), remote, WordPieceTokenizer(vocab), num_shards=3,
                    overwrite=True, show_progress=False)
  assert {name: files.read_bytes(files.join(remote, name))
          for name in files.listdir(remote)} == before
  assert f"the dataset in {remote} is kept" in str(error.value)
  other = write_corpus(tmp_path / "other.txt", num_documents=5, seed=3)
  builder.prepare(str(other), remote, WordPieceTokenizer(vocab), num_shards=3, overwrite=True,
                  show_progress=False)
  assert len(shards.complete_shards(remote)) == 3
  assert not [n for n in files.listdir(remote) if "-of-00002" in n]  # the old shards are gone
  assert shards.read_stats(shards.local_directory(remote)).documents_used == 5


def test_no_document_is_never_marked_finished(tmp_path, vocab):
  junk = tmp_path / "junk.txt"
  junk.write_bytes(_UNUSABLE)
  out = tmp_path / "out"
  with pytest.raises(ValueError) as error:
    builder.prepare(str(junk), str(out), WordPieceTokenizer(vocab), num_shards=2,
                    show_progress=False)
  message = str(error.value)
  assert str(junk) in message and "no usable document" in message
  assert "3 skipped" in message  # the summary's account
  assert not out.exists()  # nothing written, nothing marked finished
  # The failed attempt left nothing that would refuse the corrected input.
  good = write_corpus(tmp_path / "good.txt", num_documents=5)
  stats = builder.prepare(str(good), str(out), WordPieceTokenizer(vocab), num_shards=2,
                          show_progress=False)
  assert stats.documents_used == 5


def test_command_line_zero_documents_is_one_line(tmp_path, vocab):
  junk = tmp_path / "junk.txt"
  junk.write_bytes(_UNUSABLE)
  result = _tool("prepare_pretraining_data", f"--input={junk}", f"--vocab={vocab}",
                 f"--output_dir={tmp_path / 'out'}", "--num_shards=1", "--num_workers=1")
  line = _error_line(result)
  assert str(junk) in line and "no usable document" in line
  assert "skipped documents: 3 (no sentences)" in result.stdout
  assert not list((tmp_path / "out").glob("*.stats.json"))


def test_train_vocab_needs_overwrite_to_replace_a_vocabulary(tmp_path):
  good = write_corpus(tmp_path / "good.txt", num_documents=40)
  output = tmp_path / "vocab.txt"
  output.write_text("[PAD]\n[UNK]\nmine\n")
  result = _tool("train_vocab", f"--input={good}", f"--output={output}", "--vocab_size=200")
  line = _error_line(result)
  assert str(output) in line and "--overwrite" in line, line
  assert output.read_text() == "[PAD]\n[UNK]\nmine\n"
  replaced = _tool("train_vocab", f"--input={good}", f"--output={output}", "--vocab_size=200",
                   "--overwrite")
  assert replaced.returncode == 0, replaced.stderr
  assert output.read_text().split("\n")[:5] == vocabulary.SPECIAL_TOKENS
  assert "documents:  40 read = 40 used + 0 skipped" in replaced.stdout


@pytest.mark.parametrize("model,name", [("wordpiece", "vocab.txt"),
                                        ("sentencepiece", "spm.model")])
def test_train_vocab_over_unusable_text_keeps_the_old_vocabulary(tmp_path, model, name):
  output = tmp_path / name
  output.write_bytes(b"the old one\n")
  inputs = tmp_path / "in"
  inputs.mkdir()
  (inputs / "junk.txt").write_bytes(_UNUSABLE)
  (inputs / "program.bin").write_bytes(bytes(range(256)) * 64)
  result = _tool("train_vocab", f"--input={inputs}/*", f"--output={output}",
                 f"--model={model}", "--vocab_size=300", "--overwrite")
  line = _error_line(result)
  assert f"{inputs}/*" in line, line
  assert output.read_bytes() == b"the old one\n"
  assert sorted(os.listdir(tmp_path)) == sorted(["in", name])  # no staging file left
  # The same account as the builder's, naming the skipped file.
  assert "files:      1 read, 1 skipped" in result.stdout, result.stdout
  assert "program.bin" in result.stdout


def test_train_vocab_refuses_a_degenerate_vocabulary(tmp_path):
  tiny = tmp_path / "tiny.txt"
  tiny.write_text("ok.\n")
  output = tmp_path / "vocab.txt"
  result = _tool("train_vocab", f"--input={tiny}", f"--output={output}", "--vocab_size=1000")
  line = _error_line(result)
  assert str(tiny) in line and "too little" in line, line
  assert not output.exists()


def _documents_of(path):
  stats = corpus.CorpusStats()
  usable = corpus.scan_files([str(path)], stats)
  documents = [d for part in corpus.plan_ranges(usable, 3) for r in part
               for d in corpus.read_range(r, "sentences", stats)]
  return documents, stats


def _good_documents(count=6):
  return [[f"document {d} sentence {s} is here." for s in range(3)] for d in range(count)]


def _text(documents):
  return "".join("\n".join(d) + "\n\n" for d in documents)


def test_one_nul_byte_skips_its_line_not_the_file(tmp_path):
  documents = _good_documents()
  for name, filler_lines in (("early.txt", 0), ("late.txt", 800)):  # NUL in/after 8 KB
    before = [["a filler sentence of the first document."] * filler_lines] if filler_lines \
        else []
    text = _text(before + documents[:2]) + documents[2][0] + "\na broken\x00line.\n"
    text += "\n".join(documents[2][1:]) + "\n\n" + _text(documents[3:])
    (tmp_path / name).write_text(text)
    got, stats = _documents_of(tmp_path / name)
    assert got == before + documents, name
    assert stats.files_read == 1 and not stats.files_skipped, name
    assert stats.lines_skipped == {"NUL bytes": 1}, name


def test_binary_files_are_skipped_and_named(tmp_path):
  for i in range(7):
    (tmp_path / f"blob{i}.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
  write_corpus(tmp_path / "text.txt", num_documents=3)
  stats = corpus.CorpusStats()
  usable = corpus.scan_files(corpus.expand_inputs(f"{tmp_path}/*"), stats)
  assert [path for path, *_ in usable] == [str(tmp_path / "text.txt")]
  assert sum(stats.files_skipped.values()) == 7
  summary = stats.summary()
  named = [f"blob{i}.bin" for i in range(7) if f"blob{i}.bin" in summary]
  assert named == [f"blob{i}.bin" for i in range(5)], summary
  assert "and 2 more" in summary, summary
  # The names survive the stats' round trip through a shard's .stats.json.
  assert corpus.CorpusStats.from_dict(stats.to_dict()).summary() == summary


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_text_with_a_byte_order_mark_is_read(tmp_path, encoding):
  documents = _good_documents(20) + [["Ünïcödé wörds, 東京 and ẞ."]]
  path = tmp_path / "wide.txt"
  bom = {"utf-16": b"", "utf-16-be": b"\xfe\xff", "utf-32": b""}[encoding]
  path.write_bytes(bom + _text(documents).encode(encoding))
  got, stats = _documents_of(path)
  assert got == documents
  assert stats.files_read == 1 and not stats.lines_skipped


def test_utf16_without_a_byte_order_mark_is_named(tmp_path):
  path = tmp_path / "wide.txt"
  path.write_bytes(_text(_good_documents()).encode("utf-16-le"))
  got, stats = _documents_of(path)
  assert got == []
  assert list(stats.files_skipped) == ["UTF-16 without a byte-order mark (convert it to UTF-8)"]
  assert "wide.txt" in stats.summary()


@pytest.mark.parametrize("name", ["corpus.txt.gz", "corpus.txt"])
def test_gzip_files_are_read(tmp_path, vocab, name):
  documents = _good_documents(30)
  path = tmp_path / name
  path.write_bytes(gzip.compress(_text(documents).encode()))
  got, stats = _documents_of(path)
  assert got == documents
  stats = builder.prepare(str(path), str(tmp_path / "out"), WordPieceTokenizer(vocab),
                          num_shards=3, show_progress=False)
  assert stats.documents_used == 30 and stats.files_read == 1


def test_a_cut_gzip_file_keeps_what_precedes_the_cut(tmp_path):
  documents = _good_documents(400)
  data = gzip.compress(_text(documents).encode())
  path = tmp_path / "cut.txt.gz"
  path.write_bytes(data[:len(data) // 2])  # an interrupted download
  got, stats = _documents_of(path)
  assert 0 < len(got) < 400 and got == documents[:len(got)]
  assert stats.lines_skipped == {"the rest of a damaged gzip file": 1}
  assert stats.documents_skipped == {"cut short by a damaged file": 1}
  assert stats.documents_read == len(got) + 1


def test_text_in_another_encoding_is_named(tmp_path):
  path = tmp_path / "greek.txt"
  path.write_bytes("Καλημέρα κόσμε, τι κάνεις σήμερα;\n\n".encode("iso-8859-7") * 50)
  got, stats = _documents_of(path)
  assert got == []
  assert stats.files_skipped == {
      "not UTF-8 text (mostly undecodable bytes; convert it to UTF-8)": 1}


def test_other_archives_are_named_in_the_skip_reason(tmp_path):
  (tmp_path / "a.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 50)
  (tmp_path / "b.zip").write_bytes(b"PK\x03\x04" + b"\x00" * 50)
  stats = corpus.CorpusStats()
  assert corpus.scan_files([str(tmp_path / "a.zst"), str(tmp_path / "b.zip")], stats) == []
  assert stats.files_skipped == {"zstd-compressed (decompress it first)": 1,
                                 "zip archive (extract its files first)": 1}


def test_staging_names_are_unique_per_host_and_process(tmp_path, vocab, monkeypatch):
  host = socket.gethostname()
  names = {files.staging_name(str(tmp_path / "vocab.txt")) for _ in range(3)}
  assert len(names) == 3
  for name in names:
    base = os.path.basename(name)
    assert os.path.dirname(name) == str(tmp_path)
    assert ".tmp" in base and str(os.getpid()) in base and host in base, base
  # Every file the builder and the vocabulary trainer stage carries both.
  staged = []
  for module in (os,):
    for function in ("replace", "rename"):
      original = getattr(module, function)

      def spy(source, target, *args, _original=original, **kwargs):
        staged.append(os.path.basename(os.fspath(source)))
        return _original(source, target, *args, **kwargs)

      monkeypatch.setattr(module, function, spy)
  good = write_corpus(tmp_path / "good.txt", num_documents=10)
  builder.prepare(str(good), str(tmp_path / "out"), WordPieceTokenizer(vocab), num_shards=2,
                  show_progress=False)
  vocabulary.train_wordpiece(lambda: vocabulary.sentences(str(good)),
                             str(tmp_path / "trained.txt"), 200, True)
  assert len(staged) >= 6
  for name in staged:
    assert host in name and str(os.getpid()) in name and ".tmp" in name, name


def test_progress_has_a_total_and_an_eta(tmp_path, vocab, capfd):
  good = write_corpus(tmp_path / "good.txt", num_documents=30)
  builder.prepare(str(good), str(tmp_path / "quiet"), WordPieceTokenizer(vocab),
                  num_shards=2, show_progress=False)
  assert capfd.readouterr().err == ""
  builder.prepare(str(good), str(tmp_path / "out"), WordPieceTokenizer(vocab), num_shards=2,
                  show_progress=True)
  err = capfd.readouterr().err
  size = os.path.getsize(good)
  assert "100%" in err and "<" in err, err  # [elapsed<remaining]
  total = tqdm.format_sizeof(size, divisor=1024)
  assert f"{total}/{total}" in err, err  # the input's bytes, all read
  result = _tool("train_vocab", f"--input={good}", f"--output={tmp_path / 'v.txt'}",
                 "--vocab_size=200")
  assert result.returncode == 0, result.stderr
  assert "100%" in result.stderr, result.stderr


def test_a_binary_start_skips_its_lines_not_the_file(tmp_path):
  """Binary is judged from samples across the file (start, middle, end)."""
  documents = _good_documents(200)
  path = tmp_path / "nul_start.txt"
  path.write_bytes(b"\x00" * 9000 + b"\n\n" + _text(documents).encode())
  got, stats = _documents_of(path)
  assert got == documents
  assert stats.files_read == 1 and not stats.files_skipped
  assert stats.lines_skipped == {"NUL bytes": 1}
  # A file binary in every sample is still skipped whole.
  blob = tmp_path / "blob.bin"
  blob.write_bytes(bytes(range(256)) * 200)
  assert _documents_of(blob)[1].files_skipped == {"binary file (over 5% control characters)": 1}


def test_a_binary_file_with_a_text_end_is_skipped(tmp_path):
  """A binary body whose end is text (a PDF's cross-reference table, a log
  appended to a dump) is binary: most of its samples are. A known binary
  format is named by its signature, text or not after it."""
  rng = np.random.default_rng(0)
  trailer = "".join(f"{i:010d} 00000 n \n" for i in range(2000)).encode()
  body = rng.integers(0, 256, 60_000, dtype=np.uint8).tobytes()
  dump = tmp_path / "dump.bin"
  dump.write_bytes(body + b"\n" + trailer)
  assert _documents_of(dump)[1].files_skipped == {"binary file (over 5% control characters)": 1}
  pdf = tmp_path / "paper.pdf.txt"
  pdf.write_bytes(b"%PDF-1.7\n" + _text(_good_documents(50)).encode())
  got, stats = _documents_of(pdf)
  assert got == [] and stats.files_skipped == {"a PDF document (extract its text first)": 1}


def test_ansi_coloured_text_is_read_without_its_escapes(tmp_path):
  documents = _good_documents(30)
  coloured = [[" ".join(f"\x1b[1;3{i % 8}m{word}\x1b[0m" for i, word in enumerate(s.split()))
               for s in document] for document in documents]
  path = tmp_path / "log.txt"
  path.write_text(_text(coloured))
  got, stats = _documents_of(path)
  assert stats.files_read == 1 and not stats.files_skipped and not stats.lines_skipped
  assert got == documents


def test_latin1_text_is_named(tmp_path):
  documents = [[f"Déjà vu {d}: le café où l'été {s} est là." for s in range(3)]
               for d in range(40)]
  path = tmp_path / "latin.txt"
  path.write_bytes(_text(documents).encode("latin-1"))
  got, stats = _documents_of(path)
  assert got == []
  [reason] = stats.files_skipped
  assert reason.startswith("not UTF-8 (looks like Latin-1/cp1252"), reason
  assert "latin.txt" in stats.summary()
  # A few such lines in a UTF-8 file cost their lines, and the file is named.
  mixed = tmp_path / "mixed.txt"
  mixed.write_bytes(_text(_good_documents(40)).encode() + "un café.\n\n".encode("latin-1"))
  got, stats = _documents_of(mixed)
  assert len(got) == 40 and stats.lines_skipped == {"invalid UTF-8": 1}
  assert "skipped lines: 1 (invalid UTF-8), in " + str(mixed) in stats.summary()


def test_a_small_cut_gzip_file_keeps_what_precedes_the_cut(tmp_path):
  documents = _good_documents(40)
  data = gzip.compress(_text(documents).encode())
  assert len(_text(documents)) < 8192
  path = tmp_path / "cut.txt.gz"
  path.write_bytes(data[:len(data) * 2 // 3])
  got, stats = _documents_of(path)
  assert 0 < len(got) < 40 and got == documents[:len(got)]
  assert stats.files_read == 1 and not stats.files_skipped
  assert stats.lines_skipped == {"the rest of a damaged gzip file": 1}


@pytest.mark.parametrize("mode,name", [("w", "corpus.tar"), ("w:gz", "corpus.tar.gz")])
def test_tar_archives_are_named(tmp_path, mode, name):
  text = tmp_path / "a.txt"
  text.write_text(_text(_good_documents(30)))
  with tarfile.open(tmp_path / name, mode) as archive:
    archive.add(text, "a.txt")
  got, stats = _documents_of(tmp_path / name)
  assert got == []
  assert stats.files_skipped == {"a tar archive (unpack it first)": 1}


def _dataset_on(url):
  """The files (name -> bytes) of the dataset at `url` if it looks complete to a
  reader (its dataset_info.json and every shard's stats), else None."""
  names = set(files.listdir(url)) if files.isdir(url) else set()
  if shards.INFO_FILE not in names:
    return None
  count = json.loads(files.read_bytes(files.join(url, shards.INFO_FILE)))["num_shards"]
  shard_names = [shards.shard_name(i, count) for i in range(count)]
  if not all(shards.stats_path(name) in names for name in shard_names):
    return None
  wanted = [shards.INFO_FILE, "vocab.txt", *shard_names, *map(shards.stats_path, shard_names)]
  return {name: files.read_bytes(files.join(url, name)) for name in wanted if name in names}


def _watch_remote(monkeypatch, remote):
  """Records the dataset a reader of `remote` sees before each upload or removal
  there; returns that list and the number of uploads so far ([count])."""
  seen, uploads = [], [0]
  upload, remove = files.upload, files.remove

  def watched_upload(local, url):
    if url.startswith(remote):
      seen.append(_dataset_on(remote))
      uploads[0] += 1
    return upload(local, url)

  def watched_remove(url):
    if url.startswith(remote):
      seen.append(_dataset_on(remote))
    return remove(url)

  monkeypatch.setattr(files, "upload", watched_upload)
  monkeypatch.setattr(files, "remove", watched_remove)
  return seen, uploads


def _fail_upload(monkeypatch, remote, at):
  """Makes the `at`-th upload to `remote` (from 0) fail."""
  upload, count = files.upload, [0]

  def failing(local, url):
    if url.startswith(remote):
      count[0] += 1
      if count[0] == at + 1:
        raise OSError("injected upload failure")
    return upload(local, url)

  monkeypatch.setattr(files, "upload", failing)


def _dataset_and_another_corpus(tmp_path, vocab, target: str):
  """A dataset of 12 documents in 2 shards built at `target` from a corpus
  (returned), and another corpus of 5 documents to replace it with."""
  good = write_corpus(tmp_path / "good.txt", num_documents=12)
  builder.prepare(str(good), target, WordPieceTokenizer(vocab), num_shards=2,
                  show_progress=False)
  return good, write_corpus(tmp_path / "other.txt", num_documents=5, seed=3)


def test_a_local_swap_failing_part_way_says_what_it_left(tmp_path, vocab, monkeypatch):
  """The same shard count, locally: the old dataset is withdrawn before its
  shards are replaced; a move failing after that says so, and --overwrite
  builds the new one again."""
  out = tmp_path / "out"
  _, other = _dataset_and_another_corpus(tmp_path, vocab, str(out))
  replace = os.replace

  def failing(source, target, *args, **kwargs):
    if (os.path.dirname(os.fspath(target)) == str(out)
        and os.path.basename(os.fspath(target)).startswith("documents-")):
      raise OSError("injected: no space left on device")
    return replace(source, target, *args, **kwargs)

  with monkeypatch.context() as patch:
    patch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match=f"{out}: moving in the new dataset failed part-way "
                                      r"\(OSError: injected: no space left on device\); the "
                                      "old dataset there was withdrawn first, as the new one "
                                      "reuses its file names: rerun with --overwrite"):
      builder.prepare(str(other), str(out), WordPieceTokenizer(vocab), num_shards=2,
                      overwrite=True, show_progress=False)
  assert _dataset_on(str(out)) is None  # nothing there looks finished
  assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]  # no staging left behind
  stats = builder.prepare(str(other), str(out), WordPieceTokenizer(vocab), num_shards=2,
                          overwrite=True, show_progress=False)
  assert stats.documents_used == 5 and _dataset_on(str(out)) is not None


def test_overwrite_on_gcs_always_leaves_a_usable_dataset(tmp_path, vocab, gcs, monkeypatch):
  """Another shard count: the new shards have new names, so the old dataset
  stays whole until the new one's dataset_info.json replaces the old one."""
  remote = gcs.url_of("swap/other_count")
  good, other = _dataset_and_another_corpus(tmp_path, vocab, remote)
  old = _dataset_on(remote)

  def replace():
    return builder.prepare(str(other), remote, WordPieceTokenizer(vocab), num_shards=3,
                           overwrite=True, show_progress=False)

  with monkeypatch.context() as patch:
    seen, uploads = _watch_remote(patch, remote)
    replace()
  new = _dataset_on(remote)
  assert new is not None and new != old
  assert all(state in (old, new) for state in seen), [s and sorted(s) for s in seen]
  assert not [n for n in files.listdir(remote) if "-of-00002" in n]  # the old shards go
  # An upload failing at any point leaves the old dataset whole, and says so.
  builder.prepare(str(good), remote, WordPieceTokenizer(vocab), num_shards=2,
                  overwrite=True, show_progress=False)
  assert _dataset_on(remote) == old
  for at in range(uploads[0]):
    with monkeypatch.context() as patch:
      _fail_upload(patch, remote, at)
      with pytest.raises(OSError, match="the old dataset there is whole") as error:
        replace()
    assert str(remote) in str(error.value) and "--overwrite" in str(error.value)
    assert _dataset_on(remote) == old, at
    assert len(shards.complete_shards(remote)) == 2
  assert replace().documents_used == 5
  assert _dataset_on(remote) == new


def test_overwrite_on_gcs_never_mixes_shards_and_resumes(tmp_path, vocab, gcs, monkeypatch):
  """The same shard count: the new shards overwrite the old ones' names, so the
  old dataset is withdrawn first (never old and new shards under one mark), and
  a failed upload is finished by running the command again."""
  remote = gcs.url_of("swap/same_count")
  good, other = _dataset_and_another_corpus(tmp_path, vocab, remote)
  old = _dataset_on(remote)

  def replace(spec):
    return builder.prepare(str(spec), remote, WordPieceTokenizer(vocab), num_shards=2,
                           overwrite=True, show_progress=False)

  with monkeypatch.context() as patch:
    seen, uploads = _watch_remote(patch, remote)
    replace(other)
  new = _dataset_on(remote)
  assert new is not None and new != old
  assert all(state in (old, None, new) for state in seen), [s and sorted(s) for s in seen]
  for at in range(uploads[0]):
    replace(good)
    assert _dataset_on(remote) == old
    with monkeypatch.context() as patch:
      _fail_upload(patch, remote, at)
      with pytest.raises(OSError, match="upload") as error:
        replace(other)
    assert _dataset_on(remote) in (old, None), at  # never a mix
    if _dataset_on(remote) is None:
      assert "rerun the same command" in str(error.value), error.value
    assert replace(other).documents_used == 5
    assert _dataset_on(remote) == new, at
