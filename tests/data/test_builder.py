"""The builder: shards that hold exactly the tokenised text, and full accounting."""

import json
import os
import subprocess
import sys

import pytest

from bertjax.data import shards
from bertjax.data.tokenizers import WordPieceTokenizer
from bertjax.data import builder, static_instances
from tests import reference
from tests.conftest import write_corpus


@pytest.fixture()
def vocab(tmp_path):
  path = tmp_path / "vocab.txt"
  reference.write_vocab(str(path))
  return str(path)


def _hostile_corpus(directory):
  directory.mkdir()
  (directory / "empty.txt").write_bytes(b"")
  (directory / "binary.txt").write_bytes(b"\x7fELF\x00\x01\x02" * 100)
  (directory / "hostile.txt").write_bytes(
      b"the quick brown fox.\nthe lazy dog.\n\n\n\n\n"             # a document
      b"only one sentence here.\n\n"                              # kept, as the original
      b"zero\xe2\x80\x8bwidth hello.\n\xff\xfe broken\ncontrol\x07 world.\n\n"  # hostile lines
      + b"x" * 200_000 + b"\nhello world.\nthe fox.\n\n"           # a megabyte-ish line
      b"\x00\x01\x02\x03\n\n"                                      # a NUL: its line skipped
      b"\x01\x02\x03\n\n")                                        # tokens vanish: no sentences
  write_corpus(directory / "plain.txt", num_documents=30, seed=1)
  return directory


def _documents(directory):
  data = []
  for path in shards.complete_shards(directory):
    from array_record.python.array_record_module import ArrayRecordReader
    reader = ArrayRecordReader(path)
    for record in reader.read(range(reader.num_records())) if reader.num_records() else []:
      ids, offsets = shards.decode_document(record)
      data.append([ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)])
  return data


def test_hostile_corpus_is_fully_accounted(tmp_path, vocab):
  inputs = _hostile_corpus(tmp_path / "in")
  tokenizer = WordPieceTokenizer(vocab)
  stats = builder.prepare(f"{inputs}/*.txt", str(tmp_path / "out"), tokenizer,
                                           num_shards=3, show_progress=False)
  assert stats.files_read == 2
  assert stats.files_skipped == {"empty file": 1, "an executable (ELF)": 1}
  assert sorted(stats.skipped_file_names) == [
      ["an executable (ELF)", str(inputs / "binary.txt")],
      ["empty file", str(inputs / "empty.txt")]]
  assert stats.documents_read == stats.documents_used + sum(stats.documents_skipped.values())
  assert stats.documents_skipped == {"no readable lines": 1, "no sentences": 1}
  assert stats.lines_skipped == {"invalid UTF-8": 1, "over 100000 characters": 1,
                                 "NUL bytes": 1, "sentence without tokens": 1}
  assert stats.documents_used == 30 + 4

  # The shards hold exactly the tokenised sentences.
  documents = _documents(str(tmp_path / "out"))
  assert len(documents) == stats.documents_used
  assert sum(len(s) for d in documents for s in d) == stats.tokens
  expected = [tokenizer.encode_pieces(["the quick brown fox.", "the lazy dog."]),
              tokenizer.encode_pieces(["zero\u200bwidth hello.", "control\x07 world."]),
              tokenizer.encode_pieces(["hello world.", "the fox."]),
              tokenizer.encode_pieces(["only one sentence here."])]
  for document in expected:
    assert document in documents
  assert shards.read_stats(str(tmp_path / "out")).to_dict() == {
      **stats.to_dict(), "files_read": 0, "files_skipped": {}, "skipped_file_names": []}
  # min_sentences=2 leaves out the one-sentence document, and says so.
  two = builder.prepare(f"{inputs}/*.txt", str(tmp_path / "out2"), tokenizer, num_shards=3,
                        min_sentences=2, show_progress=False)
  assert two.documents_skipped == {"no readable lines": 1, "no sentences": 1,
                                   "fewer than 2 sentences": 1}


