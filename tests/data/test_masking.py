"""Masking: rates, special tokens, whole words, determinism."""

import numpy as np
import pytest

from bertjax.data.masking import Masker, MaskingConfig, continuation_table

SPECIAL = [0, 1, 2, 3, 4]  # pad, unk, cls, sep, mask
VOCAB = 1000


def _batch(rng, batch=512, length=128):
  ids = rng.integers(5, VOCAB, (batch, length)).astype(np.int32)
  lengths = rng.integers(10, length + 1, batch)
  for row, n in enumerate(lengths):
    ids[row, 0], ids[row, n // 2], ids[row, n - 1] = 2, 3, 3
    ids[row, n:] = 0
  return ids, lengths


def test_rates_on_a_large_sample():
  rng = np.random.default_rng(0)
  masker = Masker(MaskingConfig(), VOCAB, 4, SPECIAL)
  chosen = replaced_mask = kept = random = 0
  for step in range(20):
    ids, lengths = _batch(rng)
    keys = np.arange(step * 512, (step + 1) * 512, dtype=np.uint64)
    out = masker(ids, lengths, keys)
    weights = out["masked_weights"].astype(bool)
    # 15% of each sequence (original rounding), capped by max_predictions.
    expected = np.minimum(np.maximum(1, np.round(lengths * 0.15)), 20)
    np.testing.assert_array_equal(weights.sum(1), expected)
    rows = np.arange(len(ids))[:, None]
    new = out["input_ids"][rows, out["masked_positions"]][weights]
    original = out["masked_ids"][weights]
    np.testing.assert_array_equal(original, ids[rows, out["masked_positions"]][weights])
    chosen += weights.sum()
    replaced_mask += (new == 4).sum()
    kept += (new == original).sum()
    random += ((new != 4) & (new != original)).sum()
    # Nothing outside the chosen positions changes.
    chosen_mask = np.zeros(ids.shape, bool)
    chosen_mask[np.nonzero(weights)[0], out["masked_positions"][weights]] = True
    assert not ((out["input_ids"] != ids) & ~chosen_mask).any()
  # Binomial standard error at n ~ 100k is ~0.0013 (80%) and ~0.001 (10%).
  assert abs(replaced_mask / chosen - 0.8) < 0.006
  assert abs(kept / chosen - 0.1) < 0.005   # a random draw can equal the original: 0.1%
  assert abs(random / chosen - 0.1) < 0.005


def test_special_tokens_and_padding_are_never_masked_and_positions_are_sorted():
  rng = np.random.default_rng(1)
  ids, lengths = _batch(rng)
  out = Masker(MaskingConfig(), VOCAB, 4, SPECIAL)(ids, lengths, np.arange(512, dtype=np.uint64))
  weights = out["masked_weights"].astype(bool)
  positions = out["masked_positions"]
  rows = np.arange(len(ids))[:, None]
  assert not np.isin(ids[rows, positions][weights], SPECIAL).any()
  assert (positions[weights] < np.repeat(lengths, weights.sum(1))).all()
  for row in range(len(ids)):
    real = positions[row][weights[row]]
    assert (np.diff(real) > 0).all()
    assert (positions[row][~weights[row]] == 0).all()
  # Random replacements are never special tokens.
  replaced = out["input_ids"][rows, positions][weights]
  assert not np.isin(replaced[replaced != 4], SPECIAL).any()


def test_mask_depends_only_on_the_key():
  rng = np.random.default_rng(2)
  ids, lengths = _batch(rng, batch=8)
  masker = Masker(MaskingConfig(), VOCAB, 4, SPECIAL, seed=7)
  keys = np.arange(100, 108, dtype=np.uint64)
  together = masker(ids, lengths, keys)
  alone = masker(ids[3:4], lengths[3:4], keys[3:4])
  for name in together:
    np.testing.assert_array_equal(together[name][3], alone[name][0])
  other = masker(ids, lengths, keys + 1000)
  assert not np.array_equal(other["masked_positions"], together["masked_positions"])
  reseeded = Masker(MaskingConfig(), VOCAB, 4, SPECIAL, seed=8)(ids, lengths, keys)
  assert not np.array_equal(reseeded["masked_positions"], together["masked_positions"])


def test_whole_word_masking_masks_whole_words():
  rng = np.random.default_rng(3)
  tokens = [f"w{i}" if i < 600 else f"##c{i}" for i in range(VOCAB)]
  continuation = continuation_table(tokens, "wordpiece")
  masker = Masker(MaskingConfig(whole_word=True, max_predictions=40), VOCAB, 4, SPECIAL,
                  continuation)
  ids, lengths = _batch(rng, batch=256)
  out = masker(ids, lengths, np.arange(256, dtype=np.uint64))
  for row in range(256):
    n = lengths[row]
    chosen = set(out["masked_positions"][row][out["masked_weights"][row] > 0].tolist())
    assert 0 < len(chosen) <= max(1, round(n * 0.15))
    # A word: a non-continuation token followed by its continuation tokens.
    word = np.cumsum(~continuation[ids[row, :n]] | np.isin(ids[row, :n], SPECIAL))
    for position in chosen:
      members = set(np.flatnonzero(word == word[position]).tolist())
      members = {p for p in members if ids[row, p] not in SPECIAL}
      assert members <= chosen, (row, position)
  assert continuation_table(["\u2581the", "re", "\u2581a"], "sentencepiece").tolist() == [
      False, True, False]


def test_config_errors():
  with pytest.raises(ValueError, match="max_predictions=20 is too small .* at max_seq_length="
                     "512 .*set max_predictions >= 77"):
    MaskingConfig().check_length(512)
  with pytest.raises(ValueError, match="sum to at most 1"):
    MaskingConfig(mask_rate=0.9, random_rate=0.2)
  with pytest.raises(ValueError, match="continuation table"):
    Masker(MaskingConfig(whole_word=True), VOCAB, 4, SPECIAL)
