"""The feature-based approach (the paper's section 5.3, Table 7): BERT's
activations, frozen, as the input of a BiLSTM NER tagger.

  python -m bertjax.main --config=configs/ner_features.py:concat_last_four \
      --workdir=/tmp/ner_concat --config.init_checkpoint=cased_L-12_H-768_A-12 \
      --config.data.dir=conll2003

First the encoder runs once over every CoNLL sentence, with its document
context as in fine-tuning, and the first piece's activations of each word at
the layers the variant needs are stored (`<workdir>/features/<split>.npy`,
float16, [words, layers, hidden], with each sentence's offset); no BERT
parameter is trained. Then a two-layer BiLSTM (768 units each way) and a
classifier train on them. Rerunning reuses stored features made from the same
checkpoint and layers.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import errors, files, metrics, runs, sharding
from bertjax.data import conll as conll_data
from bertjax.models.bert import encoder
from bertjax.models.bilstm import BiLSTMTagger
from bertjax.pretrained import load_pretrained
from bertjax.tasks import ner

# Table 7's variants: hidden_states indices (0 = embeddings, -1 = last layer)
# and how they combine.
VARIANTS: dict[str, tuple[tuple[int, ...] | str, str]] = {
    "embeddings": ((0,), "select"),
    "second_to_last": ((-2,), "select"),
    "last": ((-1,), "select"),
    "weighted_sum_last_four": ((-4, -3, -2, -1), "weighted_sum"),
    "concat_last_four": ((-4, -3, -2, -1), "concat"),
    "weighted_sum_all": ("all", "weighted_sum"),  # every layer, embeddings excluded
}


def layer_indices(variant: str, num_layers: int) -> list[int]:
  """The hidden_states rows (0..num_layers) a variant reads."""
  if variant not in VARIANTS:
    raise errors.UsageError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
  layers = VARIANTS[variant][0]
  if layers == "all":
    return list(range(1, num_layers + 1))
  if variant != "embeddings" and max(-i for i in layers) > num_layers:
    raise errors.UsageError(
        f"variant {variant!r} needs {max(-i for i in layers)} layers; the model "
        f"has {num_layers}")
  return [index % (num_layers + 1) for index in layers]


@functools.lru_cache(maxsize=4)
def _extract_fn(config, add_summary: bool, layers: tuple[int, ...]):
  model = encoder(config.replace(return_hidden_states=True), add_summary=add_summary)

  @jax.jit
  def extract(params, input_ids, attention_mask, token_type_ids, positions):
    out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
    chosen = out.hidden_states[jnp.array(layers)]  # [layers, batch, length, hidden]
    gathered = jnp.take_along_axis(chosen, positions[None, :, :, None], axis=2)
    return jnp.moveaxis(gathered, 0, 2).astype(jnp.float16)  # [batch, words, layers, hidden]

  return extract


def extract_features(bundle, features: conll_data.Features,
                     sentences: Sequence[conll_data.Sentence], layers: Sequence[int],
                     path: str, batch_size: int) -> None:
  """Writes every word's activations at `layers` to `path` (.npy, float16,
  [words, layers, hidden], sentences in order) and their offsets beside it."""
  offsets = np.cumsum([0] + [len(s.words) for s in sentences])
  width = max(len(row) for row in features.scored)
  extract = _extract_fn(bundle.config, bundle.has_summary, tuple(layers))
  params = jax.device_put(bundle.params["bert"])
  hidden = bundle.config.hidden_size
  partial = path + ".partial.npy"
  out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float16,
                                  shape=(int(offsets[-1]), len(layers), hidden))
  arrays = features.arrays
  rows = len(arrays["input_ids"])
  started = time.perf_counter()
  for start in range(0, rows, batch_size):
    chunk = range(start, min(start + batch_size, rows))
    positions = np.zeros((batch_size, width), np.int32)
    for i, row in enumerate(chunk):
      positions[i, :len(features.scored[row])] = [p for _, _, p in features.scored[row]]
    take = lambda name: np.resize(arrays[name][chunk.start:chunk.stop],
                                  (batch_size, *arrays[name].shape[1:]))
    result = np.asarray(extract(params, take("input_ids"), take("attention_mask"),
                                take("token_type_ids"), positions))
    for i, row in enumerate(chunk):
      for j, (sentence, word, _) in enumerate(features.scored[row]):
        out[offsets[sentence] + word] = result[i, j]
    if (start // batch_size + 1) % 50 == 0:
      logging.info("features %s: %d/%d rows, %.0f s", os.path.basename(path), chunk.stop,
                   rows, time.perf_counter() - started)
  out.flush()
  del out
  os.replace(partial, path)
  np.save(path[:-len(".npy")] + ".offsets.npy", offsets)


def _stored_features(config, bundle, workdir: str, split: str, sentences, labels,
                     layers: list[int]) -> tuple[np.ndarray, np.ndarray]:
  # Memory-mapped arrays: a remote workdir keeps them in the local cache.
  local_workdir = files.cache_path(workdir) if files.is_remote(workdir) else workdir
  directory = os.path.join(local_workdir, "features")
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{split}.npy")
  stamp_path = os.path.join(directory, f"{split}.json")
  stamp = {"init_checkpoint": (config.init_checkpoint if files.is_remote(config.init_checkpoint)
                               else os.path.abspath(config.init_checkpoint)), "layers": layers,
           "max_seq_length": config.max_seq_length, "document_context": config.document_context,
           "words": sum(len(s.words) for s in sentences),
           # How words become pieces (`Tokenizer.encode_words`): features
           # stored under another rule are extracted again.
           "pieces": "running text"}
  if not (os.path.isfile(path) and os.path.isfile(stamp_path)
          and files.read_json(stamp_path) == stamp):
    logging.info("Extracting %s features (layers %s)", split, layers)
    features = conll_data.featurize(sentences, bundle.tokenizer, labels, config.max_seq_length,
                                    config.document_context)
    extract_features(bundle, features, sentences, layers, path, config.extract_batch_size)
    files.write_text(stamp_path, json.dumps(stamp))
  return np.load(path, mmap_mode="r"), np.load(path[:-len(".npy")] + ".offsets.npy")


def _sentence_batches(stored, offsets, sentences, label_ids, batch_size: int, max_words: int,
                      order: np.ndarray):
  """Padded batches of whole sentences: layers, mask, labels, weights."""
  for start in range(0, len(order), batch_size):
    chosen = order[start:start + batch_size]
    shape = (batch_size, max_words)
    layers = np.zeros(shape + stored.shape[1:], np.float16)
    mask = np.zeros(shape, np.int32)
    labels = np.zeros(shape, np.int32)
    for i, index in enumerate(chosen):
      words = offsets[index + 1] - offsets[index]
      layers[i, :words] = stored[offsets[index]:offsets[index + 1]]
      mask[i, :words] = 1
      if sentences[index].tags:
        labels[i, :words] = [label_ids[t] for t in sentences[index].tags]
    yield chosen, {"layers": layers, "mask": mask, "labels": labels}


def _loss(params, batch, rng, model, deterministic):
  logits = model.apply({"params": params}, batch["layers"], batch["mask"],
                       deterministic=deterministic, rngs=None if deterministic
                       else {"dropout": rng})
  weights = batch["mask"].astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
  return (losses * weights).sum() / jnp.maximum(weights.sum(), 1.0), logits


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Extracts (or reuses) the frozen features, trains the BiLSTM, scores dev and test."""
  if jax.process_count() > 1:
    raise errors.UsageError("the feature-based approach runs in one process (it extracts and "
                            "stores features on this host); start it without jax.distributed")
  path = lambda name: os.path.join(config.data.dir, name)
  train, other = ner.read_splits(config)
  splits = {"train": train, **other}
  labels = conll_data.label_list(splits["train"])
  label_ids = {label: i for i, label in enumerate(labels)}
  for split in ("dev", "test"):
    if split in splits and all(s.tags for s in splits[split]):
      conll_data.check_tags(splits[split], labels, path(config.data[f"{split}_file"]))
  if not config.init_checkpoint:
    raise errors.UsageError(
        "config.init_checkpoint is empty: give the BERT to extract features from")
  bundle = load_pretrained(config.init_checkpoint, dtype=config.model.dtype)
  if bundle.tokenizer is None:
    raise errors.UsageError(f"{config.init_checkpoint}: no tokenizer beside the weights")
  layers = layer_indices(config.variant, bundle.config.num_layers)
  runs.save_config(config, workdir)  # the settings are checked, the model loaded
  stored = {split: _stored_features(config, bundle, workdir, split, sentences, labels, layers)
            for split, sentences in splits.items()}
  max_words = max(len(s.words) for sentences in splits.values() for s in sentences)
  max_words = -(-max_words // 8) * 8

  mesh = sharding.make_mesh([-1, 1, 1])
  batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  model = BiLSTMTagger(len(labels), VARIANTS[config.variant][1], config.lstm.hidden_size,
                       config.lstm.num_layers, config.lstm.dropout_rate)
  train_stored, train_offsets = stored["train"]
  steps_per_epoch = len(splits["train"]) // config.train.batch_size
  epochs = int(config.train.epochs)
  total_steps = max(steps_per_epoch * epochs, 1)
  schedule = optax.linear_schedule(config.train.learning_rate, 0.0, total_steps)
  optimizer = optax.chain(optax.clip_by_global_norm(config.train.max_grad_norm),
                          optax.adam(schedule))
  example = next(_sentence_batches(train_stored, train_offsets, splits["train"], label_ids,
                                   config.train.batch_size, max_words, np.arange(1)))[1]
  params = jax.jit(lambda: model.init(jax.random.key(config.seed), example["layers"],
                                      example["mask"])["params"], out_shardings=replicated)()
  opt_state = jax.jit(optimizer.init, out_shardings=replicated)(params)

  @functools.partial(jax.jit, in_shardings=(replicated, replicated, batch_sharding, replicated),
                     out_shardings=(replicated, replicated, replicated), donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, rng):
    (loss, _), grads = jax.value_and_grad(_loss, has_aux=True)(params, batch, rng, model, False)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @functools.partial(jax.jit, in_shardings=(replicated, batch_sharding),
                     out_shardings=replicated)
  def predict_step(params, batch):
    return _loss(params, batch, None, model, True)[1].argmax(-1)

  def evaluate(split: str) -> tuple[dict[str, Any] | None, list[list[str]]]:
    data, offsets = stored[split]
    sentences = splits[split]
    predicted = [[] for _ in sentences]
    for chosen, batch in _sentence_batches(data, offsets, sentences, label_ids,
                                           config.train.batch_size, max_words,
                                           np.arange(len(sentences))):
      tags = np.asarray(predict_step(params, batch))
      for i, index in enumerate(chosen):
        predicted[index] = [labels[t] for t in tags[i, :len(sentences[index].words)]]
    labelled = all(s.tags for s in sentences)
    return (ner.scores(sentences, predicted) if labelled else None), predicted

  writer = metrics.MetricWriter(workdir, enabled=jax.process_index() == 0, config=config)
  history, step = [], 0
  rng = jax.random.key(config.seed + 1)
  for epoch in range(epochs):
    order = np.random.default_rng([config.seed, epoch]).permutation(len(splits["train"]))
    order = order[:steps_per_epoch * config.train.batch_size]  # whole batches only
    for _, batch in _sentence_batches(train_stored, train_offsets, splits["train"], label_ids,
                                      config.train.batch_size, max_words, order):
      params, opt_state, loss = train_step(params, opt_state, batch, jax.random.fold_in(rng, step))
      step += 1
      if step % config.log_every_steps == 0:
        writer.write(step, {"loss": float(loss)}, "train/")
        logging.info("step %d/%d  loss %.4f", step, total_steps, float(loss))
    result, _ = evaluate("dev")
    writer.write(step, {k: result[k] for k in ("precision", "recall", "f1")}, "dev/")
    logging.info("epoch %d: dev entity F1 %.2f", epoch + 1, result["f1"])
    history.append({"epoch": epoch + 1, "step": step, "dev": result})
  writer.close()
  results: dict[str, Any] = {"variant": config.variant, "layers": layers, "labels": labels,
                             "dev": history[-1]["dev"], "epochs": history}
  predictions = {"dev": evaluate("dev")[1]}
  if "test" in splits:
    test_result, predictions["test"] = evaluate("test")
    if test_result is not None:
      results["test"] = test_result
  if jax.process_index() == 0:
    for split, predicted in predictions.items():
      ner.write_predictions(os.path.join(workdir, f"{split}_predictions.txt"), splits[split],
                            predicted)
    files.write_text(os.path.join(workdir, "results.json"), json.dumps(results, indent=2))
  runs.say_fine_tuning_is_done(workdir, results)
  return results