def test_missing_input_fails_before_any_work(tmp_path, vocab):
  tokenizer = WordPieceTokenizer(vocab)
  with pytest.raises(FileNotFoundError, match="glob matches no files"):
    builder.prepare(str(tmp_path / "none*.txt"), str(tmp_path / "out"),
                                     tokenizer, show_progress=False)
  assert not os.path.exists(tmp_path / "out")


def test_resume_and_refusing_another_dataset(tmp_path, vocab):
  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=40)
  tokenizer = WordPieceTokenizer(vocab)
  out = tmp_path / "out"
  first = builder.prepare(str(corpus_path), str(out), tokenizer, num_shards=4,
                                           show_progress=False)
  # An interrupted run: one shard lost its completion mark.
  victim = out / shards.shard_name(2, 4)
  os.remove(str(victim)[:-len(".array_record")] + ".stats.json")
  with pytest.raises(ValueError, match="1 of 4 shards are missing or unfinished"):
    shards.complete_shards(str(out))
  before = {p: os.path.getmtime(out / p) for p in os.listdir(out) if p.endswith(".array_record")}
  again = builder.prepare(str(corpus_path), str(out), tokenizer, num_shards=4,
                                           show_progress=False)
  assert again.to_dict() == first.to_dict()
  after = {p: os.path.getmtime(out / p) for p in before}
  assert [p for p in before if before[p] != after[p]] == [victim.name]
  # Settings an earlier bertjax saved (`special_tokens_in_text: false`, its
  # default then) describe this dataset: a rerun finishes it, saving them anew.
  info_path = out / shards.INFO_FILE
  info = json.loads(info_path.read_text())
  del info["tokenizer"]["split_special_tokens"]
  info["tokenizer"]["special_tokens_in_text"] = False
  info_path.write_text(json.dumps(info))
  os.remove(str(victim)[:-len(".array_record")] + ".stats.json")
  assert builder.prepare(str(corpus_path), str(out), tokenizer, num_shards=4,
                         show_progress=False).to_dict() == first.to_dict()
  assert json.loads(info_path.read_text())["tokenizer"]["split_special_tokens"] is False
  saved_vocab = (out / "vocab.txt").read_bytes()
  with pytest.raises(ValueError, match=r"holds a dataset built from other settings "
                                       r"\(tokenizer.do_lower_case: true then, false now\); "
                                       "pass --overwrite"):
    builder.prepare(str(corpus_path), str(out), WordPieceTokenizer(vocab, do_lower_case=False),
                    num_shards=4, show_progress=False)
  # A vocabulary of the same size but other tokens is another dataset too, and
  # the refusal leaves the directory's own vocabulary in place.
  tokens = (tmp_path / "vocab.txt").read_text().split("\n")[:-1]
  swapped = tmp_path / "swapped" / "vocab.txt"
  swapped.parent.mkdir()
  swapped.write_text("\n".join(tokens[:-2] + [tokens[-1], tokens[-2]]) + "\n")
  with pytest.raises(ValueError, match=r"built from other settings \(another vocabulary"):
    builder.prepare(str(corpus_path), str(out), WordPieceTokenizer(str(swapped)), num_shards=4,
                    show_progress=False)
  assert (out / "vocab.txt").read_bytes() == saved_vocab
  with pytest.raises(ValueError, match="overwrite with several hosts would race"):
    builder.prepare(str(corpus_path), str(out), WordPieceTokenizer(str(swapped)), num_shards=4,
                    num_hosts=2, overwrite=True, show_progress=False)
  replaced = builder.prepare(str(corpus_path), str(out), WordPieceTokenizer(str(swapped)),
                             num_shards=4, overwrite=True, show_progress=False)
  assert replaced.documents_used == 40
  assert (out / "vocab.txt").read_bytes() == swapped.read_bytes()


