"""The feature-based approach: stored activations are the encoder's, and a
BiLSTM on frozen features learns a small NER task."""

import json
import os

import numpy as np
import pytest

from tests.tasks.finetuning import set_fields
from tests.tasks.test_ner import write_conll


@pytest.fixture(scope="module")
def four_layer_checkpoint(tmp_path_factory):
  from tests import reference

  return reference.write_tiny_checkpoint(tmp_path_factory.mktemp("hf4"), num_layers=4)


def _config(variant, checkpoint, data, **changes):
  from bertjax.configs import ner_features

  config = ner_features.get_config(variant)
  return set_fields(config, {"init_checkpoint": checkpoint, "data.dir": data,
                             "max_seq_length": 32, "extract_batch_size": 16,
                             "lstm.hidden_size": 16, "train.epochs": 8.0,
                             "train.learning_rate": 1e-2, "log_every_steps": 10, **changes})


def test_layer_choices():
  from bertjax.tasks import features

  assert features.layer_indices("embeddings", 12) == [0]
  assert features.layer_indices("second_to_last", 12) == [11]
  assert features.layer_indices("concat_last_four", 12) == [9, 10, 11, 12]
  assert features.layer_indices("weighted_sum_all", 12) == list(range(1, 13))
  with pytest.raises(ValueError, match="needs 4 layers; the model has 2"):
    features.layer_indices("concat_last_four", 2)


def test_stored_activations_are_the_encoders(four_layer_checkpoint, tmp_path):
  import bertjax
  from bertjax.data import conll
  from bertjax.tasks import features

  path = tmp_path / "eng.train"
  path.write_text("hello NN I-NP I-PER\nresumed VB I-VP O\nthe DT I-NP O\n\n"
                  "world NN I-NP I-LOC\n\n")
  sentences = conll.read_conll(str(path))
  bundle = bertjax.load_pretrained(four_layer_checkpoint)
  rows = conll.featurize(sentences, bundle.tokenizer, ["O", "I-LOC", "I-PER"], 16,
                         document_context=False)
  out = str(tmp_path / "train.npy")
  features.extract_features(bundle, rows, sentences, [0, 2, 4], out, batch_size=4)
  stored = np.load(out)
  assert stored.shape == (4, 3, 32) and stored.dtype == np.float16
  encoded = bertjax.encode(bundle, ["hello resumed the"])
  pieces = bundle.tokenizer.tokenize("hello resumed the")  # hello resume ##d the
  first_pieces = [1, 2, 4]  # after [CLS]
  assert pieces[1:3] == ["resume", "##d"]
  for layer_index, layer in enumerate([0, 2, 4]):
    expected = encoded["hidden_states"][layer, 0, first_pieces]
    np.testing.assert_allclose(stored[:3, layer_index].astype(np.float32), expected,
                               atol=2e-2, rtol=1e-2)
  assert np.load(str(tmp_path / "train.offsets.npy")).tolist() == [0, 3, 4]


def test_bilstm_on_frozen_features_learns_ner_and_reuses_its_features(
    four_layer_checkpoint, tmp_path, caplog):
  from bertjax.tasks import features

  data = tmp_path / "conll"
  data.mkdir()
  write_conll(data / "eng.train", 200, 0)
  write_conll(data / "eng.testa", 40, 1)
  write_conll(data / "eng.testb", 40, 2)
  workdir = str(tmp_path / "run")
  results = features.run(_config("concat_last_four", four_layer_checkpoint, str(data)), workdir)
  assert results["layers"] == [1, 2, 3, 4]
  assert results["dev"]["f1"] > 90.0 and results["test"]["f1"] > 90.0, results
  assert os.path.isfile(os.path.join(workdir, "features", "train.npy"))
  saved = json.load(open(os.path.join(workdir, "results.json")))
  assert saved["variant"] == "concat_last_four"
  # A second run with the same checkpoint and layers reads the stored features.
  with caplog.at_level("INFO"):
    again = features.run(_config("concat_last_four", four_layer_checkpoint, str(data),
                                 **{"train.epochs": 1.0}), workdir)
  assert "Extracting" not in caplog.text
  assert again["epochs"][0]["step"] == 200 // 32
