"""The grain pipeline: shapes, objectives, determinism, exact restore, sharding."""

import json

import jax
import numpy as np
import pytest

from bertjax.data import loader, shards
from bertjax.data.masking import MaskingConfig
from bertjax.data.tokenizers import tokenizer_from_settings


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for name in x:
      np.testing.assert_array_equal(x[name], y[name], err_msg=name)


@pytest.mark.parametrize("objective,keys", [
    ("mlm_nsp", {"input_ids", "attention_mask", "token_type_ids", "masked_positions",
                 "masked_ids", "masked_weights", "next_sentence_labels"}),
    ("mlm", {"input_ids", "attention_mask", "token_type_ids", "masked_positions",
             "masked_ids", "masked_weights"}),
    ("mlm_pairs", {"input_ids", "attention_mask", "token_type_ids", "masked_positions",
                   "masked_ids", "masked_weights"}),
    ("ltr", {"input_ids", "attention_mask", "token_type_ids", "lm_labels", "lm_weights"}),
])
@pytest.mark.parametrize("length", [128, 512])
def test_batches_have_static_shapes(prepared_dir, objective, keys, length):
  config = loader.LoaderConfig(prepared_dir, objective=objective, max_seq_length=length,
                               batch_size=4, masking=MaskingConfig(max_predictions=80))
  tokenizer = tokenizer_from_settings(prepared_dir, shards.read_info(prepared_dir)["tokenizer"])
  for batch in _take(iter(loader.make_dataset(config)), 3):
    assert set(batch) == keys
    assert batch["input_ids"].shape == (4, length) and batch["input_ids"].dtype == np.int32
    lengths = batch["attention_mask"].sum(1)
    assert (lengths <= length).all() and (batch["input_ids"][:, 0] == tokenizer.cls_id).all()
    if objective == "ltr":
      ids, labels = batch["input_ids"], batch["lm_labels"]
      np.testing.assert_array_equal(labels[:, :-1][batch["lm_weights"][:, :-1] > 0],
                                    ids[:, 1:][batch["lm_weights"][:, :-1] > 0])
      np.testing.assert_array_equal(batch["lm_weights"].sum(1), lengths - 1)
    else:
      assert batch["masked_positions"].shape == (4, 80)
      if objective == "mlm":
        assert not batch["token_type_ids"].any()
  if objective == "mlm_nsp":
    # Segment B carries token type 1 and ends with [SEP].
    batch = next(iter(loader.make_dataset(config)))
    assert batch["token_type_ids"].any()


def test_determinism_and_seeds(prepared_dir):
  config = loader.LoaderConfig(prepared_dir, batch_size=8)
  _assert_same(_take(iter(loader.make_dataset(config)), 5),
               _take(iter(loader.make_dataset(config)), 5))
  other = loader.LoaderConfig(prepared_dir, batch_size=8, seed=1)
  assert not np.array_equal(next(iter(loader.make_dataset(config)))["input_ids"],
                            next(iter(loader.make_dataset(other)))["input_ids"])


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm"])
def test_restore_gives_the_next_batches_across_epochs(prepared_dir, objective):
  # About 120 documents: one epoch is a few dozen batches of 8.
  config = loader.LoaderConfig(prepared_dir, objective=objective, batch_size=8,
                               shuffle_window=50)
  iterator = iter(loader.make_dataset(config))
  for stop in (3, 40, 95):  # the later ones lie in the second and third epochs
    while True:
      state = iterator.get_state()
      json.dumps(state)  # checkpointable as JSON
      if stop == 0:
        break
      next(iterator)
      stop -= 1
    expected = _take(iterator, 4)
    restored = iter(loader.make_dataset(config))
    restored.set_state(state)
    _assert_same(_take(restored, 4), expected)


def test_restore_with_worker_processes(prepared_dir):
  config = loader.LoaderConfig(prepared_dir, batch_size=8, worker_count=2)
  iterator = iter(loader.make_dataset(config))
  _take(iterator, 7)
  state = iterator.get_state()
  expected = _take(iterator, 3)
  restored = iter(loader.make_dataset(config))
  restored.set_state(state)
  _assert_same(_take(restored, 3), expected)


