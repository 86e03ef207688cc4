"""SWAG fine-tuning: four [CLS] context [SEP] ending [SEP] sequences, one
vector scoring each [CLS], a softmax over the choices (the paper's section 4.4).

  python -m bertjax.main --config=configs/swag.py --workdir=/tmp/swag \
      --config.init_checkpoint=uncased_L-24_H-1024_A-16 --config.data.dir=swagaf/data

Reads `train.csv` and `val.csv` (and predicts `test.csv` if present) from
`data.dir`; writes `results.json` (dev accuracy after every epoch, and the
baseline: always guessing dev's commonest right ending), `val_predictions.csv`
(`index,prediction,label`), `test_predictions.csv` (`index,prediction`) and
the fine-tuned model in `model/`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from bertjax import files, metrics, runs
from bertjax.data import swag as swag_data
from bertjax.evaluation import classification
from bertjax.pretrained import Pretrained, save_pretrained
from bertjax.tasks import finetune


def _write_predictions(path: str, examples, predictions: np.ndarray,
                       gold: bool = False) -> None:
  """`index,prediction` rows; with `gold`, a `label` column: the right ending."""
  lines = ["index,prediction" + (",label" if gold else "")] + [
      f"{e.index},{int(p)}" + (f",{e.label}" if gold else "")
      for e, p in zip(examples, predictions)]
  files.write_text(path, "\n".join(lines) + "\n")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes on SWAG's train.csv, scores val.csv every epoch, predicts test.csv."""
  path = lambda name: os.path.join(config.data.dir, name)
  train_examples = swag_data.read_csv(path("train.csv"))
  dev_examples = swag_data.read_csv(path("val.csv"))
  test_examples = swag_data.read_csv(path("test.csv")) if files.isfile(
      path("test.csv")) else None
  bundle = finetune.load_model(config, "multiple_choice")
  featurize = lambda examples: swag_data.featurize(examples, bundle.tokenizer,
                                                   config.max_seq_length)
  train_features, dev_features = featurize(train_examples), featurize(dev_examples)
  recipe = finetune.Recipe.from_config(config)
  total_steps = finetune.run_steps(len(train_examples), "training examples", recipe)
  writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0, config=config)
  tuner = finetune.FineTuner(bundle, "multiple_choice", recipe, total_steps, config, writer,
                             packed=config.data.get("pack_examples", False))
  runs.save_config(config, workdir)  # the settings are checked, the model loaded
  labels = np.array([e.label for e in dev_examples])
  history = []
  for epoch in range(int(np.ceil(recipe.epochs))):
    tuner.train_epoch(train_features, epoch)
    dev_predictions = tuner.predict(dev_features, f"val epoch {epoch + 1}")["logits"].argmax(-1)
    accuracy = 100.0 * float(np.mean(dev_predictions == labels))
    writer.write(int(tuner.state.step), {"accuracy": accuracy}, "dev/")
    logging.info("epoch %d: dev accuracy %.2f", epoch + 1, accuracy)
    history.append({"epoch": epoch + 1, "step": int(tuner.state.step),
                    "dev": {"accuracy": accuracy}})
  writer.close()
  guess, share = classification.commonest(labels)  # the baseline: always that ending
  results = {"dev": history[-1]["dev"],
             "baseline": {"dev": {"always": str(guess), "accuracy": share}}, "epochs": history}
  test_predictions = (tuner.predict(featurize(test_examples), "test")["logits"].argmax(-1)
                      if test_examples else None)
  params = tuner.params()
  if jax.process_index() == 0:
    _write_predictions(os.path.join(workdir, "val_predictions.csv"), dev_examples,
                       dev_predictions, gold=True)
    if test_examples:
      _write_predictions(os.path.join(workdir, "test_predictions.csv"), test_examples,
                         test_predictions)
    save_pretrained(Pretrained(bundle.config, params, bundle.tokenizer, "multiple_choice"),
                    os.path.join(workdir, "model"), overwrite=True)
    # Written last: a run with results.json finished whole (the sweep reads it).
    files.write_text(os.path.join(workdir, "results.json"), json.dumps(results, indent=2))
  runs.say_fine_tuning_is_done(workdir, results)
  return results