def test_overwrite_replaces_the_dataset_and_nothing_else(tmp_path, vocab):
  """Built beside the old dataset, then moved in: no staging directory stays,
  files that are not the builder's stay."""
  out = tmp_path / "out"
  first = write_corpus(tmp_path / "a.txt", num_documents=10, seed=1)
  second = write_corpus(tmp_path / "b.txt", num_documents=7, seed=2)
  builder.prepare(str(first), str(out), WordPieceTokenizer(vocab), num_shards=3,
                  show_progress=False)
  (out / "notes.txt").write_text("mine")  # not the builder's: left alone
  stats = builder.prepare(str(second), str(out), WordPieceTokenizer(vocab), num_shards=2,
                          overwrite=True, show_progress=False)
  assert stats.documents_used == 7
  assert len(shards.complete_shards(str(out))) == 2
  assert shards.read_info(str(out))["input"] == str(second)
  assert sorted(os.listdir(out)) == sorted(
      ["dataset_info.json", "vocab.txt", "notes.txt"]
      + [shards.shard_name(i, 2) for i in range(2)]
      + [shards.stats_path(shards.shard_name(i, 2)) for i in range(2)])
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".out")]


def test_hosts_split_the_shards(tmp_path, vocab):
  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=60)
  tokenizer = WordPieceTokenizer(vocab)
  out = tmp_path / "out"
  parts = [builder.prepare(str(corpus_path), str(out), tokenizer, num_shards=5,
                                            num_hosts=2, host_index=h, show_progress=False)
           for h in (0, 1)]
  assert parts[0].documents_used + parts[1].documents_used == 60
  single = builder.prepare(str(corpus_path), str(tmp_path / "one"), tokenizer,
                                            num_shards=5, show_progress=False)
  assert _documents(str(out)) == _documents(str(tmp_path / "one"))
  assert single.documents_used == 60


def test_command_line_with_workers(tmp_path, vocab):
  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=50)
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.prepare_pretraining_data", f"--input={corpus_path}",
       f"--vocab={vocab}", f"--output_dir={tmp_path / 'out'}", "--num_shards=4",
       "--num_workers=2"], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "documents:  50 read = 50 used + 0 skipped" in result.stdout
  assert "tokens/s" in result.stdout
  assert len(_documents(str(tmp_path / "out"))) == 50
  bad = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.prepare_pretraining_data",
       f"--input={tmp_path}/missing/*.txt", f"--vocab={vocab}",
       f"--output_dir={tmp_path / 'bad'}"], capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and "glob matches no files" in bad.stderr
  assert "Traceback" not in bad.stderr


def test_demo_corpus(tmp_path, vocab):
  stats = builder.prepare("demo:stdlib", str(tmp_path / "demo"),
                                           WordPieceTokenizer(vocab), num_shards=2,
                                           show_progress=False)
  assert stats.documents_used > 300 and stats.tokens > 200_000
  assert stats.documents_read == stats.documents_used + sum(stats.documents_skipped.values())


