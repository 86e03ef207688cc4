"""Prepared shards read on gs:// in place (bertjax.data.streaming), against a
real GCS API server (fake-gcs-server, tests/gcs.py).

The records are array_record's own, file by file and record by record; the
loader's batches and iterator states are those of a local read, bit for bit,
whatever it reads ahead; its first batch needs a small part of the dataset and
nothing lands in the cache; and a pre-training run restarted on gs:// data
with an empty cache (a new container) reaches its first step without copying
the dataset, with the local run's losses.
"""

import concurrent.futures
import json
import os
import shutil

import numpy as np
import pytest

from bertjax import errors, files
from bertjax.data import builder, loader, shards, static_instances, streaming
from bertjax.data.masking import MaskingConfig
from bertjax.data.tokenizers import WordPieceTokenizer
from tests import reference
from tests.conftest import write_corpus
from tests.data.test_loader import _assert_same, _take


def _upload_directory(local, remote):
  for name in sorted(os.listdir(local)):
    if not name.startswith("."):
      files.upload(os.path.join(local, name), files.join(remote, name))


def _shards_in(directory):
  return sorted(name for _, _, names in os.walk(directory) for name in names
                if name.endswith(".array_record"))


@pytest.fixture(scope="module")
def larger(tmp_path_factory, gcs):
  """(local, gs://) copies of 1,500 documents in 4 shards, each shard several
  times the first batches' reads."""
  root = tmp_path_factory.mktemp("larger")
  vocab = str(root / "vocab.txt")
  reference.write_vocab(vocab)
  corpus = write_corpus(root / "corpus.txt", num_documents=1500, seed=4)
  local = str(root / "data")
  builder.prepare(str(corpus), local, WordPieceTokenizer(vocab), num_shards=4,
                  show_progress=False)
  remote = gcs.url_of("streaming/larger")
  _upload_directory(local, remote)
  return local, remote


@pytest.mark.parametrize("shape", [
    dict(count=0, longest=1), dict(count=1, longest=10), dict(count=3000, longest=3000),
    dict(count=12, longest=300_000),  # records over several 64 KiB blocks
    dict(count=20_000, longest=20),  # a footer over the first read's guess
    dict(count=100, longest=3000, options="group_size:7"),
    dict(count=100, longest=3000, options="group_size:1,uncompressed"),
])
def test_records_are_array_records_own(tmp_path, gcs, shape):
  """Every record of a file read by ranged reads equals array_record's reader's."""
  from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

  rng = np.random.default_rng(shape["count"])
  path = str(tmp_path / "shard.array_record")
  writer = ArrayRecordWriter(path, shape.get("options", "group_size:1"))
  for _ in range(shape["count"]):
    writer.write(rng.integers(0, 60, rng.integers(0, shape["longest"])).astype(np.uint8)
                 .tobytes())
  writer.close()
  url = gcs.url_of(f"streaming/shapes/{shape['count']}-{shape.get('options', '')}/s")
  files.upload(path, url)
  entry = streaming.listing(os.path.dirname(url))["s"]
  index = streaming.read_index(url, entry["size"], entry["generation"])
  reader = ArrayRecordReader(path)
  assert index.num_records == reader.num_records() == shape["count"]
  expected = reader.read_all() if shape["count"] else []
  assert [index.read(i) for i in range(shape["count"])] == expected


def test_loader_batches_and_states_equal_a_local_read(larger):
  """Dynamic masking (pairs with random B segments, and packed rows): the
  batches of a streamed directory are a local one's, read ahead or not, and
  an iterator state saved by either resumes the other exactly."""
  local, remote = larger
  for settings in (dict(objective="mlm_nsp"),
                   dict(objective="mlm", max_sequences_per_row=3)):
    kw = dict(batch_size=8, max_seq_length=64, shuffle_window=50, seed=5,
              masking=MaskingConfig(max_predictions=10), **settings)
    iterator = iter(loader.make_dataset(loader.LoaderConfig(local, **kw), 1, 2))
    expected = _take(iterator, 6)
    state = iterator.get_state()
    expected += _take(iterator, 4)
    for ahead in (0, 64):
      streamed = iter(loader.make_dataset(loader.LoaderConfig(remote, read_ahead=ahead, **kw),
                                          1, 2))
      _assert_same(_take(streamed, 10), expected)
      resumed = iter(loader.make_dataset(loader.LoaderConfig(remote, read_ahead=ahead, **kw),
                                         1, 2))
      resumed.set_state(state)  # a local read's state
      _assert_same(_take(resumed, 4), expected[6:])


def test_the_first_batches_read_a_small_part_and_copy_nothing(larger):
  local, remote = larger
  size = sum(os.path.getsize(os.path.join(local, n)) for n in _shards_in(local))
  before = streaming.fetched()
  config = loader.LoaderConfig(remote, batch_size=8, max_seq_length=64, shuffle_window=1,
                               read_ahead=8, masking=MaskingConfig(max_predictions=10))
  _take(iter(loader.make_dataset(config)), 2)
  read = streaming.fetched()["bytes"] - before["bytes"]
  assert 0 < read < size / 4, (read, size)
  assert _shards_in(files.cache_path(remote)) == []


