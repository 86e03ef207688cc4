"""Small TFDS datasets with the feature layouts of real ones, built offline."""


def prepare(name: str, features: dict, splits: dict, data_dir: str) -> None:
  """Builds dataset `name` (CamelCase; TFDS registers it in snake_case) with
  `features` and {split: [records]} into `data_dir` as array_record."""
  import tensorflow_datasets as tfds

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

  def _split_generators(self, dl_manager):
    return {split: self._generate_examples(rows) for split, rows in splits.items()}

  def _generate_examples(self, rows):
    for index, row in enumerate(rows):
      yield index, row

  # The class name is the dataset's name (registered when the class is made).
  builder = type(name, (tfds.core.GeneratorBasedBuilder,), {
      "VERSION": tfds.core.Version("1.0.0"), "_info": _info,
      "_split_generators": _split_generators, "_generate_examples": _generate_examples})
  builder(data_dir=data_dir, file_format="array_record").download_and_prepare()
