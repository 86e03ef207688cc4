"""CoNLL-2003 NER fine-tuning: the paper's section 5.3, fine-tuning approach.

  python -m bertjax.main --config=configs/ner.py --workdir=/tmp/ner \
      --config.init_checkpoint=cased_L-12_H-768_A-12 --config.data.dir=conll2003

Each word is labelled from its first piece, with its document's neighbouring
sentences as context (see `bertjax.data.conll`). Entity-level precision,
recall and F1 by conlleval's rules on dev after every epoch and on test at the
end; `results.json`, `<split>_predictions.txt` in conlleval's input format
(`word gold predicted`), and the model with its tag set in `model/`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from absl import logging
import jax
import ml_collections
import numpy as np

from bertjax import errors, files, metrics, runs
from bertjax.data import conll as conll_data
from bertjax.evaluation import conll as conll_eval
from bertjax.pretrained import Pretrained, save_pretrained
from bertjax.tasks import finetune


def scores(sentences: Sequence[conll_data.Sentence],
           predicted: Sequence[Sequence[str]]) -> dict[str, Any]:
  """Overall and per-type precision, recall and F1 (percent), as conlleval."""
  result = conll_eval.evaluate([s.tags for s in sentences], predicted)
  as_percent = lambda s: {"precision": 100 * s.precision, "recall": 100 * s.recall,
                          "f1": 100 * s.f1, "gold": s.gold, "predicted": s.predicted}
  overall = result.pop("overall")
  return {**as_percent(overall), "by_type": {k: as_percent(v) for k, v in result.items()}}


def write_predictions(path: str, sentences: Sequence[conll_data.Sentence],
                      predicted: Sequence[Sequence[str]]) -> None:
  lines = []
  for sentence, tags in zip(sentences, predicted):
    gold = sentence.tags or ["O"] * len(tags)
    lines += [f"{w} {g} {p}" for w, g, p in zip(sentence.words, gold, tags)] + [""]
  files.write_text(path, "\n".join(lines))


def read_splits(config: ml_collections.ConfigDict
                ) -> tuple[list[conll_data.Sentence], dict[str, list[conll_data.Sentence]]]:
  """(train, {"dev": ..., "test": ...}) from the files in `data.dir`, or from
  TFDS (`data.source="tfds"`: the *_file fields name splits of `data.tfds_name`)."""
  data = config.data
  if data.source == "tfds":
    read = lambda split: conll_data.read_tfds(data.tfds_name, split, data.dir or None)
    present = lambda split: bool(split)
  elif data.source == "files":
    read = lambda name: conll_data.read_conll(os.path.join(data.dir, name))
    present = lambda name: bool(name) and files.isfile(os.path.join(data.dir, name))
  else:
    raise errors.UsageError(f"config.data.source must be 'files' or 'tfds', got {data.source!r}")
  splits = {"dev": read(data.dev_file)}
  if present(data.test_file):
    splits["test"] = read(data.test_file)
  return read(data.train_file), splits


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes on the training file, scores dev every epoch and test at the end."""
  path = lambda name: os.path.join(config.data.dir, name)
  train, splits = read_splits(config)
  labels = conll_data.label_list(train)
  for split, sentences in splits.items():
    if all(s.tags for s in sentences):
      conll_data.check_tags(sentences, labels,
                            path(config.data[f"{split}_file"]))
  bundle = finetune.load_model(config, "token_classification", labels)
  tokenizer = bundle.tokenizer
  if getattr(tokenizer, "do_lower_case", False):
    logging.warning("%s lower-cases its input; the paper fine-tunes a cased model for NER",
                    config.init_checkpoint)
  featurize = lambda sentences: conll_data.featurize(
      sentences, tokenizer, labels, config.max_seq_length, config.document_context)
  train_features = featurize(train)
  split_features = {split: featurize(sentences) for split, sentences in splits.items()}
  recipe = finetune.Recipe.from_config(config)
  rows = len(train_features.arrays["input_ids"])
  total_steps = finetune.run_steps(rows, "training rows", recipe)
  logging.info("%d training sentences in %d rows; %d steps; labels %s", len(train), rows,
               total_steps, labels)
  writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0, config=config)
  tuner = finetune.FineTuner(bundle, "token", recipe, total_steps, config, writer,
                             packed=config.data.get("pack_examples", False))
  runs.save_config(config, workdir)  # the settings are checked, the model loaded

  def evaluate(split: str, description: str
               ) -> tuple[dict[str, Any] | None, list[list[str]]]:
    """(scores, or None for a file without tags; the predicted tags)."""
    features = split_features[split]
    logits = tuner.predict(features.arrays, description)["logits"]
    predicted = conll_data.word_predictions(features, logits, splits[split], labels)
    labelled = all(s.tags for s in splits[split])
    return (scores(splits[split], predicted) if labelled else None), predicted

  history = []
  for epoch in range(int(np.ceil(recipe.epochs))):
    tuner.train_epoch(train_features.arrays, epoch)
    result, _ = evaluate("dev", f"dev epoch {epoch + 1}")
    writer.write(int(tuner.state.step), {k: result[k] for k in ("precision", "recall", "f1")},
                 "dev/")
    logging.info("epoch %d: dev entity F1 %.2f", epoch + 1, result["f1"])
    history.append({"epoch": epoch + 1, "step": int(tuner.state.step), "dev": result})
  writer.close()
  results: dict[str, Any] = {"labels": labels, "dev": history[-1]["dev"], "epochs": history}
  predictions = {"dev": evaluate("dev", "dev")[1]}
  if "test" in splits:
    test_result, predictions["test"] = evaluate("test", "test")
    if test_result is not None:
      results["test"] = test_result
  params = tuner.params()
  if jax.process_index() == 0:
    for split, predicted in predictions.items():
      write_predictions(os.path.join(workdir, f"{split}_predictions.txt"), splits[split],
                        predicted)
    save_pretrained(Pretrained(bundle.config, params, tokenizer, "token_classification",
                               labels), os.path.join(workdir, "model"), overwrite=True)
    # Written last: a run with results.json finished whole (the sweep reads it).
    files.write_text(os.path.join(workdir, "results.json"), json.dumps(results, indent=2))
  runs.say_fine_tuning_is_done(workdir, results)
  return results