def test_static_instances_stream_too(tmp_path, larger, gcs):
  """Statically masked instances on gs://: a rerun of the build finds them
  finished there and copies nothing; they are read in place, as locally."""
  local, remote = larger
  settings = dict(objective="mlm_nsp", max_seq_length=64, masking=MaskingConfig(
      max_predictions=10), dupe_factor=1, show_progress=False)
  static_local, static_remote = str(tmp_path / "static"), gcs.url_of("streaming/static")
  shutil.copytree(local, static_local)
  _upload_directory(local, static_remote)
  count = static_instances.prepare_static(static_local, **settings)
  assert static_instances.prepare_static(static_remote, **settings) == count
  assert not os.path.exists(files.cache_path(static_remote))  # the build's copy: removed
  assert static_instances.prepare_static(static_remote, **settings) == count  # finished there
  assert not os.path.exists(files.cache_path(static_remote))
  kw = dict(static=True, batch_size=8, max_seq_length=64, seed=1,
            masking=MaskingConfig(max_predictions=10))
  _assert_same(_take(iter(loader.make_dataset(loader.LoaderConfig(static_remote, **kw))), 5),
               _take(iter(loader.make_dataset(loader.LoaderConfig(static_local, **kw))), 5))
  assert _shards_in(files.cache_path(static_remote)) == []  # (the vocabulary is there)


def test_read_modes(larger):
  """"stream" reads the URL, "copy" this host's copy, "auto" the copy only
  when a complete one is there already."""
  local, remote = larger
  cache = files.cache_path(remote)
  shutil.rmtree(cache, ignore_errors=True)
  assert shards.reading_directory(local, "copy") == local  # a local directory: in place
  assert shards.reading_directory(remote, "stream") == remote
  assert shards.reading_directory(remote, "auto") == remote
  assert _shards_in(cache) == []
  assert shards.reading_directory(remote, "copy") == cache
  assert _shards_in(cache) == _shards_in(local)
  assert shards.reading_directory(remote, "auto") == cache
  os.remove(os.path.join(cache, _shards_in(cache)[0]))  # no longer complete
  assert shards.reading_directory(remote, "auto") == remote
  with pytest.raises(errors.UsageError, match="data.read_mode must be one of"):
    shards.reading_directory(remote, "fuse")
  shutil.rmtree(cache)


def test_a_damaged_or_replaced_shard_is_named(tmp_path, larger, gcs):
  local, _ = larger
  remote = gcs.url_of("streaming/damaged")
  _upload_directory(local, remote)
  name = _shards_in(local)[1]
  whole = open(os.path.join(local, name), "rb").read()
  files.write_bytes(files.join(remote, name), whole[:-1000])  # cut short
  with pytest.raises(errors.CorruptFileError, match=f"{name} is damaged: it cannot be opened"):
    loader.DocumentSource(remote)
  files.write_bytes(files.join(remote, name), whole)
  source = loader.DocumentSource(remote)
  assert len(source) == len(loader.DocumentSource(local))
  # Replaced after it was indexed: read by the old offsets, it would be other bytes.
  files.write_bytes(files.join(remote, name), whole[:100] + b"\0" + whole[101:])
  first = source._records.paths.index(files.join(remote, name))
  index = int(source._records._starts[first])
  with pytest.raises(errors.CorruptFileError, match="was replaced while this run read it"):
    source[index]


def test_storage_that_stops_answering_mid_read_is_waited_for(larger, gcs, monkeypatch,
                                                             absl_caplog):
  """The server down for longer than gcsfs retries (about 30 s): the readers
  wait for it (bertjax.outage), one of them saying so, and read on."""
  import threading

  from bertjax import outage

  local, remote = larger
  source, expected = loader.DocumentSource(remote), loader.DocumentSource(local)
  monkeypatch.setattr(outage, "FIRST_PAUSE_S", 0.5)
  gcs.stop()
  restart = threading.Timer(45.0, gcs.start)
  restart.start()
  try:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      read = list(pool.map(source.__getitem__, range(100, 104)))
  finally:
    restart.join()
  as_lists = lambda document: [sentence.tolist() for sentence in document]  # noqa: E731
  assert list(map(as_lists, read)) == [as_lists(expected[i]) for i in range(100, 104)]
  waits = {r.created for r in absl_caplog.records if "does not answer" in r.getMessage()}
  assert len(waits) == 1  # one reader waits for all (each record is captured twice here)
  assert "answers again after" in absl_caplog.text


def test_a_restart_reaches_its_first_step_without_copying_the_data(
    tmp_path, prepared_dir, gcs):
  """A run's checkpoint resumed on another host (an empty cache, as in a new
  container) with its data on gs://: the steps after the restart are the
  local run's, and the cache holds no shard."""
  from tests.tasks.test_pretrain import _args, _env, _losses, _run

  remote = gcs.url_of("streaming/run-data")
  _upload_directory(prepared_dir, remote)
  settings = {"train.total_steps": 6, "train.long_from_step": -1,
              "checkpoint.every_steps": 3, "eval.every_steps": 0, "optimizer.warmup_steps": 2}
  first = str(tmp_path / "first")
  _run(_args(first, prepared_dir, **settings), _env())
  restarted = str(tmp_path / "restarted")
  shutil.copytree(first, restarted)
  shutil.rmtree(os.path.join(restarted, "checkpoints", "6"))  # preempted after step 3's save
  metrics = os.path.join(restarted, "metrics.jsonl")
  logged = len(open(metrics, encoding="utf-8").readlines())
  cache = str(tmp_path / "new-container-cache")
  result = _run(_args(restarted, remote, **settings),
                {**_env(), **gcs.env, "BERTJAX_CACHE_DIR": cache})
  assert f"Streaming {remote}" in result.stderr
  rerun = {}
  for line in open(metrics, encoding="utf-8").readlines()[logged:]:
    record = json.loads(line)
    if "train/loss" in record:
      rerun[record["step"]] = record["train/loss"]
  assert rerun == {step: _losses(first)[step][0] for step in (4, 5, 6)}
  assert _shards_in(cache) == []
