"""Masking: rates, special tokens, whole words, determinism."""

import numpy as np
import pytest

from bertjax.data.masking import Masker, MaskingConfig, continuation_table

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
SPECIAL_IDS = list(SPECIAL.values())
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
  masker = Masker(MaskingConfig(), VOCAB, SPECIAL)
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


def test_excluded_special_tokens_and_padding_are_never_masked_and_positions_are_sorted():
  rng = np.random.default_rng(1)
  ids, lengths = _batch(rng)
  ids[:, 5:9] = np.where(ids[:, 5:9] > 0, 1, 0)  # [UNK]s
  out = Masker(MaskingConfig(specials="excluded"), VOCAB, SPECIAL)(
      ids, lengths, np.arange(512, dtype=np.uint64))
  weights = out["masked_weights"].astype(bool)
  positions = out["masked_positions"]
  rows = np.arange(len(ids))[:, None]
  assert not np.isin(ids[rows, positions][weights], SPECIAL_IDS).any()
  assert (positions[weights] < np.repeat(lengths, weights.sum(1))).all()
  for row in range(len(ids)):
    real = positions[row][weights[row]]
    assert (np.diff(real) > 0).all()
    assert (positions[row][~weights[row]] == 0).all()
  # Random replacements are never special tokens.
  replaced = out["input_ids"][rows, positions][weights]
  assert not np.isin(replaced[replaced != 4], SPECIAL_IDS).any()


def test_the_original_rule_masks_unk_like_any_word_and_draws_from_the_whole_vocabulary():
  """create_pretraining_data.py skips only [CLS] and [SEP]: an [UNK] is chosen
  at its share of the candidates, and a random replacement is any id of the
  vocabulary, the special tokens included (here 5 of 50)."""
  rng = np.random.default_rng(5)
  vocab = 50
  masker = Masker(MaskingConfig(), vocab, SPECIAL)
  chosen_unk = candidates_unk = chosen = candidates = 0
  drawn = []
  for step in range(40):
    ids, lengths = _batch(rng)
    ids = np.where(ids >= 5, ids % (vocab - 5) + 5, ids).astype(np.int32)
    real = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    unk = real & (rng.random(ids.shape) < 0.1) & (ids >= 5)
    ids[unk] = 1
    out = masker(ids, lengths, np.arange(step * 512, (step + 1) * 512, dtype=np.uint64))
    weights = out["masked_weights"].astype(bool)
    rows = np.arange(len(ids))[:, None]
    masked = out["masked_ids"][weights]
    assert not np.isin(masked, [SPECIAL["cls"], SPECIAL["sep"], SPECIAL["pad"]]).any()
    chosen_unk += (masked == 1).sum()
    chosen += weights.sum()
    maskable = real & ~np.isin(ids, [SPECIAL["cls"], SPECIAL["sep"]])
    candidates_unk += (maskable & (ids == 1)).sum()
    candidates += maskable.sum()
    new = out["input_ids"][rows, out["masked_positions"]][weights]
    drawn.append(new[(new != 4) & (new != masked)])
  np.testing.assert_allclose(chosen_unk / chosen, candidates_unk / candidates, rtol=0.05)
  drawn = np.concatenate(drawn)
  counts = np.bincount(drawn, minlength=vocab)
  # Every id can be drawn ([MASK] and a token's own id are hidden by the
  # comparisons above), and specials at their share of the vocabulary.
  assert (counts[[0, 1, 2, 3]] > 0).all() and (counts[5:] > 0).all()
  np.testing.assert_allclose(np.isin(drawn, [0, 1, 2, 3]).mean(), 4 / 49, rtol=0.2)


def test_mask_depends_only_on_the_key():
  rng = np.random.default_rng(2)
  ids, lengths = _batch(rng, batch=8)
  masker = Masker(MaskingConfig(), VOCAB, SPECIAL, seed=7)
  keys = np.arange(100, 108, dtype=np.uint64)
  together = masker(ids, lengths, keys)
  alone = masker(ids[3:4], lengths[3:4], keys[3:4])
  for name in together:
    np.testing.assert_array_equal(together[name][3], alone[name][0])
  other = masker(ids, lengths, keys + 1000)
  assert not np.array_equal(other["masked_positions"], together["masked_positions"])
  reseeded = Masker(MaskingConfig(), VOCAB, SPECIAL, seed=8)(ids, lengths, keys)
  assert not np.array_equal(reseeded["masked_positions"], together["masked_positions"])


