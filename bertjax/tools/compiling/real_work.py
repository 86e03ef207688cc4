"""The useful work of the rows a run would train on, for the FLOPs of its real tokens.

A run's rows are partly padding; `--padding` gives its share (rows of one
sequence each), `--data_dir` measures it on a prepared dataset through the
run's own loader, counted as the trainer counts a step's work
(`bertjax.train.batch_work`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax import errors, flops, train
from bertjax import phases as phase_lib
from bertjax.data import loader, packing, shards
from bertjax.models import EncoderConfig, family
from bertjax.tasks import pretrain_data


def local_window(config, phase) -> int | None:
  """The window (keys either side) a phase's local layers attend, None where
  every layer attends the whole sequence (BERT)."""
  bert = phase.model(EncoderConfig.from_run_config(config))
  return family.of(bert).local_window(bert)


@dataclasses.dataclass
class RealWork:
  """The useful work of a row of each phase (by `Phase.index`), for the FLOPs
  of the real tokens: `bertjax.train.batch_work`'s counts a row, the share of
  padding slots, and where they come from."""

  per_row: dict[int, dict[str, float]]
  source: str

  @classmethod
  def given(cls, config, padding: float) -> RealWork:
    """Rows of one sequence each, `padding` of their slots empty."""
    if config.data.max_sequences_per_row > 1:
      raise errors.UsageError(
          f"--padding takes rows of one sequence each; data.max_sequences_per_row="
          f"{config.data.max_sequences_per_row} packs several: measure them with --data_dir")
    per_row = {}
    for phase in phase_lib.phases(config):
      row = flops.row_work(config.objective, (1 - padding) * phase.max_seq_length,
                           phase.max_predictions, config.data.masked_lm_prob,
                           local_window(config, phase))
      per_row[phase.index] = {**row, "padding": padding}
    return cls(per_row, f"given: {padding:g} of the token slots are padding, one sequence a row")

  @classmethod
  def measured(cls, config, data_dir: str, batches: int, rows: int = 64) -> RealWork:
    """What the run's loader makes of a prepared dataset: `batches` batches of
    `rows` rows at each phase's length (masked afresh, as a run without
    `data.static` does).

    Raises:
      errors.Error: the dataset is missing, unfinished or of a larger
        vocabulary than the model's.
    """
    if batches < 1:
      raise errors.UsageError(f"--data_batches={batches}: read 1 or more batches")
    shards.complete_shards(data_dir)  # names what is missing
    local = shards.reading_directory(data_dir, config.data.read_mode)  # streamed on gs://
    pretrain_data.check_vocabulary(config, local)
    per_row = {}
    for phase in phase_lib.phases(config):
      settings = dataclasses.replace(
          pretrain_data.loader_config(config, local, phase, "train", rows), static=False,
          shuffle_window=min(config.data.shuffle_window, 4 * rows))
      iterator = iter(loader.make_dataset(settings))
      sums: dict[str, float] = {}
      for _ in range(batches):
        batch = next(iterator)
        work = train.batch_work(batch, config.objective, local_window(config, phase))
        work["padding"] = packing.padding_share(batch)
        for name, value in work.items():
          sums[name] = sums.get(name, 0.0) + float(np.asarray(value))
      per_row[phase.index] = {name: value / (batches if name == "padding" else batches * rows)
                              for name, value in sums.items()}
    return cls(per_row, f"measured: {batches} batches of {rows} rows of {data_dir}")
