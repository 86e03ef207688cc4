"""Masked-LM targets for whole batches, vectorised in numpy.

Two rules (`MaskingConfig.rule`). "bert", as in the paper and the original
code: 15% of the tokens of each sequence
(`round(length * masked_lm_prob)`, at least one, at most `max_predictions`) are
chosen in random order, never [CLS], [SEP] or padding; of them 80% become
[MASK], 10% a random token and 10% stay as they are. As in the original
`create_pretraining_data.py`, an [UNK] may be chosen like any word, and a
random token is drawn from the whole vocabulary, special tokens included
(`specials="original"`); `specials="excluded"` chooses and draws no special
token at all. With whole-word masking a word's pieces are chosen together,
skipping words that would overflow the budget, as the original does.

"modernbert", as ModernBERT's packer (`SequencePacker.mlm_masking`, itself
transformers' `DataCollatorForLanguageModeling`): each real token is chosen
independently at `masked_lm_prob`, [CLS] and [SEP] included, so a sequence's
count varies (`max_predictions` caps it: `check_length` asks for room for
five standard deviations); a random replacement is drawn from [0, the largest
id of the sequence once its [MASK]s are in] (ModernBERT draws below the
batch's, which with its tokenizer is the same range: [MASK] is its largest
id in use).

Randomness is a counter-based hash of (seed, instance key, position), so an
instance's mask depends only on its key: the same in any batch, after any
restore, and different in every epoch (the key includes the epoch's stream
position).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from bertjax import errors

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SPECIALS_RULES = ("original", "excluded")
RULES = ("bert", "modernbert")


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """How to choose and corrupt the masked positions.

  Attributes:
    masked_lm_prob: Fraction of tokens (special tokens included in the count,
      as in the original) to predict.
    max_predictions: Most predictions per sequence (static shape).
    mask_rate: Fraction of predictions replaced by [MASK].
    random_rate: Fraction replaced by a random token; the rest stay unchanged.
    whole_word: Choose all pieces of a word together.
    specials: "original": only [CLS] and [SEP] are never chosen (an [UNK] is,
      like any word) and random tokens come from the whole vocabulary, as
      `create_pretraining_data.py`; "excluded": no special token ([CLS],
      [SEP], [PAD], [MASK], [UNK]) is chosen or drawn. For the "bert" rule.
    rule: "bert" (an exact share of each sequence) or "modernbert" (each
      token independently); see the module's docstring.
  """

  masked_lm_prob: float = 0.15
  max_predictions: int = 20
  mask_rate: float = 0.8
  random_rate: float = 0.1
  whole_word: bool = False
  specials: str = "original"
  rule: str = "bert"

  def __post_init__(self):
    if not 0 < self.masked_lm_prob < 1:
      raise errors.UsageError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
    if self.max_predictions < 1:
      raise errors.UsageError(f"max_predictions must be >= 1, got {self.max_predictions}")
    if self.mask_rate < 0 or self.random_rate < 0 or self.mask_rate + self.random_rate > 1:
      raise errors.UsageError(f"mask_rate={self.mask_rate} and random_rate={self.random_rate} must "
                              "be non-negative and sum to at most 1")
    if self.specials not in SPECIALS_RULES:
      raise errors.UsageError(f"masking specials must be one of {SPECIALS_RULES}, got "
                              f"{self.specials!r}")
    if self.rule not in RULES:
      raise errors.UsageError(f"the masking rule must be one of {RULES}, got {self.rule!r}")
    if self.rule == "modernbert" and (self.whole_word or self.specials != "original"):
      raise errors.UsageError("the modernbert masking rule chooses single tokens, specials "
                              "included: it takes neither whole_word_masking nor "
                              "masking_specials='excluded'")

  def check_length(self, max_seq_length: int) -> None:
    """Fails if `max_predictions` cannot hold the masked share of a full
    sequence (with the "modernbert" rule, whose count varies, five standard
    deviations above it)."""
    mean = max_seq_length * self.masked_lm_prob
    needed = int(np.round(mean))
    if self.rule == "modernbert":
      needed = int(np.ceil(mean + 5 * np.sqrt(mean * (1 - self.masked_lm_prob))))
    if needed > self.max_predictions:
      raise errors.UsageError(
          f"max_predictions={self.max_predictions} is too small for masked_lm_prob="
          f"{self.masked_lm_prob} at max_seq_length={max_seq_length} ({needed} "
          f"predictions); set max_predictions >= {needed}")


def _mix(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def uniform(keys: np.ndarray, positions: np.ndarray, stream: int) -> np.ndarray:
  """Deterministic uniforms in [0, 1) for every (key, position), per stream."""
  with np.errstate(over="ignore"):
    x = (keys.astype(np.uint64)[:, None]
         + (positions.astype(np.uint64) + np.uint64(1)) * _GOLDEN
         + np.uint64(stream) * np.uint64(0xD1B54A32D192ED03))
    return (_mix(x) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class Masker:
  """Masks batches of token ids.

  Args:
    config: The masking rates and rule for special tokens.
    vocab_size: Random replacements are drawn from [0, vocab_size).
    special_ids: The special tokens' ids by role: "cls", "sep", "pad", "mask",
      "unk" (`Tokenizer.special_ids`).
    continuation: For whole-word masking, bool [vocab_size]: which tokens
      continue the previous word (`##x` for WordPiece, no leading `▁` for
      SentencePiece).
    seed: Mixed into every instance key.
  """

  def __init__(self, config: MaskingConfig, vocab_size: int, special_ids: Mapping[str, int],
               continuation: np.ndarray | None = None, seed: int = 0):
    if config.whole_word and continuation is None:
      raise errors.UsageError("whole-word masking needs the continuation table of the vocabulary")
    self.config = config
    self.mask_id = special_ids["mask"]
    excluded = (sorted(set(special_ids.values())) if config.specials == "excluded"
                else [special_ids["cls"], special_ids["sep"]])
    # Never chosen; with "excluded" also never drawn as a random replacement.
    self.is_special = np.zeros(vocab_size, bool)
    self.is_special[excluded] = True
    self.replacements = np.flatnonzero(
        ~self.is_special if config.specials == "excluded" else np.ones(vocab_size, bool)
    ).astype(np.int32)
    self.continuation = continuation
    self.seed = np.uint64(int(_mix(np.array([seed], np.uint64))[0]))

  def __call__(self, input_ids: np.ndarray, lengths: np.ndarray,
               keys: np.ndarray) -> dict[str, np.ndarray]:
    """Chooses and corrupts positions.

    Args:
      input_ids: int32 [batch, length], padded.
      lengths: int [batch], real tokens per row.
      keys: uint64 [batch], the instances' keys.

    Returns:
      `input_ids` (corrupted copy), and [batch, max_predictions]
      `masked_positions` (int32, ascending, 0-padded), `masked_ids` (the
      original ids) and `masked_weights` (float32, 1 for real predictions).
    """
    config = self.config
    batch, length = input_ids.shape
    keys = np.asarray(keys, np.uint64) ^ self.seed
    positions = np.arange(length)
    real = positions[None, :] < np.asarray(lengths)[:, None]
    priority = uniform(keys, positions, 1)
    if config.rule == "modernbert":  # each real token at the rate; the first draws kept
      candidates = real & (priority < config.masked_lm_prob)
      budget = np.minimum(candidates.sum(1), config.max_predictions)
    else:
      candidates = real & ~self.is_special[input_ids]
      budget = np.maximum(1, np.round(np.asarray(lengths) * config.masked_lm_prob)).astype(int)
      budget = np.minimum(np.minimum(budget, config.max_predictions), candidates.sum(1))

    if config.whole_word:
      chosen = self._whole_words(input_ids, candidates, priority, budget)
    else:
      priority = np.where(candidates, priority, 2.0)
      order = np.argsort(priority, axis=1, kind="stable")[:, :config.max_predictions]
      keep = np.arange(order.shape[1])[None, :] < budget[:, None]
      chosen = np.where(keep, order, length)
    chosen = np.sort(chosen, axis=1)  # ascending, padding (= length) last
    if chosen.shape[1] < config.max_predictions:
      chosen = np.pad(chosen, [(0, 0), (0, config.max_predictions - chosen.shape[1])],
                      constant_values=length)
    weights = chosen < length
    masked_positions = np.where(weights, chosen, 0).astype(np.int32)
    rows = np.arange(batch)[:, None]
    masked_ids = np.where(weights, input_ids[rows, masked_positions], 0).astype(np.int32)

    action = uniform(keys, masked_positions, 2)
    draw = uniform(keys, masked_positions, 3)
    masks = weights & (action < config.mask_rate)
    if config.rule == "modernbert":  # below the sequence's largest id, [MASK]s in
      largest = np.maximum(np.where(real, input_ids, 0).max(1),
                           np.where(masks.any(1), self.mask_id, 0))
      random_ids = (draw * (largest[:, None] + 1)).astype(np.int32)
    else:
      random_ids = self.replacements[(draw * len(self.replacements)).astype(np.int64)]
    new_ids = np.where(masks, self.mask_id,
                       np.where(action < config.mask_rate + config.random_rate,
                                random_ids, masked_ids))
    corrupted = input_ids.copy()
    rows_b, cols_b = np.nonzero(weights)
    corrupted[rows_b, masked_positions[rows_b, cols_b]] = new_ids[rows_b, cols_b]
    return {"input_ids": corrupted, "masked_positions": masked_positions,
            "masked_ids": masked_ids, "masked_weights": weights.astype(np.float32)}

  def _whole_words(self, input_ids: np.ndarray, candidates: np.ndarray,
                   priority: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Positions of whole words chosen greedily in random order, per row."""
    length = input_ids.shape[1]
    starts = candidates & ~(self.continuation[input_ids] & np.roll(candidates, 1, axis=1))
    starts[:, 0] = candidates[:, 0]
    chosen = np.full((input_ids.shape[0], self.config.max_predictions), length)
    for row in range(input_ids.shape[0]):
      word_starts = np.flatnonzero(starts[row])
      if not len(word_starts):
        continue
      # A word runs from its start to the next start or the next non-candidate.
      ends = np.append(word_starts[1:], length)
      stop = np.flatnonzero(~candidates[row])
      taken = []
      for start in word_starts[np.argsort(priority[row, word_starts], kind="stable")]:
        end = ends[np.searchsorted(word_starts, start)]
        after = stop[np.searchsorted(stop, start):]
        if len(after):
          end = min(end, after[0])
        if len(taken) + end - start > budget[row]:
          continue
        taken.extend(range(start, end))
        if len(taken) == budget[row]:
          break
      chosen[row, :len(taken)] = taken
    return chosen


def continuation_table(tokens: list[str], kind: str) -> np.ndarray:
  """Which vocabulary entries continue a word: `##x` (WordPiece) or pieces
  without the `▁` word-start mark (SentencePiece)."""
  if kind == "wordpiece":
    return np.array([t.startswith("##") for t in tokens], bool)
  return np.array([not t.startswith("\u2581") for t in tokens], bool)