def test_whole_word_masking_masks_whole_words():
  rng = np.random.default_rng(3)
  tokens = [f"w{i}" if i < 600 else f"##c{i}" for i in range(VOCAB)]
  continuation = continuation_table(tokens, "wordpiece")
  masker = Masker(MaskingConfig(whole_word=True, max_predictions=40), VOCAB, SPECIAL,
                  continuation)
  ids, lengths = _batch(rng, batch=256)
  out = masker(ids, lengths, np.arange(256, dtype=np.uint64))
  for row in range(256):
    n = lengths[row]
    chosen = set(out["masked_positions"][row][out["masked_weights"][row] > 0].tolist())
    assert 0 < len(chosen) <= max(1, round(n * 0.15))
    # A word: a non-continuation token followed by its continuation tokens.
    word = np.cumsum(~continuation[ids[row, :n]] | np.isin(ids[row, :n], SPECIAL_IDS))
    for position in chosen:
      members = set(np.flatnonzero(word == word[position]).tolist())
      members = {p for p in members if ids[row, p] not in SPECIAL_IDS}
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
    Masker(MaskingConfig(whole_word=True), VOCAB, SPECIAL)


def test_the_original_rule_matches_create_pretraining_data_on_text_with_unks():
  """The same sequences, with [UNK]s, through the original's
  `create_masked_lm_predictions` and the default Masker: as many predictions,
  the same share of [UNK]s among them, and random replacements that are
  special tokens at the same rate (the original draws from the whole
  vocabulary). The random streams differ, so rates are compared."""
  import random

  from tests import reference

  original = reference.original("create_pretraining_data")
  vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]
           + [f"w{i}" for i in range(33)])
  ids = {token: i for i, token in enumerate(vocab)}
  rng = np.random.default_rng(6)
  sequences = []
  for _ in range(6000):
    n_a, n_b = rng.integers(5, 40, 2)
    words = [vocab[i] if rng.random() > 0.12 else "[UNK]"
             for i in rng.integers(7, len(vocab), n_a + n_b)]
    sequences.append(["[CLS]", *words[:n_a], "[SEP]", *words[n_a:], "[SEP]"])

  def rates(outputs):
    """(predictions a sequence, [UNK] share of them, special share of random draws)."""
    count = unk = draws = special = 0
    for tokens, positions, labels, new in outputs:
      count += len(positions)
      unk += sum(label == "[UNK]" for label in labels)
      for token, label in zip(new, labels):
        if token not in ("[MASK]", label):
          draws += 1
          special += token.startswith("[")
    return count / len(outputs), unk / count, special / draws

  state = random.Random(7)
  theirs = []
  for tokens in sequences:
    output, positions, labels = original.create_masked_lm_predictions(
        tokens, 0.15, 20, vocab, state)
    theirs.append((tokens, positions, labels, [output[p] for p in positions]))

  masker = Masker(MaskingConfig(), len(vocab), {"pad": 0, "unk": 1, "cls": 2, "sep": 3,
                                                "mask": 4})
  length = max(len(t) for t in sequences)
  batch = np.zeros((len(sequences), length), np.int32)
  for row, tokens in enumerate(sequences):
    batch[row, :len(tokens)] = [ids[t] for t in tokens]
  lengths = np.array([len(t) for t in sequences])
  out = masker(batch, lengths, np.arange(len(sequences), dtype=np.uint64))
  ours = []
  for row, tokens in enumerate(sequences):
    weights = out["masked_weights"][row].astype(bool)
    positions = out["masked_positions"][row][weights]
    ours.append((tokens, positions, [tokens[p] for p in positions],
                 [vocab[i] for i in out["input_ids"][row][positions]]))

  (count_t, unk_t, special_t), (count_o, unk_o, special_o) = rates(theirs), rates(ours)
  assert count_o == count_t  # the same budget: round(15% of the length), at least 1
  assert unk_t > 0.08 and special_t > 0.1  # what the original does, on this text
  np.testing.assert_allclose(unk_o, unk_t, rtol=0.08)
  np.testing.assert_allclose(special_o, special_t, rtol=0.25)