def test_tfds_source(tmp_path, vocab):
  tfds = pytest.importorskip("tensorflow_datasets")

  class TinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text(), "title": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(12):
        text = f"The fox number {i} jumped. The dog slept!\nA new paragraph here."
        yield i, {"text": text, "title": f"doc {i}"}

  TinyText(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
  stats = builder.prepare(
      "tfds:tiny_text", str(tmp_path / "out"), WordPieceTokenizer(vocab), num_shards=3,
      tfds_data_dir=str(tmp_path / "tfds"), show_progress=False)
  assert stats.documents_read == 12 and stats.documents_used == 12 and stats.sentences == 36


def test_nothing_usable_is_an_error(tmp_path, vocab):
  (tmp_path / "one.txt").write_text("just one sentence.\n\nand another lonely one.\n")
  with pytest.raises(ValueError, match="no usable document"):
    builder.prepare(str(tmp_path / "one.txt"), str(tmp_path / "out"), WordPieceTokenizer(vocab),
                    num_shards=1, min_sentences=2, show_progress=False)
  (tmp_path / "none.txt").write_bytes(b"\x01\x02\n\n\x03\n")  # no tokens at all
  with pytest.raises(ValueError, match="no usable document"):
    builder.prepare(str(tmp_path / "none.txt"), str(tmp_path / "out3"),
                    WordPieceTokenizer(vocab), num_shards=1, show_progress=False)
  with pytest.raises(ValueError, match="min_sentences must be >= 1"):
    builder.prepare(str(tmp_path / "one.txt"), str(tmp_path / "out2"),
                    WordPieceTokenizer(vocab), min_sentences=0, show_progress=False)


def test_static_instances_resume_and_tolerate_more_shards_than_documents(tmp_path, vocab):
  from bertjax.data.masking import MaskingConfig

  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=3)
  out = tmp_path / "out"
  builder.prepare(str(corpus_path), str(out), WordPieceTokenizer(vocab), num_shards=5,
                  show_progress=False)
  settings = dict(objective="mlm_nsp", max_seq_length=64, masking=MaskingConfig(),
                  dupe_factor=2, show_progress=False)
  first = static_instances.prepare_static(str(out), **settings)
  written = {p: os.path.getmtime(out / p) for p in os.listdir(out)
             if p.startswith("instances64-")}
  assert first > 0 and len(written) == 10  # 5 shards and their marks, two of them empty
  assert (out / "instances64_info.json").exists()
  again = static_instances.prepare_static(str(out), **settings)
  assert again == first
  assert {p: os.path.getmtime(out / p) for p in written} == written  # nothing rebuilt
  # The other phase's length lives beside it; neither replaces the other.
  longer = static_instances.prepare_static(str(out), **{**settings, "max_seq_length": 128})
  assert longer > 0 and (out / "instances128_info.json").exists()
  assert {p: os.path.getmtime(out / p) for p in written} == written


def test_static_instances_on_gcs_are_the_local_ones_and_replaced_whole(tmp_path, vocab, gcs):
  """Built from a local copy of gs:// documents, uploaded shard by shard; new
  settings replace the bucket's old instances before any new one lands."""
  from bertjax import files
  from bertjax.data.masking import MaskingConfig

  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=6)
  local, remote = str(tmp_path / "out"), gcs.url_of("static/out")
  for out in (local, remote):
    builder.prepare(str(corpus_path), out, WordPieceTokenizer(vocab), num_shards=2,
                    show_progress=False)
  settings = dict(objective="mlm_nsp", max_seq_length=64, masking=MaskingConfig(),
                  show_progress=False)
  static_instances.prepare_static(remote, dupe_factor=1, **settings)
  count = static_instances.prepare_static(remote, dupe_factor=2, **settings)  # new settings
  assert count == static_instances.prepare_static(local, dupe_factor=2, **settings)
  assert files.read_json(files.join(remote, shards.static_info_file(64)))["dupe_factor"] == 2
  for name in sorted(n for n in os.listdir(local) if n.startswith("instances64-")):
    assert files.read_bytes(files.join(remote, name)) == open(os.path.join(local, name),
                                                              "rb").read(), name


