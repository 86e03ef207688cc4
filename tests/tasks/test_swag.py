"""SWAG fine-tuning end to end on a small learnable file in SWAG's format."""

import json
import os

import numpy as np

from tests.tasks.finetuning import tiny_config

FILLER = "the quick brown fox jump over lazy world test".split()
HEADER = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"


def write_swag(path, count, seed, labelled=True):
  """The right ending holds "hello", the others "dog"."""
  rng = np.random.default_rng(seed)
  lines = [HEADER + (",label" if labelled else "")]
  for i in range(count):
    label = int(rng.integers(0, 4))
    endings = [" ".join(list(rng.choice(FILLER, 3)) + ["hello" if j == label else "dog"])
               for j in range(4)]
    context = " ".join(rng.choice(FILLER, 5))
    row = [f"v{i}", str(i), context, context, "it", "gold", *endings]
    lines.append(",".join(row + ([str(label)] if labelled else [])))
  path.write_text("\n".join(lines) + "\n")


def write_swag_dir(directory):
  """SWAG's train, val and (unlabelled) test files, learnable as `write_swag`'s."""
  directory.mkdir()
  write_swag(directory / "train.csv", 320, 0)
  write_swag(directory / "val.csv", 80, 1)
  write_swag(directory / "test.csv", 12, 2, labelled=False)
  return directory


def test_swag_fine_tunes_to_high_accuracy(tiny_hf_checkpoint, tmp_path):
  from bertjax.configs import swag as swag_config
  from bertjax.tasks import swag

  data = write_swag_dir(tmp_path / "swag")
  config = tiny_config(swag_config.get_config(), tiny_hf_checkpoint, 24,
                       # At 2e-3, one random start in twelve collapsed to chance
                       # after fitting (the divergence guard stopped it).
                       **{"data.dir": str(data), "train.batch_size": 16,
                          "train.learning_rate": 1e-3})
  workdir = str(tmp_path / "run")
  results = swag.run(config, workdir)
  assert results["dev"]["accuracy"] > 90.0, results
  assert len(results["epochs"]) == 6
  rows = open(os.path.join(workdir, "test_predictions.csv")).read().splitlines()
  assert rows[0] == "index,prediction" and len(rows) == 13
  saved = json.load(open(os.path.join(workdir, "results.json")))
  assert saved["dev"] == results["dev"]
  # Dev's gold endings beside the predictions, and the share of the commonest.
  gold = [line.rsplit(",", 1)[1] for line in (data / "val.csv").read_text().splitlines()[1:]]
  rows = open(os.path.join(workdir, "val_predictions.csv")).read().splitlines()
  assert rows[0] == "index,prediction,label" and [r.split(",")[2] for r in rows[1:]] == gold
  commonest = max(sorted(set(gold)), key=gold.count)
  assert saved["baseline"] == {"dev": {"always": commonest,
                                       "accuracy": 100.0 * gold.count(commonest) / len(gold)}}
