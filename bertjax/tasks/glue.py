"""GLUE fine-tuning: [CLS] -> one output layer, the paper's section 4.1.

  python -m bertjax.main --config=configs/glue.py:mrpc --workdir=/tmp/mrpc \
      --config.init_checkpoint=uncased_L-12_H-768_A-12 --config.data.dir=glue_data/MRPC

Reads the task's train and dev sets (TSV or TFDS), fine-tunes for
`train.epochs`, evaluates dev after every epoch with the task's metrics, and
writes into the workdir: `results.json` (the final dev metrics, the
baseline beside them: always guessing dev's commonest class, for every task but
STS-B, and every epoch's), `dev_predictions.tsv` (each prediction beside its
gold label), the GLUE server's submission files
for the test sets (`submission/<Task>.tsv`; MNLI also predicts AX), and the
fine-tuned model (`model/`, a bertjax model directory with its labels).
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
from bertjax.data import glue as glue_data
from bertjax.data import stdlib_topics
from bertjax.evaluation import classification
from bertjax.pretrained import Pretrained, save_pretrained
from bertjax.tasks import finetune


def task_spec(config: ml_collections.ConfigDict) -> glue_data.TaskSpec:
  """The task `config.data` names: a GLUE task, or the demo's (`data.source="demo"`)."""
  if config.data.source == "demo":
    if config.data.task != stdlib_topics.NAME:
      raise errors.UsageError(f"config.data.source='demo' has one task, {stdlib_topics.NAME!r}, "
                              f"not {config.data.task!r}")
    return stdlib_topics.SPEC
  return glue_data.task_spec(config.data.task)


def read_split(config: ml_collections.ConfigDict, spec: glue_data.TaskSpec,
               split: str) -> list[glue_data.Example] | None:
  """A split's examples from `config.data`, or None if the source lacks it."""
  source = config.data.source
  if source == "demo":
    return stdlib_topics.read_split(split) if split in spec.files else None
  if source == "tsv":
    task_dir = glue_data.split_directory(spec, config.data.dir, split)
    if task_dir is None:
      if split in ("train", "dev"):
        raise errors.MissingFileError(f"{os.path.join(config.data.dir, spec.files[split])} not "
                                      f"found: config.data.dir must hold the {spec.name} TSVs")
      logging.warning("%s: no %s file in %s, so no %s predictions", spec.name,
                      spec.files[split], config.data.dir, split)
      return None
    return glue_data.read_tsv(spec, task_dir, split)
  if source == "tfds":
    name = config.data.tfds_name or None
    if split in ("train", "dev", "dev_mismatched"):
      return glue_data.read_tfds(spec, split, config.data.dir or None, name)
    try:  # test sets are optional: predict them when they are there
      return glue_data.read_tfds(spec, split, config.data.dir or None,
                                 None if split == "ax" else name)
    except (FileNotFoundError, ValueError) as e:  # not prepared, or no such split
      logging.warning("%s: no %s predictions (%s)", spec.name, split, e)
      return None
  raise errors.UsageError(
      f"config.data.source must be 'tsv', 'tfds' or 'demo', got {source!r}")


def featurize(examples: Sequence[glue_data.Example], spec: glue_data.TaskSpec,
              tokenizer, max_seq_length: int) -> finetune.Features:
  """Fixed-length model inputs, labels (0 for unlabelled rows) and weights."""
  pairs = [e.text_b or "" for e in examples] if spec.tfds_features[1] else None
  features = tokenizer.encode_batch([e.text_a for e in examples], pairs,
                                    max_length=max_seq_length, padding="max_length")
  if spec.is_regression:
    labels = np.array([e.label if e.label is not None else 0.0 for e in examples], np.float32)
  else:
    ids = glue_data.label_ids(spec)
    labels = np.array([ids[e.label] if e.label is not None else 0 for e in examples],
                      np.int32)
  features["labels"] = labels
  features["weights"] = np.ones(len(examples), np.float32)
  return features


def predictions_of(spec: glue_data.TaskSpec, logits: np.ndarray) -> np.ndarray:
  """Class ids (or STS-B scores) from the output layer's logits."""
  return logits[:, 0] if spec.is_regression else logits.argmax(-1)


def score(spec: glue_data.TaskSpec, examples: Sequence[glue_data.Example],
          predictions: np.ndarray) -> dict[str, float]:
  if spec.is_regression:
    labels = np.array([e.label for e in examples], np.float64)
  else:
    ids = glue_data.label_ids(spec)
    labels = np.array([ids[e.label] for e in examples])
  return classification.glue_metrics(spec.name, labels, predictions)


def baseline(spec: glue_data.TaskSpec,
             examples: Sequence[glue_data.Example]) -> dict[str, Any] | None:
  """What always guessing the commonest class of `examples` scores, in the
  task's metrics and accuracy (the class's share); None for STS-B, whose
  correlations a constant guess does not have."""
  if spec.is_regression:
    return None
  ids = glue_data.label_ids(spec)
  labels = np.array([ids[e.label] for e in examples])
  guess, share = classification.commonest(labels)
  constant = np.full(len(labels), guess)
  return {"always": spec.labels[guess],
          **classification.glue_metrics(spec.name, labels, constant), "accuracy": share}