def test_worker_processes_leave_a_terminal_s_signals_to_the_run_which_stops_them(
    prepared_dir):
  """A terminal's signals reach the workers too (its whole process group): they
  ignore them, and the run stops them when its input closes. Batches come back
  as plain arrays: no shared-memory segment of theirs can outlive the run."""
  import multiprocessing
  import os
  import signal
  import time

  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  config = loader.LoaderConfig(prepared_dir, batch_size=8, worker_count=2)
  plain = iter(loader.make_dataset(config))
  expected = _take(plain, 6)
  plain.close()
  assert all(type(value) is np.ndarray  # pylint: disable=unidiomatic-typecheck
             for batch in expected for value in batch.values())
  before = set(multiprocessing.active_children())
  device = loader.DeviceIterator(iter(loader.make_dataset(config)),
                                 jax.NamedSharding(mesh, jax.P("data")))
  got = [next(device) for _ in range(3)]  # from both workers
  workers = [p for p in multiprocessing.active_children() if p not in before]
  assert len(workers) == 2
  for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    for worker in workers:
      os.kill(worker.pid, signum)
  time.sleep(0.5)
  assert all(worker.is_alive() for worker in workers)
  got += [next(device) for _ in range(3)]
  _assert_same([jax.device_get(b) for b in got], expected)
  device.close()
  assert not any(worker.is_alive() for worker in workers)


def test_masks_differ_between_epochs(prepared_dir):
  config = loader.LoaderConfig(prepared_dir, objective="mlm", batch_size=1, shuffle_window=1,
                               seed=3)
  per_epoch = loader.LoaderConfig(prepared_dir, objective="mlm", batch_size=1,
                                  shuffle_window=1, seed=3, num_epochs=1)
  batches_per_epoch = sum(1 for _ in loader.make_dataset(per_epoch))
  iterator = iter(loader.make_dataset(config))
  epochs = [_take(iterator, batches_per_epoch) for _ in range(2)]
  # Shuffled anew each epoch, and masked anew: no repeated (sequence, mask) pair.
  first = {(b["masked_ids"].tobytes(), b["masked_positions"].tobytes()) for b in epochs[0]}
  second = {(b["masked_ids"].tobytes(), b["masked_positions"].tobytes()) for b in epochs[1]}
  assert len(first & second) < 0.05 * len(first)


def test_processes_read_disjoint_documents_covering_the_data():
  for count in (1, 2, 3, 7):
    seen = []
    for index in range(count):
      order = loader.document_order(100, index, count, seed=5, num_epochs=1)
      seen.append(list(order))
    flat = [d for part in seen for d in part]
    assert sorted(flat) == list(range(100))
    assert max(len(p) for p in seen) - min(len(p) for p in seen) <= 1
  # Epochs are reshuffled.
  two = list(loader.document_order(100, 0, 1, seed=5, num_epochs=2))
  assert sorted(two[:100]) == sorted(two[100:]) == list(range(100)) and two[:100] != two[100:]


@pytest.mark.parametrize("split", ["train", "eval"])
def test_random_next_segments_stay_in_their_split(prepared_dir, split):
  """A held-out document never lends a B segment to a training instance (nor a
  training document to an evaluation one)."""
  source = loader.DocumentSource(prepared_dir)
  config = loader.LoaderConfig(prepared_dir, split=split, eval_percent=30.0, seed=3)
  mine = set(loader.split_documents(len(source), split, 30.0).tolist())
  streams = {d: np.concatenate(source[d]).tolist() for d in range(len(source))}

  def sources_of(segment):  # the documents holding it, contiguous
    n = len(segment)
    return {d for d, ids in streams.items()
            if any(ids[k:k + n] == segment for k in range(len(ids) - n + 1))}

  make = loader._NextSentenceInstances(source, config, cls_id=2, sep_id=3)
  random_next = 0
  for position, d in enumerate(sorted(mine)):
    for instance in make.flat_map(loader.instances.DocumentRef(position, d, source[d])):
      if instance.next_sentence_label:
        b = instance.token_ids[instance.num_first:-1].tolist()
        found = sources_of(b[:8])
        assert found and found <= mine, (d, found - mine)
        random_next += 1
  assert random_next > 20


def test_ltr_reads_the_no_nsp_pairs_with_both_segment_embeddings(prepared_dir):
  """LTR & No NSP: the paper's input representation ([CLS] A [SEP] B [SEP],
  token types 0 and 1), so that the segment-B embedding is trained for the
  pair tasks; the targets are each token's successor within the pair."""
  config = dict(batch_size=16, seed=2)
  pairs = _take(iter(loader.make_dataset(loader.LoaderConfig(
      prepared_dir, objective="mlm_pairs", **config))), 4)
  ltr = _take(iter(loader.make_dataset(loader.LoaderConfig(
      prepared_dir, objective="ltr", **config))), 4)
  for masked, left_to_right in zip(pairs, ltr):
    original = masked["input_ids"].copy()
    rows = np.arange(len(original))[:, None]
    weights = masked["masked_weights"].astype(bool)
    positions = np.where(weights, masked["masked_positions"], 0)
    original[rows, positions] = np.where(weights, masked["masked_ids"], original[rows, positions])
    np.testing.assert_array_equal(left_to_right["input_ids"], original)
    np.testing.assert_array_equal(left_to_right["token_type_ids"], masked["token_type_ids"])
    assert left_to_right["token_type_ids"].any(axis=1).all()
    ids, weights = left_to_right["input_ids"], left_to_right["lm_weights"].astype(bool)
    np.testing.assert_array_equal(left_to_right["lm_labels"][:, :-1][weights[:, :-1]],
                                  ids[:, 1:][weights[:, :-1]])