def test_a_build_to_gcs_leaves_no_copy_on_this_host_and_resumes_from_the_bucket(
    tmp_path, vocab, gcs):
  """The command, as a user runs it: each shard is built here, uploaded, checked
  and removed here, the rest once everything is up; static instances too. A
  rerun builds only what the bucket lacks, or holds at another size."""
  from bertjax import files

  corpus = write_corpus(tmp_path / "corpus.txt", num_documents=400, seed=5)
  remote = gcs.url_of("no_copy/data")
  args = [sys.executable, "-m", "bertjax.tools.prepare_pretraining_data", f"--input={corpus}",
          f"--vocab={vocab}", f"--output_dir={remote}", "--num_shards=4", "--num_workers=2"]
  static = ["--static_dupe_factor=1", "--max_seq_length=32", "--max_predictions=5"]
  cache = files.cache_path(remote)

  def run(*more):
    result = subprocess.run(args + list(more), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not os.path.exists(cache), os.listdir(cache)  # nothing left here
    return result

  run(*static)
  names = files.listdir(remote)
  assert len(shards.complete_shards(remote)) == 4
  assert len(shards.complete_shards(remote, shards.static_kind(32))) == 4
  local = tmp_path / "local"
  builder.prepare(str(corpus), str(local), WordPieceTokenizer(vocab), num_shards=4,
                  show_progress=False)
  for name in sorted(n for n in os.listdir(local) if n.startswith("documents-")):
    assert files.read_bytes(files.join(remote, name)) == (local / name).read_bytes(), name

  # A shard missing from the bucket, and one cut short there: only those are built again.
  missing, cut = (shards.shard_name(i, 4) for i in (1, 2))
  for name in (missing, shards.stats_path(missing)):
    files.remove(files.join(remote, name))
  files.write_bytes(files.join(remote, cut), (local / cut).read_bytes()[:-100])
  again = run()
  assert "Building 2 of this host's 4 shards" in again.stderr, again.stderr[-3000:]
  assert f"{files.join(remote, cut)} is damaged" in again.stderr
  assert files.listdir(remote) == names
  for name in (missing, cut):
    assert files.read_bytes(files.join(remote, name)) == (local / name).read_bytes(), name
  assert "Building 0 of this host's 4 shards" in run().stderr


def test_a_build_to_gcs_followed_by_static_instances_downloads_no_shard_back(
    tmp_path, vocab, gcs, monkeypatch):
  """The builder keeps its copy for the static build that follows, which reads
  it as is (nothing downloaded) and removes it when done."""
  from bertjax import files
  from bertjax.data.masking import MaskingConfig

  corpus = write_corpus(tmp_path / "corpus.txt", num_documents=60, seed=3)
  remote = gcs.url_of("static_after/data")
  builder.prepare(str(corpus), remote, WordPieceTokenizer(vocab), num_shards=2,
                  show_progress=False, keep_local_copy=True)
  cache = files.cache_path(remote)
  assert shards.complete_shards(cache) and shards.complete_shards(remote)
  downloaded, download = [], files.download
  monkeypatch.setattr(files, "download", lambda remote_path, *args: (
      downloaded.append(os.path.basename(remote_path)), download(remote_path, *args))[1])
  assert static_instances.prepare_static(remote, objective="mlm_nsp", max_seq_length=32,
                                         masking=MaskingConfig(max_predictions=5),
                                         dupe_factor=1, show_progress=False) > 0
  assert not [name for name in downloaded if name.endswith(".array_record")], downloaded
  assert not os.path.exists(cache)


@pytest.mark.parametrize("arrived", ["cut short", "other bytes"])
def test_a_shard_that_did_not_arrive_whole_is_kept_here(tmp_path, gcs, monkeypatch, arrived):
  """The only copy of a shard is deleted only once the bucket holds it at its
  size and checksum; nothing marks it finished there before."""
  from bertjax import errors, files

  shard = tmp_path / shards.shard_name(0, 1)
  shard.write_bytes(bytes(range(256)) * 8)
  shards.mark_finished(str(shard), {})
  remote = gcs.url_of(f"arrived/{arrived.replace(' ', '_')}")
  upload = files.upload

  def garbled(local, target):
    upload(local, target)
    if target.endswith(".array_record"):
      data = open(local, "rb").read()
      files.write_bytes(target, data[:-10] if arrived == "cut short" else data[::-1])

  monkeypatch.setattr(files, "upload", garbled)
  with pytest.raises(errors.StorageError, match="bytes arrived" if arrived == "cut short"
                     else "its checksum is not that of"):
    shards.publish(str(shard), remote)
  assert shard.read_bytes() == bytes(range(256)) * 8
  assert not files.exists(files.join(remote, os.path.basename(shards.stats_path(str(shard)))))
  monkeypatch.undo()
  shards.publish(str(shard), remote)
  assert not shard.exists()


def test_a_cache_shared_by_hosts_loses_only_this_hosts_files(tmp_path, gcs):
  """Hosts sharing one cache directory (an NFS home): one host done removes its
  shards, not the others' staging files and shards, nor the settings they
  read; the last one removes the rest and the directory."""
  from bertjax import files

  remote, local = gcs.url_of("shared_cache/data"), tmp_path / "cache"
  local.mkdir()
  ours = [shards.shard_name(0, 2), shards.stats_path(shards.shard_name(0, 2))]
  for name in ours + [shards.INFO_FILE]:
    (local / name).write_text(name)
    files.upload(str(local / name), files.join(remote, name))
  theirs = files.staging_name(str(local / shards.shard_name(1, 2)))
  open(theirs, "w").close()
  host = lambda name, index: shards.shard_host(name, "documents", 2) == index
  assert shards.remove_local_copy(str(local), remote, others=lambda n: host(n, 1),
                                  own=lambda n: host(n, 0)) == ""
  assert sorted(os.listdir(local)) == sorted([shards.INFO_FILE, os.path.basename(theirs)])
  os.remove(theirs)
  assert shards.remove_local_copy(str(local), remote, others=lambda n: host(n, 1),
                                  own=lambda n: host(n, 0)) == ""
  assert not local.exists()


def _modernbert_layout_tokenizer(path, texts):
  """A byte-level BPE laid out as ModernBERT's tokenizer.json is: its learned
  pieces first, then [UNK] [CLS] [SEP] [PAD] [MASK], then unused tokens to a
  multiple of 64 ids."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  backend = tokenizers.Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False))
  learned = backend.get_vocab_size()
  backend.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
  size = -(-(learned + 5) // 64) * 64
  backend.add_tokens([f"[unused{i}]" for i in range(size - learned - 5)])
  backend.save(str(path))
  return learned, size


def test_a_tokenizer_json_builds_each_document_as_its_running_text(tmp_path):
  """With a `tokenizer.json` (ModernBERT's kind and layout), a document's
  sentences hold the pieces `tokenizers` itself gives the document's text, its
  sentences joined by a space: a sentence after another is encoded after a
  space ("Ġword"), as in running text. Hard strings included; the special
  tokens keep their ids at the end of the vocabulary."""
  import tokenizers

  from bertjax.data.tokenizers import tokenizer_from_vocab_file
  from tests.data.test_vocabulary import HARD_TEXT

  documents = [HARD_TEXT[i:] + HARD_TEXT[:i] for i in range(len(HARD_TEXT))]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
  path = tmp_path / "tokenizer.json"
  learned, size = _modernbert_layout_tokenizer(path, HARD_TEXT * 20)
  tokenizer = tokenizer_from_vocab_file(str(path))
  assert (tokenizer.unk_id, tokenizer.mask_id, tokenizer.vocab_size) == (
      learned, learned + 4, size)
  builder.prepare(str(corpus), str(tmp_path / "out"), tokenizer, num_shards=1,
                  num_workers=1, show_progress=False)
  backend = tokenizers.Tokenizer.from_file(str(path))
  expected = sorted(backend.encode(" ".join(d), add_special_tokens=False).ids
                    for d in documents)
  built = _documents(tmp_path / "out")
  assert sorted(sum(d, []) for d in built) == expected
  assert all(len(d) == len(HARD_TEXT) for d in built)  # the sentences kept apart
  # The running text's pieces differ from sentence-by-sentence pieces.
  alone = [backend.encode(s, add_special_tokens=False).ids for s in documents[0]]
  assert sum(alone, []) != backend.encode(" ".join(documents[0]),
                                          add_special_tokens=False).ids
