"""Packed rows: the same sequences as unpacked, fewer padding slots, exact restore.

The packed pipeline and the unpacked one see the same stream of sequences;
a packing window is that stream's next `packing_window` sequences, packed.
So the sequences of a window's packed rows must be exactly the unpacked
stream's next sequences, each with the same tokens, types, mask and label,
and the loss sums of the two batches must agree.
"""

import dataclasses
import itertools
import os
import shutil
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import train
from bertjax.data import instances, loader, packing, static_instances
from bertjax.data.masking import MaskingConfig
from bertjax.models import EncoderConfig, init_params

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import modernbert_packing  # noqa: E402  (a script, not a package)

LENGTH, PREDICTIONS, WINDOW = 64, 10, 60


def _config(data_dir, objective, **changes):
  return loader.LoaderConfig(data_dir, objective=objective, max_seq_length=LENGTH,
                             masking=MaskingConfig(max_predictions=PREDICTIONS),
                             shuffle_window=50, seed=3, **changes)


def _unpacked_sequences(batch):
  """Each row of an unpacked batch as a tuple of what defines it."""
  rows = []
  for r in range(len(batch["input_ids"])):
    n = int(batch["attention_mask"][r].sum())
    row = [batch["input_ids"][r, :n], batch["token_type_ids"][r, :n]]
    if "masked_weights" in batch:
      real = batch["masked_weights"][r] > 0
      row += [batch["masked_positions"][r, real], batch["masked_ids"][r, real]]
    else:
      row += [batch["lm_labels"][r, :n - 1]]
    if "next_sentence_labels" in batch:
      row.append(np.array([batch["next_sentence_labels"][r]]))
    rows.append(tuple(np.asarray(x).tobytes() for x in row))
  return rows


def _packed_sequences(batch):
  """The sequences of packed rows, in the unpacked form of `_unpacked_sequences`."""
  out = []
  for r in range(len(batch["input_ids"])):
    ids = batch["segment_ids"][r]
    for s in range(1, ids.max() + 1):
      where = np.flatnonzero(ids == s)
      start, n = where[0], len(where)
      assert (where == np.arange(start, start + n)).all()  # a run
      np.testing.assert_array_equal(batch["position_ids"][r, where], np.arange(n))
      row = [batch["input_ids"][r, where], batch["token_type_ids"][r, where]]
      if "masked_weights" in batch:
        real = batch["masked_weights"][r] > 0
        positions = batch["masked_positions"][r, real]
        inside = (positions >= start) & (positions < start + n)
        row += [(positions[inside] - start).astype(np.int32), batch["masked_ids"][r, real][inside]]
      else:
        np.testing.assert_array_equal(batch["lm_weights"][r, where],
                                      (np.arange(n) < n - 1).astype(np.float32))
        row += [batch["lm_labels"][r, where][:-1]]
      if "next_sentence_labels" in batch:
        assert batch["nsp_positions"][r, s - 1] == start and batch["nsp_weights"][r, s - 1] == 1
        row.append(np.array([batch["next_sentence_labels"][r, s - 1]]))
      out.append(tuple(np.asarray(x).tobytes() for x in row))
  return out


def _window_rows(packed_config):
  """The packed rows of the first packing window (WINDOW sequences), as one batch."""
  rows, count = [], 0
  for batch in loader.make_dataset(packed_config):
    for r in range(len(batch["input_ids"])):
      rows.append({name: value[r] for name, value in batch.items()})
      count += int(batch["segment_ids"][r].max())
      if count == WINDOW:
        return {name: np.stack([row[name] for row in rows]) for name in rows[0]}
      assert count < WINDOW  # a window's rows come out before the next window's


def _first_window(data_dir, objective, **changes):
  """(unpacked batch of the stream's first WINDOW sequences, the packed rows
  of the first packing window). Packed `mlm` and `ltr` sequences stay within
  a document, so their unpacked stream is made so too."""
  pieces = instances.PackedSequences
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(instances, "PackedSequences",
                  lambda *args, **kwargs: pieces(*args, **{**kwargs, "cross_documents": False}))
    unpacked = next(iter(loader.make_dataset(_config(data_dir, objective, batch_size=WINDOW,
                                                     **changes))))
  packed = _window_rows(_config(data_dir, objective, batch_size=4, max_sequences_per_row=3,
                                packing_window=WINDOW, **changes))
  return unpacked, packed


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm_pairs", "mlm", "ltr"])
def test_packed_rows_hold_exactly_the_unpacked_sequences(prepared_dir, objective):
  unpacked, packed = _first_window(prepared_dir, objective)
  assert sorted(_packed_sequences(packed)) == sorted(_unpacked_sequences(unpacked))
  assert (packed["segment_ids"] == 0).mean() < (unpacked["attention_mask"] == 0).mean()


