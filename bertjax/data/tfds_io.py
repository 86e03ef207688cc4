"""Opening prepared TFDS datasets for random access, never downloading."""

from __future__ import annotations

from typing import Any


def open_source(name: str, split: str, data_dir: str | None = None) -> Any:
  """`tfds.data_source` of a dataset prepared beforehand (`tfds build`).

  Raises:
    FileNotFoundError: if the dataset is not prepared in `data_dir` (TFDS
      would otherwise try to download it).
    ValueError: for an unknown dataset or split.
  """
  import tensorflow_datasets as tfds

  builder = tfds.builder(name, data_dir=data_dir)  # a ValueError if TFDS does not know it
  if not builder.is_prepared():
    raise FileNotFoundError(
        f"TFDS {name} is not prepared in {data_dir or 'the default data_dir'}: prepare it "
        f"first, e.g. tfds build {name} --file_format=array_record"
        + (f" --data_dir={data_dir}" if data_dir else ""))
  if split not in builder.info.splits:
    raise ValueError(f"TFDS {name} has no split {split!r}; it has "
                     f"{', '.join(builder.info.splits)}")
  return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
