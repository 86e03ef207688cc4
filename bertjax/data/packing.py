"""Several sequences in one row, so that no compute is spent on padding.

As in "Efficient Sequence Packing without Cross-contamination" (Krell et al.,
2021), which MLPerf's BERT submissions use: the sequences of a window of the
stream are packed into rows of `max_seq_length` tokens, at most
`max_sequences` a row, by best-fit decreasing (each sequence, longest first,
into the open row it fills best). In a row, every sequence keeps what it had
alone: its tokens and token types, positions counted from 0, its masked-LM
targets (masked before packing, by its own key, so its mask is the same
packed or not), its next-sentence label and [CLS]; segment ids (1, 2, ...; 0
for the padding after them) keep sequences from attending to one another
(`bertjax.models.attention`). A row never holds more masked positions than
`max_predictions`.

Rows come out of a window in a seeded random order; the stage restores
exactly like the others (`bertjax.data.windows`).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Callable, Sequence

import grain
import numpy as np

from bertjax import errors
from bertjax.data import windows

Batch = dict[str, np.ndarray]  # a batch of named arrays, [batch, ...] each

# Tokens of the shortest sequence a row can take: [CLS] x [SEP].
_MIN_SEQUENCE = 3
# Tags the random stream of each window's row order.
_ROW_ORDER = 1


@dataclasses.dataclass(frozen=True)
class Example:
  """One sequence, ready for a row.

  Attributes:
    token_ids: int32 [n], the masked-LM corruption applied.
    num_first: Tokens of `[CLS] A [SEP]` (token type 0); the rest are type 1.
    next_sentence_label: 0 (B follows A), 1 (random B) or -1 (no NSP).
    masked_positions: int32 [p], ascending positions in the sequence.
    masked_ids: int32 [p], the original tokens there.
  """

  token_ids: np.ndarray
  num_first: int
  next_sentence_label: int
  masked_positions: np.ndarray
  masked_ids: np.ndarray


def pack(lengths: Sequence[int], predictions: Sequence[int], max_length: int,
         max_sequences: int, max_predictions: int) -> list[list[int]]:
  """Best-fit decreasing: groups of indices whose lengths fit a row.

  Each sequence, longest first (ties in order), goes into the open row with
  the least room that still holds it, its predictions and one more sequence;
  otherwise it opens a row.

  Args:
    lengths: Tokens of each sequence.
    predictions: Masked positions of each sequence.
    max_length: Tokens of a row.
    max_sequences: Sequences a row may hold.
    max_predictions: Masked positions a row may hold.

  Returns:
    The rows, each the indices of its sequences (in the order placed).
  """
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  rows: list[list[int]] = []
  room: list[int] = []        # tokens left, per row
  predictions_left: list[int] = []
  open_rows: list[tuple[int, int]] = []  # (tokens left, row), sorted
  for i in order:
    length, wanted = int(lengths[i]), int(predictions[i])
    if length > max_length or wanted > max_predictions:
      raise errors.UsageError(
          f"a sequence of {length} tokens and {wanted} predictions does not fit "
          f"a row of {max_length} tokens and {max_predictions} predictions")
    place = bisect.bisect_left(open_rows, (length, -1))
    while place < len(open_rows) and predictions_left[open_rows[place][1]] < wanted:
      place += 1
    if place < len(open_rows):
      row = open_rows.pop(place)[1]
    else:
      row = len(rows)
      rows.append([])
      room.append(max_length)
      predictions_left.append(max_predictions)
    rows[row].append(i)
    room[row] -= length
    predictions_left[row] -= wanted
    if len(rows[row]) < max_sequences and room[row] >= _MIN_SEQUENCE:
      bisect.insort(open_rows, (room[row], row))
  return rows


class PackedRows(windows.WindowStage):
  """Sequences -> rows (lists of `Example`s), a window at a time.

  Args:
    parent: Yields what `prepare` takes (instances, or statically masked records).
    prepare: A window's elements -> their `Example`s (masking them all at once).
    max_length, max_sequences, max_predictions: A row's limits.
    window_size: Sequences packed together (more: fuller rows).
    seed: Orders each window's rows.
  """

  def __init__(self, parent: grain.IterDataset, prepare: Callable[[list[Any]], list[Example]],
               max_length: int, max_sequences: int, max_predictions: int, window_size: int,
               seed: int):
    self.prepare, self.seed = prepare, seed
    self.max_length, self.max_sequences = max_length, max_sequences
    self.max_predictions = max_predictions
    super().__init__(parent, window_size, self._pack)

  def _pack(self, window: list[Any], window_index: int) -> list[list[Example]]:
    examples = self.prepare(window)
    rows = pack([len(e.token_ids) for e in examples],
                [len(e.masked_positions) for e in examples], self.max_length,
                self.max_sequences, self.max_predictions)
    # Its own stream: the window shuffle draws [seed, window_index].
    order = np.random.default_rng([self.seed, _ROW_ORDER, window_index]).permutation(len(rows))
    return [[examples[i] for i in rows[r]] for r in order]


class Collate:
  """Rows of `Example`s -> a batch of packed rows (static shapes).

  Fields: `input_ids`, `token_type_ids`, `segment_ids` (1.. per sequence, 0
  padding), `position_ids` (from 0 in each sequence), all [batch, length];
  masked-LM targets `masked_positions` / `masked_ids` / `masked_weights`
  [batch, max_predictions] (row positions, ascending); with NSP
  `next_sentence_labels`, `nsp_positions` (each pair's [CLS]) and
  `nsp_weights`, [batch, max_sequences]; left-to-right, `lm_labels` and
  `lm_weights` [batch, length] (each sequence's next token).
  """

  def __init__(self, objective: str, max_length: int, max_sequences: int,
               max_predictions: int, pad_id: int):
    self.objective, self.pad_id = objective, pad_id
    self.length, self.sequences, self.predictions = max_length, max_sequences, max_predictions

  def __call__(self, rows: list[list[Example]]) -> Batch:
    size, length = len(rows), self.length
    batch = {"input_ids": np.full((size, length), self.pad_id, np.int32),
             "token_type_ids": np.zeros((size, length), np.int32),
             "segment_ids": np.zeros((size, length), np.int32),
             "position_ids": np.zeros((size, length), np.int32)}
    if self.objective == "ltr":
      batch["lm_labels"] = np.zeros((size, length), np.int32)
      batch["lm_weights"] = np.zeros((size, length), np.float32)
    else:
      for name, dtype in (("masked_positions", np.int32), ("masked_ids", np.int32),
                          ("masked_weights", np.float32)):
        batch[name] = np.zeros((size, self.predictions), dtype)
    if self.objective == "mlm_nsp":
      batch["next_sentence_labels"] = np.zeros((size, self.sequences), np.int32)
      batch["nsp_positions"] = np.zeros((size, self.sequences), np.int32)
      batch["nsp_weights"] = np.zeros((size, self.sequences), np.float32)
    for r, row in enumerate(rows):  # r: the row's index in the batch
      start, predicted = 0, 0
      for slot, example in enumerate(row):
        end = start + len(example.token_ids)
        batch["input_ids"][r, start:end] = example.token_ids
        batch["token_type_ids"][r, start + example.num_first:end] = 1
        batch["segment_ids"][r, start:end] = slot + 1
        batch["position_ids"][r, start:end] = np.arange(end - start)
        if self.objective == "ltr":
          batch["lm_labels"][r, start:end - 1] = example.token_ids[1:]
          batch["lm_weights"][r, start:end - 1] = 1
        else:
          taken = slice(predicted, predicted + len(example.masked_positions))
          batch["masked_positions"][r, taken] = example.masked_positions + start
          batch["masked_ids"][r, taken] = example.masked_ids
          batch["masked_weights"][r, taken] = 1
          predicted = taken.stop
        if self.objective == "mlm_nsp":
          batch["next_sentence_labels"][r, slot] = example.next_sentence_label
          batch["nsp_positions"][r, slot] = start
          batch["nsp_weights"][r, slot] = 1
        start = end
    return batch


def padding_share(batch: Batch) -> float:
  """The share of a batch's token slots that are padding."""
  ids = batch["segment_ids"] if "segment_ids" in batch else batch["attention_mask"]
  return float(np.mean(ids == 0))