def test_rows_respect_their_limits(prepared_dir):
  config = _config(prepared_dir, "mlm_nsp", batch_size=8, max_sequences_per_row=3,
                   packing_window=WINDOW)
  for batch in itertools.islice(loader.make_dataset(config), 6):
    assert batch["segment_ids"].max() <= 3
    assert (batch["masked_weights"].sum(axis=1) <= PREDICTIONS).all()
    for r in range(8):  # masked positions ascending, inside the real tokens
      real = batch["masked_weights"][r] > 0
      positions = batch["masked_positions"][r, real]
      assert (np.diff(positions) > 0).all()
      assert (batch["segment_ids"][r, positions] > 0).all()


@pytest.mark.parametrize("objective", ["mlm_nsp", "ltr"])
def test_packed_loss_sums_equal_the_unpacked_ones(prepared_dir, objective):
  """The model and the losses see packed rows as the sequences alone: every
  masked-LM and next-sentence sum agrees with the unpacked batch's."""
  unpacked, packed = _first_window(prepared_dir, objective)
  config = EncoderConfig(vocab_size=210, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=48, max_position_embeddings=LENGTH)
  model = train.pretraining_model(config, objective)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  sums = lambda batch: train._losses(model, params, jax.tree.map(np.asarray, batch), objective,
                                     deterministic=True, rng=None)
  got, expected = sums(packed), sums(unpacked)
  assert got.keys() == expected.keys()
  for name in got:
    np.testing.assert_allclose(got[name], expected[name], rtol=2e-5, err_msg=name)
  work, unpacked_work = train.batch_work(packed, objective), train.batch_work(unpacked, objective)
  for name in ("real_tokens", "sequences", "token_pairs", "predictions", "nsp_pairs"):
    assert float(work[name]) == float(unpacked_work[name]), name


def _window_indices(state) -> list[int]:
  """The window indices of the window stages in an iterator's state, outermost first."""
  if not isinstance(state, dict):
    return []
  found = [state["window_index"]] if "window_index" in state and "filled" in state else []
  for value in state.values():
    found += _window_indices(value)
  return found


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm"])
def test_restore_gives_the_next_packed_batches(prepared_dir, objective):
  config = _config(prepared_dir, objective, batch_size=4, max_sequences_per_row=3,
                   packing_window=WINDOW, num_epochs=None)
  iterator = iter(loader.make_dataset(config))
  for _ in range(100):  # into the second packing window, then two batches on
    next(iterator)
    if _window_indices(iterator.get_state())[0] >= 1:
      break
  next(iterator), next(iterator)
  state = iterator.get_state()
  assert _window_indices(state)[0] >= 1, state  # the packing stage's (outermost)
  assert state["position"] > 0, state  # mid-window: the restore re-packs the window
  expected = [next(iterator) for _ in range(12)]
  restored = iter(loader.make_dataset(config))
  restored.set_state(state)
  for want, got in zip(expected, (next(restored) for _ in range(12))):
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_mlm_sequences_stay_within_a_document(prepared_dir):
  """Packed, a `mlm` sequence never runs on into the next document: a [SEP]
  only ends a sequence."""
  config = _config(prepared_dir, "mlm", batch_size=8, max_sequences_per_row=4,
                   packing_window=WINDOW)
  sep = 3  # the test vocabulary's [SEP]
  for batch in itertools.islice(loader.make_dataset(config), 4):
    for r in range(8):
      ids, segments = batch["input_ids"][r], batch["segment_ids"][r]
      last = np.append(segments[1:] != segments[:-1], True) & (segments > 0)
      # Corruption may turn a [SEP] into a random token, never the reverse.
      assert not ((ids == sep) & ~last & (segments > 0)).any()


def test_static_instances_pack_too(prepared_dir, tmp_path):
  data = tmp_path / "data"
  shutil.copytree(prepared_dir, data)
  masking = MaskingConfig(max_predictions=PREDICTIONS)
  static_instances.prepare_static(str(data), objective="mlm_nsp", max_seq_length=LENGTH,
                                  masking=masking, dupe_factor=1, short_seq_prob=0.1, seed=0,
                                  eval_percent=1.0, num_workers=1, show_progress=False)
  config = loader.LoaderConfig(str(data), objective="mlm_nsp", max_seq_length=LENGTH,
                               masking=masking, batch_size=4, static=True, split="train",
                               max_sequences_per_row=3, packing_window=WINDOW)
  unpacked = dataclasses.replace(config, max_sequences_per_row=1, batch_size=WINDOW)
  expected = _unpacked_sequences(next(iter(loader.make_dataset(unpacked))))
  assert sorted(_packed_sequences(_window_rows(config))) == sorted(expected)


