"""CoNLL-2003 NER fine-tuning end to end on small learnable files in the
shared task's format."""

import json
import os

import numpy as np

from tests.tasks.finetuning import tiny_config

FILLER = "the quick brown fox jump over lazy test".split()


def write_conll(path, sentences, seed):
  """"hello" is a person (I-PER, IOB1 as distributed), "world" a location."""
  rng = np.random.default_rng(seed)
  lines = []
  for index in range(sentences):
    if index % 5 == 0:
      lines += ["-DOCSTART- -X- -X- O", ""]
    for _ in range(rng.integers(3, 10)):
      word = str(rng.choice(FILLER + ["hello", "world"]))
      tag = {"hello": "I-PER", "world": "I-LOC"}.get(word, "O")
      lines.append(f"{word} NN I-NP {tag}")
    lines.append("")
  path.write_text("\n".join(lines) + "\n")


def write_conll_dir(directory):
  """CoNLL-2003's three files, learnable as `write_conll`'s."""
  directory.mkdir()
  write_conll(directory / "eng.train", 300, 0)
  write_conll(directory / "eng.testa", 60, 1)
  write_conll(directory / "eng.testb", 60, 2)
  return directory


def test_ner_fine_tunes_to_high_entity_f1(tiny_hf_checkpoint, tmp_path):
  from bertjax.configs import ner as ner_config
  from bertjax.tasks import ner

  data = write_conll_dir(tmp_path / "conll")
  config = tiny_config(ner_config.get_config(), tiny_hf_checkpoint, 32,
                       **{"data.dir": str(data)})
  workdir = str(tmp_path / "run")
  results = ner.run(config, workdir)
  assert results["labels"] == ["O", "I-LOC", "I-PER"]
  assert results["dev"]["f1"] > 90.0 and results["test"]["f1"] > 90.0, results
  assert set(results["test"]["by_type"]) == {"LOC", "PER"}
  lines = open(os.path.join(workdir, "test_predictions.txt")).read().splitlines()
  assert lines[0].count(" ") == 2  # word gold predicted
  saved = json.load(open(os.path.join(workdir, "results.json")))
  assert saved["test"]["f1"] == results["test"]["f1"]
