"""Reading raw corpora: byte-range splits, formats, and hostile input."""

import random

import pytest

from bertjax.data import corpus


def _write_documents(path, documents, rng, crlf=False):
  text = "\n\n" if rng.random() < 0.5 else ""
  for sentences in documents:
    text += "\n".join(sentences) + "\n" + "\n" * rng.randint(1, 3)
    if rng.random() < 0.2:
      text += "   \t\n"  # a whitespace-only line is a blank line
  data = text.replace("\n", "\r\n") if crlf else text
  path.write_bytes(data.encode("utf-8"))
  return len(data.encode("utf-8"))


def _read_all(path, size, parts, file_format):
  stats = corpus.CorpusStats()
  documents = []
  for part in corpus.plan_ranges([(str(path), size)], parts):
    for file_range in part:
      documents += list(corpus.read_range(file_range, file_format, stats))
  return documents, stats


@pytest.mark.parametrize("crlf", [False, True])
def test_any_split_reads_every_document_once(tmp_path, crlf):
  rng = random.Random(0)
  words = ["alpha", "beta", "gamma", "delta", "épsilon", "東京"]
  for trial in range(20):
    documents = [[" ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
                  for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 30))]
    path = tmp_path / f"corpus{trial}.txt"
    size = _write_documents(path, documents, rng, crlf)
    for parts in (1, 2, 3, 7, 64, size):
      got, stats = _read_all(path, size, parts, "sentences")
      assert got == documents, (trial, parts)
      assert stats.documents_read == len(documents)


def test_one_document_per_line_with_splits(tmp_path):
  lines = [f"Document {i} starts here. It has a second sentence! And a third?"
           for i in range(50)]
  path = tmp_path / "docs.txt"
  path.write_text("\n".join(lines[:25]) + "\n\n\n" + "\n".join(lines[25:]) + "\n")
  size = path.stat().st_size
  for parts in (1, 4, 33, size):
    got, stats = _read_all(path, size, parts, "documents")
    assert len(got) == 50 and stats.documents_read == 50
    assert got[7] == ["Document 7 starts here.", "It has a second sentence!", "And a third?"]


def test_plan_ranges_covers_every_byte_once():
  files = [("a", 10), ("b", 0), ("c", 37), ("d", 5)]
  sizes = dict(files)
  for parts in (1, 3, 8, 60):
    plan = corpus.plan_ranges([f for f in files if f[1]], parts)
    assert len(plan) == parts
    covered = {(r.path, b) for part in plan for r in part for b in range(r.start, r.end)}
    assert all(r.size == sizes[r.path] for part in plan for r in part)
    assert covered == {(p, b) for p, size in files for b in range(size)}
  # A compressed file, or one in UTF-16, is read whole, by the part where it starts.
  plan = corpus.plan_ranges([corpus.InputFile("a", 10), corpus.InputFile("z", 30, "gzip"),
                             corpus.InputFile("w", 20, "", "utf-16"), ("c", 5)], 4)
  assert [[(r.path, r.start, r.end) for r in part] for part in plan] == [
      [("a", 0, 10), ("z", 0, 30)], [], [("w", 0, 20)], [("c", 0, 5)]]


def test_hostile_lines_are_counted(tmp_path):
  path = tmp_path / "bad.txt"
  path.write_bytes(
      b"good first line\n\xff\xfe broken utf-8\nzero\xe2\x80\x8bwidth and \x07 bell\n\n\n\n\n"
      + b"x" * 300_000 + b"\nafter the long line\n\n"
      + b"\xc3\x28\n\n"  # a document whose only line is invalid
      + b"last\n")
  size = path.stat().st_size
  documents, stats = _read_all(path, size, 1, "sentences")
  assert documents == [["good first line", "zero\u200bwidth and \x07 bell"],
                       ["after the long line"], ["last"]]
  assert stats.lines_skipped == {"invalid UTF-8": 2, "over 100000 characters": 1}
  assert stats.documents_read == 4
  assert stats.documents_skipped == {"no readable lines": 1}


def test_inputs_are_checked_before_any_work(tmp_path):
  with pytest.raises(FileNotFoundError, match="nothing.txt: no such file"):
    corpus.expand_inputs(str(tmp_path / "nothing.txt"))
  with pytest.raises(FileNotFoundError, match=r"\*.txt: glob matches no files"):
    corpus.expand_inputs(str(tmp_path / "*.txt"))
  (tmp_path / "a.txt").write_text("x\n")
  (tmp_path / "b.txt").write_text("")
  (tmp_path / "c.bin").write_bytes(b"\x00\x01\x02binary")
  paths = corpus.expand_inputs(f"{tmp_path}/*.txt,{tmp_path / 'c.bin'}")
  stats = corpus.CorpusStats()
  usable = corpus.scan_files(paths, stats)
  assert [file.path for file in usable] == [str(tmp_path / "a.txt")]
  assert stats.files_read == 1
  assert stats.files_skipped == {"empty file": 1,
                                 "binary file (over 5% control characters)": 1}


def test_stats_round_trip_and_merge():
  a = corpus.CorpusStats(files_read=1, documents_read=3, documents_used=2, tokens=10)
  a.documents_skipped["fewer than 2 sentences"] += 1
  b = corpus.CorpusStats.from_dict(a.to_dict())
  assert b == a
  b.merge(a)
  assert b.documents_read == 6 and b.documents_skipped["fewer than 2 sentences"] == 2
  assert "documents:  6 read = 4 used + 2 skipped" in b.summary()


def test_more_hostile_files(tmp_path):
  # Old Mac line endings: one giant "line"; skipped and counted, not read as one sentence.
  (tmp_path / "mac.txt").write_bytes(b"one.\rtwo.\r\rthree.\r")
  stats = corpus.CorpusStats()
  assert corpus.scan_files([str(tmp_path / "mac.txt")], stats) == []
  assert list(stats.files_skipped) == ["CR-only line endings (convert them to \\n)"]
  # A directory is named as such.
  (tmp_path / "sub").mkdir()
  with pytest.raises(IsADirectoryError, match="sub is a directory; name its files with a glob"):
    corpus.expand_inputs(str(tmp_path / "sub"))
  # Unicode whitespace lines separate documents, like blank ones.
  path = tmp_path / "nbsp.txt"
  path.write_text("a b.\nc d.\n\u00a0\u3000\ne f.\ng h.\n", encoding="utf-8")
  size = path.stat().st_size
  for parts in (1, 3, size):
    documents, _ = _read_all(path, size, parts, "sentences")
    assert documents == [["a b.", "c d."], ["e f.", "g h."]], parts
  # A file that changes after planning is an error, not a silent loss.
  plan = corpus.plan_ranges([(str(path), size)], 1)
  path.write_text(path.read_text() + "\nmore.\n")
  with pytest.raises(ValueError, match="nbsp.txt changed while being read"):
    list(corpus.read_range(plan[0][0], "sentences", corpus.CorpusStats()))