@pytest.mark.parametrize("seed", range(20))
def test_best_fit_decreasing_is_near_optimal(seed):
  """Within the bound best-fit decreasing guarantees (11/9 OPT + 6/9), against
  the optimum found by exhaustive search, and never over a row's limits."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, 40, rng.integers(2, 9)).tolist()
  rows = packing.pack(lengths, [1] * len(lengths), 40, 40, 40)
  assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
  assert all(sum(lengths[i] for i in row) <= 40 for row in rows)
  assert len(rows) <= 11 / 9 * _optimum(lengths, 40) + 6 / 9


def _optimum(lengths, capacity):
  best = len(lengths)

  def place(i, bins):
    nonlocal best
    if len(bins) >= best:
      return
    if i == len(lengths):
      best = len(bins)
      return
    for b in range(len(bins)):
      if bins[b] + lengths[i] <= capacity:
        bins[b] += lengths[i]
        place(i + 1, bins)
        bins[b] -= lengths[i]
    place(i + 1, bins + [lengths[i]])

  place(0, [])
  return best


def test_pack_keeps_the_sequence_and_prediction_limits():
  rows = packing.pack([10] * 9, [4] * 9, 100, 3, 9)
  assert all(len(row) <= 2 for row in rows)  # 3 x 4 predictions > 9
  rows = packing.pack([10] * 9, [1] * 9, 100, 3, 9)
  assert all(len(row) <= 3 for row in rows) and len(rows) == 3
  with pytest.raises(ValueError, match="does not fit"):
    packing.pack([101], [1], 100, 3, 9)


def test_the_transcription_of_modernberts_packer_packs_as_its_own_tests_expect():
  """ModernBERT's tests/test_sequence_packer.py `test_packer`: 26 sequences of
  0-10 tokens (one empty), read 4 at a time, packed into 5 "pseqs" of 15
  tokens a batch with a buffer of 5: the sequences of each pseq it expects."""
  lengths = [4, 5, 10, 3, 6, 6, 7, 3, 2, 0, 7, 4, 4, 8, 3, 7, 7, 8, 1, 4, 10, 4, 8, 2, 10, 7]
  batches = list(modernbert_packing.greedy_best_fit(lengths, 5, 15, 5, 4))
  assert batches == [
      [[0, 1, 4], [2, 3, 8], [5, 6], [7, 10, 11, 18], [12, 13, 14]],
      [[19, 17, 23], [16, 15], [20, 21], [22, 25], [24]],
  ]


@pytest.mark.parametrize("phase", [0, 1])
def test_the_modernbert_recipes_rows_are_as_full_as_its_packer_makes_them(phase):
  """One sequence a document (its first tokens) packed as the recipe packs
  them (`data.max_sequences_per_row`, `data.packing_window`), against
  ModernBERT's packer on the same sequences at its setting for 8 GPUs (576
  sequences a device batch, micro-batches of 96; at 8,192 tokens 72 and 12),
  whose micro-batches are one unpadded run each: at most half a point more
  padding. Document lengths are log-normal (median 300 tokens), as many
  short and a few long web pages."""
  from bertjax.configs import modernbert_pretrain

  config = modernbert_pretrain.get_config()
  length = (config.train.max_seq_length, config.train.long_seq_length)[phase]
  batch, micro = ((576, 96), (72, 12))[phase]
  rng = np.random.default_rng(phase)
  lengths = np.minimum(np.maximum(8, rng.lognormal(np.log(300), 1.25, 30_000)).astype(int) + 2,
                       length)
  window = config.data.packing_window
  rows = sum(len(packing.pack(lengths[i:i + window], np.zeros(window, int), length,
                              config.data.max_sequences_per_row, 1))
             for i in range(0, len(lengths), window))
  ours = 1 - lengths.sum() / (rows * length)
  real, slots, _ = modernbert_packing.padding_of(lengths, modernbert_packing.greedy_best_fit(
      lengths, batch // micro, micro * length, 5 * batch, batch), micro * length)
  theirs = 1 - real / slots
  assert ours <= theirs + 0.005, (ours, theirs)
