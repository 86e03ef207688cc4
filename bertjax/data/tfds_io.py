"""Opening prepared TFDS datasets for random access, never downloading."""

from __future__ import annotations

from typing import Any

from bertjax import errors


def open_source(name: str, split: str, data_dir: str | None = None) -> Any:
  """`tfds.data_source` of a dataset prepared beforehand in the array_record format.

  Raises:
    FileNotFoundError: if the dataset is not prepared in `data_dir` (TFDS
      would otherwise try to download it).
    ValueError: for an unknown dataset or split.
  """
  import tensorflow_datasets as tfds

  builder = tfds.builder(name, data_dir=data_dir)  # a ValueError if TFDS does not know it
  if not builder.is_prepared():
    raise errors.MissingFileError(
        f"TFDS {name} is not prepared in {data_dir or 'the default data_dir'}: prepare it "
        f"first (with TensorFlow installed): python -c \"import tensorflow_datasets as tfds; "
        f"tfds.builder('{name}', data_dir={data_dir!r}, file_format='array_record')"
        f".download_and_prepare()\"")
  if split not in builder.info.splits:
    raise errors.UsageError(f"TFDS {name} has no split {split!r}; it has "
                            f"{', '.join(builder.info.splits)}")
  return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