def test_no_nsp_pairs_are_the_next_sentence_pairs_without_labels(prepared_dir):
  """The paper's "No NSP": the same pairs and masks as mlm_nsp (half with a
  random B), only the next-sentence labels left out."""
  batches = {objective: _take(iter(loader.make_dataset(loader.LoaderConfig(
      prepared_dir, objective=objective, batch_size=16, seed=2))), 4)
      for objective in ("mlm_nsp", "mlm_pairs")}
  assert any(b["next_sentence_labels"].any() for b in batches["mlm_nsp"])
  _assert_same([{k: v for k, v in b.items() if k != "next_sentence_labels"}
                for b in batches["mlm_nsp"]], batches["mlm_pairs"])
  assert all(b["token_type_ids"].any(axis=1).all() for b in batches["mlm_pairs"])  # pairs


def test_one_epoch_of_packed_text_holds_every_token(prepared_dir):
  config = loader.LoaderConfig(prepared_dir, objective="mlm", batch_size=1, num_epochs=1,
                               shuffle_window=1, short_seq_prob=0.0)
  tokenizer = tokenizer_from_settings(prepared_dir, shards.read_info(prepared_dir)["tokenizer"])
  specials = list(tokenizer.special_ids.values())
  count = 0
  for batch in loader.make_dataset(config):
    ids = batch["input_ids"][0].copy()
    weights = batch["masked_weights"][0].astype(bool)
    ids[batch["masked_positions"][0][weights]] = batch["masked_ids"][0][weights]  # unmasked
    ids = ids[:batch["attention_mask"][0].sum()]
    count += int((~np.isin(ids, specials)).sum())
  assert count == shards.read_stats(prepared_dir).tokens


def test_truncated_documents_in_packed_rows_give_each_document_once(prepared_dir):
  """ModernBERT's rule through the loader: packed rows of up to 4 sequences,
  one sequence a document (its first tokens), so an epoch's sequences are as
  many as the documents, and none is longer than the row allows."""
  config = loader.LoaderConfig(prepared_dir, objective="mlm", max_seq_length=32, batch_size=4,
                               num_epochs=1, shuffle_window=1, short_seq_prob=0.0,
                               masking=MaskingConfig(masked_lm_prob=0.3, max_predictions=23,
                                                     rule="modernbert"),
                               max_sequences_per_row=4, truncate_documents=True,
                               drop_remainder=False)
  sequences = 0
  for batch in loader.make_dataset(config):
    segments = batch["segment_ids"]
    sequences += sum(len(set(row[row > 0].tolist())) for row in segments)
  assert sequences == len(loader.DocumentSource(prepared_dir))
  with pytest.raises(ValueError, match="truncate_documents makes one sequence a document"):
    loader.LoaderConfig(prepared_dir, objective="mlm_nsp", truncate_documents=True)


def test_config_errors(prepared_dir, tmp_path):
  with pytest.raises(ValueError, match="objective must be one of"):
    loader.LoaderConfig(prepared_dir, objective="clm")
  with pytest.raises(ValueError, match="max_predictions=20 is too small"):
    loader.LoaderConfig(prepared_dir, max_seq_length=512)
  with pytest.raises(FileNotFoundError, match="not a prepared pre-training directory"):
    loader.make_dataset(loader.LoaderConfig(str(tmp_path)))
  with pytest.raises(ValueError, match="process_index=2 not in"):
    loader.make_dataset(loader.LoaderConfig(prepared_dir), process_index=2, process_count=2)


