"""Several fine-tuning examples in one row, so that a step computes little padding.

A GLUE sentence (pair) fills a fraction of a 128-token row. Packed, a row holds
as many examples as fit, one after another: `segment_ids` 1, 2, ... keep each
from attending to the others, positions restart at each example's [CLS]
(`bertjax.models.encoder` derives them from the segment ids), token types are
each example's own. Each example keeps its own prediction: classification and
regression pool its [CLS] (`pool_positions`, one slot a row for each example;
a causal model's last token), token classification labels its tokens where
they now lie, and multiple choice packs each choice's sequence and gathers
their scores back into [examples, choices]. The batch stays the recipe's
batch in examples; only the rows it takes change, and the run keeps one row
count for every step (a static shape), the most any of its batches needs.

The encoder computes the same function of each example packed or not: a
sequence attends to its own tokens only, with its own positions and types, so
losses, gradients and predictions are those of the unpacked rows up to float
rounding (and the dropout masks drawn).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from bertjax import errors

Features = dict[str, np.ndarray]

# How each kind of output layer reads a packed row (`bertjax.tasks.finetune.KINDS`).
POOLED_KINDS = ("classification", "regression")  # one prediction per example's [CLS]
TOKEN_KINDS = ("token",)                           # one prediction per token
CHOICE_KINDS = ("multiple_choice",)                # one score per choice's [CLS]
KINDS = POOLED_KINDS + TOKEN_KINDS + CHOICE_KINDS


@dataclasses.dataclass(frozen=True)
class RowShape:
  """The packed batch's static shape: `rows` of the tokens, `slots` sequences a row."""

  rows: int
  slots: int


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where each sequence of a batch went (an example's, or each of its
  choices', example-major): its row, slot and first position."""

  row: np.ndarray     # int [sequences]
  slot: np.ndarray    # int [sequences]
  offset: np.ndarray  # int [sequences]
  length: np.ndarray  # int [sequences]: its tokens


def lengths_of(features: Features) -> np.ndarray:
  """The tokens of each example's sequence (padding at the end of its row):
  [examples], or [examples, choices] for multiple choice."""
  return features["attention_mask"].sum(axis=-1).astype(np.int64)


def first_fit(lengths: np.ndarray, capacity: int) -> list[list[int]]:
  """Example indices of each row: longest first, each into the first row with
  room (first-fit decreasing). Deterministic: ties keep the examples' order.

  Raises:
    ValueError: an example is longer than a row.
  """
  if len(lengths) and int(lengths.max()) > capacity:
    raise ValueError(f"an example of {int(lengths.max())} tokens does not fit rows of {capacity}")
  rows: list[list[int]] = []
  room: list[int] = []
  for index in np.argsort(-lengths, kind="stable"):
    size = int(lengths[index])
    for row, left in enumerate(room):
      if size <= left:
        rows[row].append(int(index))
        room[row] -= size
        break
    else:
      rows.append([int(index)])
      room.append(capacity - size)
  return rows


def row_shape(batches: Iterable[np.ndarray], capacity: int, multiple: int = 1) -> RowShape:
  """The shape that holds every batch: the most rows any batch packs into
  (rounded up to `multiple`, the data shards) and the most sequences a row holds.

  Args:
    batches: The lengths of each batch's examples.
    capacity: Tokens a row.
    multiple: Rows must divide over this many data shards (and processes).
  """
  rows = slots = 1
  for lengths in batches:
    packed = first_fit(np.ravel(lengths), capacity)  # each choice a sequence of its own
    rows = max(rows, len(packed))
    slots = max(slots, max((len(row) for row in packed), default=1))
  return RowShape(-(-rows // multiple) * multiple, slots)


def pack(features: Features, kind: str, shape: RowShape, pool_last: bool = False,
         examples: int | None = None) -> tuple[Features, Placement]:
  """One batch of examples (`finetune` features, padded rows) packed into
  `shape.rows` rows of the same length.

  Args:
    features: `input_ids`, `attention_mask`, `token_type_ids` [examples, length],
      `weights` [examples] and the labels of `kind`: `labels` [examples] for the
      pooled kinds; `labels` and `label_weights` [examples, length] for tokens.
    kind: One of `KINDS`.
    shape: Rows and slots (`row_shape`); the batch must fit them.
    pool_last: Pool each example's last token instead of its [CLS]: what a
      causal model's summary is (`bertjax.models.encoder.pool`).
    examples: Multiple choice: pad the examples' arrays to this many (weight
      0), so that they divide over the data shards as the rows do.

  Returns:
    The packed batch: `input_ids`, `token_type_ids`, `segment_ids` [rows,
    length]; pooled kinds add `pool_positions`, `labels`, `weights` [rows,
    slots] (weight 0 in empty slots); tokens add `labels`, `label_weights`
    [rows, length] (an example's weight folded into its tokens') and `weights`
    [rows]; multiple choice packs each choice as a sequence and adds
    `pool_positions` [rows, slots] and `choice_slots` [examples, choices] (each
    choice's slot among the rows' slots, row-major), with `labels` and
    `weights` [examples]. And where each sequence went, to read predictions
    back (`unpack`).
  """
  if kind not in KINDS:
    raise errors.UsageError(f"examples of kind {kind!r} cannot be packed; packing serves {KINDS}")
  length = features["input_ids"].shape[-1]
  if kind in CHOICE_KINDS:  # each choice a sequence of its own, example-major
    count, choices = features["input_ids"].shape[:2]
    sequences = {name: features[name].reshape(count * choices, length)
                 for name in ("input_ids", "token_type_ids")}
  else:
    sequences = features
  lengths = np.ravel(lengths_of(features))
  packed_rows = first_fit(lengths, length)
  if len(packed_rows) > shape.rows or max(map(len, packed_rows), default=0) > shape.slots:
    raise ValueError(f"the batch packs into {len(packed_rows)} rows of up to "
                     f"{max(map(len, packed_rows))} examples, beyond {shape}")
  tokens = (shape.rows, length)
  out = {name: np.zeros(tokens, features[name].dtype) for name in ("input_ids", "token_type_ids")}
  out["segment_ids"] = np.zeros(tokens, np.int32)
  if kind in POOLED_KINDS + CHOICE_KINDS:
    out["pool_positions"] = np.zeros((shape.rows, shape.slots), np.int32)
  if kind in CHOICE_KINDS:
    padded = max(examples or count, count)
    out["choice_slots"] = np.zeros((padded, choices), np.int32)
    out["labels"] = np.zeros(padded, features["labels"].dtype)
    out["weights"] = np.zeros(padded, np.float32)
    out["labels"][:count], out["weights"][:count] = features["labels"], features["weights"]
  elif kind in POOLED_KINDS:
    slots = (shape.rows, shape.slots)
    out["labels"] = np.zeros(slots, features["labels"].dtype)
    out["weights"] = np.zeros(slots, np.float32)
  else:
    out["labels"] = np.zeros(tokens, features["labels"].dtype)
    out["label_weights"] = np.zeros(tokens, np.float32)
    out["weights"] = np.zeros(shape.rows, np.float32)
  placed = len(lengths)  # sequences: an example's, or each of its choices'
  where = Placement(np.zeros(placed, np.int64), np.zeros(placed, np.int64),
                    np.zeros(placed, np.int64), lengths)
  for row, members in enumerate(packed_rows):
    offset = 0
    for slot, example in enumerate(members):
      size = int(lengths[example])
      span = slice(offset, offset + size)
      for name in ("input_ids", "token_type_ids"):
        out[name][row, span] = sequences[name][example, :size]
      out["segment_ids"][row, span] = slot + 1
      if "pool_positions" in out:
        out["pool_positions"][row, slot] = offset + size - 1 if pool_last else offset
      if kind in CHOICE_KINDS:  # `example` counts sequences here
        out["choice_slots"][example // choices, example % choices] = row * shape.slots + slot
      elif kind in POOLED_KINDS:
        out["labels"][row, slot] = features["labels"][example]
        out["weights"][row, slot] = features["weights"][example]
      else:
        out["labels"][row, span] = features["labels"][example, :size]
        out["label_weights"][row, span] = (features["label_weights"][example, :size]
                                           * features["weights"][example])
        out["weights"][row] = 1.0
      where.row[example], where.slot[example], where.offset[example] = row, slot, offset
      offset += size
  return out, where


def unpack(outputs: dict[str, np.ndarray], kind: str, where: Placement,
           length: int) -> dict[str, np.ndarray]:
  """A packed batch's outputs in the examples' order and unpacked layout:
  pooled kinds' [rows, slots, ...] to [examples, ...]; tokens' [rows, length,
  ...] to [examples, length, ...], zero past each example's tokens; multiple
  choice's [examples, choices] as they are (the model gathered them; with the
  examples `pack` added to fill the batch at the end)."""
  if kind in CHOICE_KINDS:
    return outputs
  if kind in POOLED_KINDS:
    return {name: value[where.row, where.slot] for name, value in outputs.items()}
  result = {}
  for name, value in outputs.items():
    rows = np.zeros((len(where.row), length, *value.shape[2:]), value.dtype)
    for example, (row, offset, size) in enumerate(zip(where.row, where.offset, where.length)):
      rows[example, :size] = value[row, offset:offset + size]
    result[name] = rows
  return result
