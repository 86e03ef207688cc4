"""Google's original TF checkpoints: written here with TensorFlow under the
original variable names, then imported and compared with the reference model
holding the same weights."""

import json
import os

import jax
import numpy as np
import pytest
import torch

import bertjax
from bertjax.interop import google_tf
from tests import reference

tf = pytest.importorskip("tensorflow", reason="the [tf] extra reads Google checkpoints")

CONFIG = dict(vocab_size=210, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=40, max_position_embeddings=40, type_vocab_size=2)
# The reference computes what the original modeling.py did with
# `"hidden_act": "gelu"`: its gelu is the tanh approximation, transformers'
# "gelu_new".
REFERENCE = dict(CONFIG, hidden_act="gelu_new")


def _google_variables(model) -> dict[str, np.ndarray]:
  """The reference model's weights under the original TF names and layouts."""
  variables = {}
  for name, value in model.state_dict().items():
    value = value.numpy()
    if name in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
      continue
    special = {"cls.predictions.bias": "cls/predictions/output_bias",
               "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
               "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
               "classifier.weight": "output_weights", "classifier.bias": "output_bias",
               "qa_outputs.weight": "cls/squad/output_weights",
               "qa_outputs.bias": "cls/squad/output_bias"}
    if name in special:
      variables[special[name]] = value
      continue
    tf_name = name.replace(".layer.", ".layer_").replace(".", "/")
    if tf_name.endswith("_embeddings/weight"):
      tf_name = tf_name[:-len("/weight")]
    elif "LayerNorm" in tf_name:
      tf_name = tf_name.replace("LayerNorm/weight", "LayerNorm/gamma").replace(
          "LayerNorm/bias", "LayerNorm/beta")
    elif tf_name.endswith("/weight"):
      tf_name, value = tf_name[:-len("/weight")] + "/kernel", value.T
    variables[tf_name] = value
  return variables


def _write_checkpoint(model, directory, with_optimizer_slots=True, name="bert_model.ckpt"):
  os.makedirs(directory, exist_ok=True)
  values = _google_variables(model)
  graph = tf.Graph()
  with graph.as_default():
    created = [tf.compat.v1.get_variable(name, initializer=tf.constant(value))
               for name, value in values.items()]
    if with_optimizer_slots:  # Training code saves these alongside the weights.
      created += [tf.compat.v1.get_variable(name + suffix, initializer=tf.zeros_like(value))
                  for name, value in list(values.items())[:3]
                  for suffix in ("/adam_m", "/adam_v", "/Adam", "/Adam_1",
                                 "/ExponentialMovingAverage")]
      created.append(tf.compat.v1.get_variable("beta1_power", initializer=0.9))
      created.append(tf.compat.v1.train.get_or_create_global_step())
    saver = tf.compat.v1.train.Saver(created)
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      saver.save(session, os.path.join(directory, name), write_meta_graph=False,
                 write_state=False)
  google_config = {k: v for k, v in CONFIG.items()}
  google_config.update(hidden_act="gelu", hidden_dropout_prob=0.1,
                       attention_probs_dropout_prob=0.1, initializer_range=0.02)
  with open(os.path.join(directory, "bert_config.json"), "w") as f:
    json.dump(google_config, f)
  reference.write_vocab(os.path.join(directory, "vocab.txt"))
  return directory


def _inputs(batch):
  return dict(zip(("input_ids", "attention_mask", "token_type_ids"),
                  (torch.tensor(x) for x in batch)))


def test_pretraining_checkpoint_imports_and_matches(tmp_path):
  model = reference.reference_model("BertForPreTraining", seed=11, **REFERENCE)
  directory = _write_checkpoint(model, tmp_path / "uncased_L-2_H-32_A-4")
  assert google_tf.find_checkpoint(str(directory)).endswith("bert_model.ckpt")
  bundle = bertjax.load_pretrained(directory)
  assert bundle.task == "pretraining"
  assert bundle.tokenizer.do_lower_case  # from the directory name
  batch = reference.example_batch(CONFIG["vocab_size"])
  with torch.no_grad():
    expected = model(**_inputs(batch))
  out = bundle.model().apply({"params": bundle.params}, *batch)
  np.testing.assert_allclose(out["mlm_logits"], expected.prediction_logits, atol=1e-5, rtol=0)
  np.testing.assert_allclose(out["nsp_logits"], expected.seq_relationship_logits, atol=1e-5,
                             rtol=0)

  # Through to Hugging Face, which computes the same (its "gelu_new"), and
  # the prefix itself works as a path.
  bertjax.export_hf(bundle, tmp_path / "hf")
  import transformers
  exported = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
  assert exported.config.hidden_act == "gelu_new"
  with torch.no_grad():
    np.testing.assert_allclose(exported(**_inputs(batch)).prediction_logits,
                               expected.prediction_logits, atol=1e-5, rtol=0)
  again = bertjax.load_pretrained(str(directory / "bert_model.ckpt"))
  np.testing.assert_array_equal(
      again.params["bert"]["pooler"]["kernel"], bundle.params["bert"]["pooler"]["kernel"])