def test_device_iterator_assembles_global_batches_and_resumes(prepared_dir):
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = jax.NamedSharding(mesh, jax.P("data"))
  config = loader.LoaderConfig(prepared_dir, batch_size=16)
  device = loader.DeviceIterator(iter(loader.make_dataset(config)), sharding, prefetch=3)
  first = [next(device) for _ in range(4)]
  assert first[0]["input_ids"].sharding == sharding
  assert first[0]["input_ids"].shape == (16, 128)
  state = device.get_state()
  expected = [jax.device_get(next(device)) for _ in range(2)]
  device.set_state(state)
  _assert_same([jax.device_get(next(device)) for _ in range(2)], expected)
  device.close()
  with pytest.raises(RuntimeError, match="closed"):
    next(device)
  plain = _take(iter(loader.make_dataset(config)), 6)
  _assert_same([jax.device_get(b) for b in first], plain[:4])
  # The end of the data, every time it is asked for.
  finite = loader.LoaderConfig(prepared_dir, batch_size=16, num_epochs=1)
  device = loader.DeviceIterator(iter(loader.make_dataset(finite)), sharding)
  count = sum(1 for _ in device)
  assert count == sum(1 for _ in loader.make_dataset(finite))
  for _ in range(2):
    with pytest.raises(StopIteration):
      next(device)


def test_device_iterator_restored_before_its_first_batch_makes_none_of_the_start(prepared_dir):
  """A resumed run sets the state before taking a batch: the batches of the
  position left (a shuffle window filled for nothing) are never made."""
  import time

  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = jax.NamedSharding(mesh, jax.P("data"))
  config = loader.LoaderConfig(prepared_dir, batch_size=16)
  plain = iter(loader.make_dataset(config))
  _take(plain, 3)
  state = plain.get_state()
  expected = _take(plain, 2)

  class Counted:  # the loader's iterator, counting the batches asked of it
    def __init__(self, iterator):
      self.iterator, self.batches = iterator, 0

    def __iter__(self):
      return self

    def __next__(self):
      self.batches += 1
      return next(self.iterator)

    def get_state(self):
      return self.iterator.get_state()

    def set_state(self, state):
      self.iterator.set_state(state)

  counted = Counted(iter(loader.make_dataset(config)))
  device = loader.DeviceIterator(counted, sharding)
  time.sleep(0.5)
  device.set_state(state)
  assert counted.batches == 0
  _assert_same([jax.device_get(next(device)) for _ in range(2)], expected)
  device.close()


def test_static_masking_writes_what_the_dynamic_pipeline_makes(prepared_dir, tmp_path):
  import shutil

  from bertjax.data import static_instances

  data = tmp_path / "static"
  shutil.copytree(prepared_dir, data)
  masking = MaskingConfig(max_predictions=20)
  count = static_instances.prepare_static(str(data), objective="mlm_nsp", max_seq_length=128,
                                          masking=masking, dupe_factor=2, seed=4,
                                          show_progress=False)
  # One process reads what the builder split over its shards: instances and
  # masks depend on (seed, epoch, document) only, not on who reads them.
  dynamic = []
  # Of the training split: the held-out documents (1% by default) get none.
  config = loader.LoaderConfig(str(data), batch_size=64, num_epochs=2, shuffle_window=1,
                               seed=4, drop_remainder=False, split="train")
  for batch in loader.make_dataset(config):
    rows = len(batch["input_ids"])
    dynamic += [{k: v[row] for k, v in batch.items()} for row in range(rows)]
  assert count == len(dynamic)

  static = loader.LoaderConfig(str(data), static=True, batch_size=len(dynamic), num_epochs=1,
                               seed=9, drop_remainder=False)
  batch = next(iter(loader.make_dataset(static)))
  key = lambda row: (row["input_ids"].tobytes(), row["masked_positions"].tobytes(),
                     row["masked_ids"].tobytes(), int(row["next_sentence_labels"]))
  written = sorted(key({k: v[row] for k, v in batch.items()}) for row in range(len(dynamic)))
  assert written == sorted(key(row) for row in dynamic)

  # Restores exactly, and refuses other settings.
  small = loader.LoaderConfig(str(data), static=True, batch_size=8)
  iterator = iter(loader.make_dataset(small))
  _take(iterator, 5)
  state = iterator.get_state()
  expected = _take(iterator, 3)
  restored = iter(loader.make_dataset(small))
  restored.set_state(state)
  _assert_same(_take(restored, 3), expected)
  with pytest.raises(ValueError, match="static instances were written for"):
    loader.make_dataset(loader.LoaderConfig(str(data), static=True, objective="mlm"))
  with pytest.raises(FileNotFoundError, match="no statically masked instances of length 128"):
    loader.make_dataset(loader.LoaderConfig(prepared_dir, static=True))
  with pytest.raises(ValueError, match="static instances were written for"):  # other held-out
    loader.make_dataset(loader.LoaderConfig(str(data), static=True, split="train",
                                            eval_percent=5.0))
  with pytest.raises(ValueError, match="evaluate with dynamic masking"):
    loader.make_dataset(loader.LoaderConfig(str(data), static=True, split="eval"))
