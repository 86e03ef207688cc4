"""Opening prepared TFDS datasets: never downloading, and saying how to prepare."""

import pytest

from bertjax.data import tfds_io
from tests import tfds_builders


def test_an_unprepared_dataset_is_an_error_that_says_how_to_prepare_it(tmp_path):
  data_dir = str(tmp_path / "tfds")
  with pytest.raises(FileNotFoundError) as error:
    tfds_io.open_source("glue/mrpc", "train", data_dir)
  message = str(error.value)
  assert "glue/mrpc is not prepared in" in message
  # The command in the message is the one that prepares it as bertjax reads it.
  assert (f"tfds.builder('glue/mrpc', data_dir='{data_dir}', file_format='array_record')"
          ".download_and_prepare()") in message
  assert not (tmp_path / "tfds").exists()  # nothing was downloaded or written


def test_a_prepared_dataset_opens_and_an_unknown_split_is_named(tmp_path):
  import tensorflow_datasets as tfds

  data_dir = str(tmp_path / "tfds")
  tfds_builders.prepare("TfdsIoTiny", {"text": tfds.features.Text()},
                        {"train": [{"text": "a"}, {"text": "b"}]}, data_dir)
  source = tfds_io.open_source("tfds_io_tiny", "train", data_dir)
  assert sorted(row["text"].decode() for row in source) == ["a", "b"]
  with pytest.raises(ValueError, match="has no split 'test'; it has train"):
    tfds_io.open_source("tfds_io_tiny", "test", data_dir)