@pytest.mark.parametrize("class_name,task", [
    ("BertForSequenceClassification", "sequence_classification"),
    ("BertForQuestionAnswering", "question_answering"),
])
def test_fine_tuned_checkpoints_import(tmp_path, class_name, task):
  model = reference.reference_model(class_name, seed=12, **REFERENCE)
  directory = _write_checkpoint(model, tmp_path / "cased_model", with_optimizer_slots=False)
  bundle = bertjax.load_pretrained(directory)
  assert bundle.task == task and not bundle.tokenizer.do_lower_case
  batch = reference.example_batch(CONFIG["vocab_size"])
  with torch.no_grad():
    expected = model(**_inputs(batch))
  out = bundle.model().apply({"params": bundle.params}, *batch)
  for name in out:
    np.testing.assert_allclose(out[name], getattr(expected, name.replace("mlm_", "")),
                               atol=1e-5, rtol=0)


def _original_gelu(x):
  """modeling.py's gelu."""
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * np.power(x, 3))))


def test_gelu_means_the_originals_tanh_approximation():
  from bertjax.models.layers import activation

  config = google_tf.config_from_dict(dict(CONFIG, hidden_act="gelu"), "bert_config.json")
  assert config.hidden_act == "gelu_tanh"
  x = np.linspace(-6, 6, 1001, dtype=np.float32)
  np.testing.assert_allclose(activation(config.hidden_act)(x), _original_gelu(x), atol=2e-6)
  exact = activation("gelu")(x)  # what Hugging Face's "gelu" means
  assert np.abs(exact - _original_gelu(x)).max() > 1e-4
  with pytest.raises(ValueError, match="bert_config.json: hidden_act='swish'"):
    google_tf.config_from_dict(dict(CONFIG, hidden_act="swish"), "bert_config.json")
  from bertjax.configs import base_pretrain, large_pretrain
  assert base_pretrain.get_config().model.hidden_act == "gelu_tanh"  # as the original trained
  assert large_pretrain.get_config("ltr").model.hidden_act == "gelu_tanh"


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
  model = reference.reference_model("BertForPreTraining", seed=13, **CONFIG)
  directory = _write_checkpoint(model, tmp_path / "model")
  data = next(p for p in directory.iterdir() if ".data-" in p.name)
  data.write_bytes(data.read_bytes()[:100])
  with pytest.raises(ValueError, match="bert_model.ckpt: cannot read variable bert/"):
    bertjax.load_pretrained(directory)


def test_choosing_among_several_checkpoints(tmp_path):
  first = reference.reference_model("BertForPreTraining", seed=14, **CONFIG)
  second = reference.reference_model("BertForPreTraining", seed=15, **CONFIG)
  directory = _write_checkpoint(first, tmp_path / "run", name="model.ckpt-9000")
  _write_checkpoint(second, directory, name="model.ckpt-10000")
  with pytest.raises(ValueError, match=r"several checkpoints .*model.ckpt-10000.*pass the "
                     "prefix"):
    bertjax.load_pretrained(directory)
  expected = second.bert.pooler.dense.bias.detach().numpy()
  explicit = bertjax.load_pretrained(str(directory / "model.ckpt-10000"))
  np.testing.assert_array_equal(explicit.params["bert"]["pooler"]["bias"], expected)
  (directory / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-10000"\n')
  latest = bertjax.load_pretrained(directory)
  np.testing.assert_array_equal(latest.params["bert"]["pooler"]["bias"], expected)


def test_a_google_checkpoint_on_gcs_loads_like_a_local_one(tmp_path, gcs):
  from tests.test_pretrained import _upload_tree

  model = reference.reference_model("BertForPreTraining", seed=16, **CONFIG)
  directory = _write_checkpoint(model, tmp_path / "uncased_L-2_H-32_A-4")
  url = gcs.url_of("google/uncased_L-2_H-32_A-4")
  _upload_tree(str(directory), url)
  local = bertjax.load_pretrained(directory)
  for path in (url, url + "/bert_model.ckpt"):  # the directory, or the prefix
    remote = bertjax.load_pretrained(path)
    assert remote.tokenizer.do_lower_case  # the name still says "uncased"
    jax.tree.map(np.testing.assert_array_equal, remote.params, local.params)