def gold_strings(spec: glue_data.TaskSpec, examples: Sequence[glue_data.Example]) -> list[str]:
  """Each example's gold label as a prediction of it is written."""
  if spec.is_regression:
    return [f"{float(e.label):.3f}" for e in examples]
  return [str(e.label) for e in examples]


def label_strings(spec: glue_data.TaskSpec, predictions: np.ndarray) -> list[str]:
  if spec.is_regression:
    # The GLUE server takes STS-B scores in [0, 5].
    return [f"{float(np.clip(p, 0.0, 5.0)):.3f}" for p in predictions]
  return [spec.labels[int(p)] for p in predictions]


def write_predictions(path: str, examples: Sequence[glue_data.Example],
                      labels: Sequence[str], gold: Sequence[str] | None = None) -> None:
  """GLUE's submission format: a header `index<TAB>prediction`, a row per
  example; with `gold`, a third column `label`, the gold label beside each
  prediction (a dev set's)."""
  if not files.is_remote(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
  columns = [[e.index for e in examples], labels] + ([gold] if gold is not None else [])
  header = "index\tprediction" + ("\tlabel" if gold is not None else "")
  lines = [header] + ["\t".join(map(str, row)) for row in zip(*columns)]
  files.write_text(path, "\n".join(lines) + "\n")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes, evaluates and predicts one GLUE task; returns the final dev metrics."""
  spec = task_spec(config)
  train_examples = read_split(config, spec, "train")
  eval_splits = {"dev": read_split(config, spec, "dev")}
  if spec.name == "mnli":
    eval_splits["dev_mismatched"] = read_split(config, spec, "dev_mismatched")
  eval_splits = {k: v for k, v in eval_splits.items() if v}
  test_splits = {split: examples for split in spec.submission
                 if (examples := read_split(config, spec, split))}

  labels = list(spec.labels) if spec.labels else ["score"]
  bundle = finetune.load_model(config, "sequence_classification", labels)
  max_length = config.max_seq_length
  featurize_split = lambda examples: featurize(examples, spec, bundle.tokenizer, max_length)
  train_features = featurize_split(train_examples)
  recipe = finetune.Recipe.from_config(config)
  total_steps = finetune.run_steps(len(train_examples), "training examples", recipe)
  logging.info("%s: %d train examples, %s; %d steps of %d", spec.name, len(train_examples),
               ", ".join(f"{len(v)} {k}" for k, v in {**eval_splits, **test_splits}.items()),
               total_steps, recipe.batch_size)
  writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0, config=config)
  tuner = finetune.FineTuner(bundle, "regression" if spec.is_regression else "classification",
                             recipe, total_steps, config, writer,
                             packed=config.data.get("pack_examples", False))
  runs.save_config(config, workdir)  # the settings are checked, the model loaded

  history, dev_predictions = [], {}
  epochs = int(np.ceil(recipe.epochs))
  eval_features = {split: featurize_split(examples) for split, examples in eval_splits.items()}
  for epoch in range(epochs):
    tuner.train_epoch(train_features, epoch)
    results = {}
    for split, examples in eval_splits.items():
      logits = tuner.predict(eval_features[split], f"{split} epoch {epoch + 1}")["logits"]
      dev_predictions[split] = predictions_of(spec, logits)
      results[split] = score(spec, examples, dev_predictions[split])
      writer.write(int(tuner.state.step), results[split], f"{split}/")
    logging.info("epoch %d: %s", epoch + 1, json.dumps(results))
    history.append({"epoch": epoch + 1, "step": int(tuner.state.step), **results})
  writer.close()
  final = {"task": spec.name, **{k: v for k, v in history[-1].items() if k in eval_splits}}
  if not spec.is_regression:
    final["baseline"] = {split: baseline(spec, examples) for split, examples in eval_splits.items()}
  final["epochs"] = history

  # Every process predicts and gathers (collectives); process 0 writes.
  test_predictions = {
      split: predictions_of(spec, tuner.predict(featurize_split(examples), split)["logits"])
      for split, examples in test_splits.items()}
  tuned = Pretrained(bundle.config, tuner.params(), bundle.tokenizer,
                     "sequence_classification", labels)
  if jax.process_index() == 0:
    for split, examples in eval_splits.items():
      write_predictions(os.path.join(workdir, f"{split}_predictions.tsv"), examples,
                        label_strings(spec, dev_predictions[split]), gold_strings(spec, examples))
    for split, examples in test_splits.items():
      write_predictions(os.path.join(workdir, "submission", spec.submission[split]), examples,
                        label_strings(spec, test_predictions[split]))
    save_pretrained(tuned, os.path.join(workdir, "model"), overwrite=True)
    # Written last: a run with results.json finished whole (the sweep reads it).
    files.write_text(os.path.join(workdir, "results.json"), json.dumps(final, indent=2))
  runs.say_fine_tuning_is_done(workdir, final)
  return final