def _modernbert_mlm_masking(seq, mask_prob, mask_token, pad_token, rng, ignore_index=-100):
  """ModernBERT's `SequencePacker.mlm_masking` (src/sequence_packer.py),
  transcribed: one uniform a token partitions [MASK] (below 0.8 p), random
  (0.8 p to 0.9 p) and kept (0.9 p to p); random ids below the batch's
  largest id once the [MASK]s are in; padding never a label."""
  labels = np.where(seq == pad_token, ignore_index, seq)
  rand = rng.random(seq.shape)
  mask_mask = rand < mask_prob * 0.8
  random_mask = (rand >= mask_prob * 0.8) & (rand < mask_prob * 0.9)
  keep_mask = (rand >= mask_prob * 0.9) & (rand < mask_prob)
  labels = np.where(mask_mask | random_mask | keep_mask, labels, ignore_index)
  seq = np.where(mask_mask, mask_token, seq)
  random_words = rng.integers(0, np.max(seq) + 1, size=seq.shape)
  return np.where(random_mask, random_words, seq), labels


def _shares(ids, lengths, chosen, new):
  """(share of real tokens chosen, of [CLS]/[SEP] chosen, of the chosen
  turned to [MASK], to another id)."""
  real = np.arange(ids.shape[1])[None, :] < lengths[:, None]
  special = real & np.isin(ids, [SPECIAL["cls"], SPECIAL["sep"]])
  return (chosen[real].mean(), chosen[special].mean(),
          (new[chosen] == SPECIAL["mask"]).mean(),
          ((new[chosen] != SPECIAL["mask"]) & (new[chosen] != ids[chosen])).mean())


def test_the_modernbert_rule_masks_as_modernberts_packer():
  """Each token independently at 30%, [CLS] and [SEP] at their share too,
  80/10/10: the same shares as a transcription of ModernBERT's own masking on
  the same sequences, and the mean count a sequence is 30% of its tokens."""
  rng = np.random.default_rng(0)
  config = MaskingConfig(masked_lm_prob=0.3, max_predictions=65, rule="modernbert")
  config.check_length(128)
  masker = Masker(config, VOCAB, SPECIAL)
  ours, theirs, counts = [], [], []
  for step in range(16):
    ids, lengths = _batch(rng)
    out = masker(ids, lengths, np.arange(step * 512, (step + 1) * 512, dtype=np.uint64))
    weights = out["masked_weights"].astype(bool)
    chosen = np.zeros(ids.shape, bool)
    rows, cols = np.nonzero(weights)
    chosen[rows, out["masked_positions"][rows, cols]] = True
    ours.append(_shares(ids, lengths, chosen, out["input_ids"]))
    counts.append(weights.sum(1) / lengths)
    # Random replacements stay below the sequence's largest id, [MASK]s in.
    random = chosen & (out["input_ids"] != SPECIAL["mask"]) & (out["input_ids"] != ids)
    largest = np.maximum(ids.max(1), SPECIAL["mask"])[:, None].repeat(ids.shape[1], 1)
    assert (out["input_ids"][random] <= largest[random]).all()
    masked, labels = _modernbert_mlm_masking(ids, 0.3, SPECIAL["mask"], SPECIAL["pad"], rng)
    theirs.append(_shares(ids, lengths, labels != -100, masked))
  ours, theirs = np.mean(ours, 0), np.mean(theirs, 0)
  assert ours[0] == pytest.approx(0.30, abs=0.005) and theirs[0] == pytest.approx(0.30, abs=0.005)
  assert ours[1] == pytest.approx(0.30, abs=0.02) and theirs[1] == pytest.approx(0.30, abs=0.02)
  np.testing.assert_allclose(ours[2:], theirs[2:], atol=0.01)
  assert ours[2] == pytest.approx(0.8, abs=0.01) and ours[3] == pytest.approx(0.1, abs=0.01)
  assert np.mean(np.concatenate(counts)) == pytest.approx(0.30, abs=0.005)


def test_the_modernbert_rule_needs_room_above_the_mean_and_single_tokens():
  with pytest.raises(Exception, match="max_predictions=308 is too small .* set max_predictions "
                     ">= 381"):
    MaskingConfig(masked_lm_prob=0.3, max_predictions=308, rule="modernbert").check_length(1024)
  MaskingConfig(masked_lm_prob=0.3, max_predictions=308).check_length(1024)  # the exact rule
  with pytest.raises(Exception, match="takes neither whole_word_masking"):
    MaskingConfig(rule="modernbert", whole_word=True)
  with pytest.raises(Exception, match="the masking rule must be one of"):
    MaskingConfig(rule="roberta")
