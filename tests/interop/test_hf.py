"""Hugging Face interop: every head matches `transformers` (PyTorch, float32).

Each reference model gets random weights everywhere (LayerNorm and biases too),
is saved with `save_pretrained`, read with `bertjax.load_pretrained`, and run on
a padded batch with both token types.
"""

import json
import os

import jax
import numpy as np
import pytest
import torch

import bertjax
from bertjax.interop import hf
from tests import reference

# Absolute, for values of magnitude up to 1; larger ones get the same relative
# tolerance (float32 rounding grows with the magnitude: MLM logits reach ~7).
TOLERANCE = 1e-5

SHAPES = {
    # Odd feed-forward width, several heads.
    "L2_H32_A4": dict(vocab_size=210, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=37,
                      max_position_embeddings=40, type_vocab_size=2),
    # Three segment types, three heads of 16.
    "L3_H48_A3": dict(vocab_size=256, hidden_size=48, num_hidden_layers=3,
                      num_attention_heads=3, intermediate_size=96,
                      max_position_embeddings=64, type_vocab_size=3),
    # The tanh GELU and one layer.
    "L1_H64_A2": dict(vocab_size=230, hidden_size=64, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=128,
                      max_position_embeddings=24, type_vocab_size=2, hidden_act="gelu_new"),
}


def _save(model, directory):
  model.save_pretrained(directory)
  reference.write_vocab(os.path.join(directory, "vocab.txt"))
  return directory


def _torch_inputs(batch):
  input_ids, attention_mask, token_type_ids = (torch.tensor(x) for x in batch)
  return dict(input_ids=input_ids, attention_mask=attention_mask,
              token_type_ids=token_type_ids)


def _assert_close(ours, theirs, what):
  theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
  assert ours.shape == theirs.shape, what
  error = np.abs(np.asarray(ours) - theirs).max()
  tolerance = TOLERANCE * max(1.0, float(np.abs(theirs).max()))
  assert error <= tolerance, f"{what}: max abs error {error} (tolerance {tolerance})"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_pretraining_model_matches_reference(shape, tmp_path):
  config = SHAPES[shape]
  model = reference.reference_model("BertForPreTraining", seed=1, **config)
  bundle = bertjax.load_pretrained(_save(model, tmp_path))
  assert bundle.task == "pretraining"
  batch = reference.example_batch(config["vocab_size"])
  with torch.no_grad():
    theirs = model(**_torch_inputs(batch), output_hidden_states=True)
    encoder = model.bert(**_torch_inputs(batch), output_hidden_states=True)

  ours = bundle.model().apply({"params": bundle.params}, *batch)
  _assert_close(ours["mlm_logits"], theirs.prediction_logits, "MLM logits")
  _assert_close(ours["nsp_logits"], theirs.seq_relationship_logits, "NSP logits")

  # MLM logits at gathered positions equal the full logits there.
  positions = np.array([[1, 4, 0], [2, 2, 6], [3, 0, 0]])
  gathered = bundle.model().apply({"params": bundle.params}, *batch,
                                  masked_positions=positions)["mlm_logits"]
  full = theirs.prediction_logits.numpy()
  _assert_close(gathered, np.take_along_axis(full, positions[..., None], axis=1),
                "MLM logits at masked positions")

  # Sequence, pooled and every hidden state.
  encoded = bertjax.models.BertEncoder(bundle.config.replace(return_hidden_states=True)).apply(
      {"params": bundle.params["bert"]}, *batch)
  _assert_close(encoded.sequence_output, encoder.last_hidden_state, "sequence output")
  _assert_close(encoded.pooled_output, encoder.pooler_output, "pooled output")
  assert encoded.hidden_states.shape[0] == config["num_hidden_layers"] + 1
  for layer, expected in enumerate(encoder.hidden_states):
    _assert_close(encoded.hidden_states[layer], expected, f"hidden state {layer}")


def test_a_padded_vocabulary_predicts_and_exports_the_real_words(tmp_path):
  """`vocab_pad_multiple=128`: the table has 256 rows for 210 words; the MLM
  scores only the 210 (as the reference does) and an export has 210 rows."""
  import transformers

  config = SHAPES["L2_H32_A4"]
  model = reference.reference_model("BertForPreTraining", seed=1, **config)
  bundle = bertjax.load_pretrained(_save(model, tmp_path / "hf"))
  padded_config = bundle.config.replace(vocab_pad_multiple=128)
  assert padded_config.embedding_rows == 256
  params, _ = bertjax.interop.mapping.params_from_reference(
      bertjax.interop.mapping.params_to_reference(bundle.params), padded_config,
      "pretraining", 2, "test")
  table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert table.shape == (256, 32) and not np.asarray(table)[210:].any()
  padded = bertjax.Pretrained(padded_config, params, bundle.tokenizer, "pretraining")
  batch = reference.example_batch(config["vocab_size"])
  ours = padded.model().apply({"params": padded.params}, *batch)["mlm_logits"]
  with torch.no_grad():
    theirs = model(**_torch_inputs(batch)).prediction_logits
  assert ours.shape[-1] == 210
  _assert_close(ours, theirs, "MLM logits")
  bertjax.export_hf(padded, str(tmp_path / "export"))
  exported = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "export"))
  assert exported.config.vocab_size == 210
  with torch.no_grad():
    _assert_close(ours, exported(**_torch_inputs(batch)).prediction_logits, "exported")


HEADS = [
    # (reference class, extra config, bertjax task, output name(s) -> reference field)
    ("BertModel", {}, "encoder",
     {"sequence_output": "last_hidden_state", "pooled_output": "pooler_output"}),
    ("BertForMaskedLM", {}, "masked_lm", {"mlm_logits": "logits"}),
    ("BertForNextSentencePrediction", {}, "next_sentence", {"nsp_logits": "logits"}),
    ("BertForSequenceClassification", {"num_labels": 3}, "sequence_classification",
     {"logits": "logits"}),
    ("BertForSequenceClassification", {"num_labels": 1}, "sequence_classification",
     {"logits": "logits"}),
    ("BertForQuestionAnswering", {}, "question_answering",
     {"start_logits": "start_logits", "end_logits": "end_logits"}),
    ("BertForTokenClassification", {"num_labels": 5}, "token_classification",
     {"logits": "logits"}),
    ("BertForMultipleChoice", {}, "multiple_choice", {"logits": "logits"}),
    ("BertLMHeadModel", {"is_decoder": True}, "masked_lm", {"mlm_logits": "logits"}),
]


@pytest.mark.parametrize("class_name,extra,task,outputs", HEADS,
                         ids=[f"{h[0]}-{h[1]}" for h in HEADS])
def test_each_head_matches_reference(class_name, extra, task, outputs, tmp_path):
  config = {**SHAPES["L2_H32_A4"], **extra}
  model = reference.reference_model(class_name, seed=2, **config)
  bundle = bertjax.load_pretrained(_save(model, tmp_path))
  assert bundle.task == task
  assert bundle.config.causal == bool(extra.get("is_decoder"))
  batch = reference.example_batch(config["vocab_size"])
  if task == "multiple_choice":  # [batch, choices, length]
    batch = tuple(np.stack([x, x[::-1]], axis=1) for x in batch)
  with torch.no_grad():
    theirs = model(**_torch_inputs(batch))
  ours = bundle.model().apply({"params": bundle.params}, *batch)
  for name, field in outputs.items():
    _assert_close(ours[name], getattr(theirs, field), f"{class_name} {name}")
  if "num_labels" in extra:
    assert bundle.num_labels == extra["num_labels"]


@pytest.mark.parametrize("class_name", ["BertForPreTraining", "BertForQuestionAnswering",
                                        "BertForSequenceClassification", "BertModel"])
def test_export_loads_into_transformers_without_missing_keys(class_name, tmp_path):
  import transformers

  config = SHAPES["L3_H48_A3"]
  model = reference.reference_model(class_name, seed=3, **config)
  bundle = bertjax.load_pretrained(_save(model, tmp_path / "in"))
  bertjax.export_hf(bundle, tmp_path / "out")

  reloaded, info = getattr(transformers, class_name).from_pretrained(
      tmp_path / "out", output_loading_info=True)
  assert info["missing_keys"] == [] or info["missing_keys"] == set()
  assert not info["unexpected_keys"] and not info["mismatched_keys"]
  batch = _torch_inputs(reference.example_batch(config["vocab_size"]))
  with torch.no_grad():
    expected, got = model(**batch), reloaded.eval()(**batch)
  for field in expected.keys():
    torch.testing.assert_close(got[field], expected[field], rtol=0, atol=0)

  tokenizer = transformers.BertTokenizer.from_pretrained(tmp_path / "out")
  text = "Hello world, the quick brown fox!"
  assert tokenizer(text)["input_ids"] == bundle.tokenizer.encode(text)


def test_import_export_import_is_bit_exact(tmp_path):
  model = reference.reference_model("BertForPreTraining", seed=4, **SHAPES["L2_H32_A4"])
  first = bertjax.load_pretrained(_save(model, tmp_path / "a"))
  bertjax.export_hf(first, tmp_path / "b")
  second = bertjax.load_pretrained(tmp_path / "b")
  flat_first = dict(bertjax.interop.mapping.params_to_reference(first.params))
  flat_second = dict(bertjax.interop.mapping.params_to_reference(second.params))
  assert flat_first.keys() == flat_second.keys()
  for name in flat_first:
    np.testing.assert_array_equal(flat_first[name], flat_second[name], err_msg=name)
  # And the exported tensors are the original ones.
  original = {k: v.numpy() for k, v in model.state_dict().items()}
  exported = hf.read_safetensors(str(tmp_path / "b" / "model.safetensors"))
  for name, value in exported.items():
    np.testing.assert_array_equal(value, original[name], err_msg=name)


def test_reads_encoder_without_prefix_bfloat16_and_legacy_layer_norm_names(tmp_path):
  from safetensors.torch import save_file

  config = SHAPES["L1_H64_A2"]
  model = reference.reference_model("BertModel", seed=5, **config)
  model.save_pretrained(tmp_path)  # keys without the `bert.` prefix
  state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                     "LayerNorm.beta"):
           v.to(torch.bfloat16) for k, v in model.state_dict().items()}
  save_file(state, str(tmp_path / "model.safetensors"))
  bundle = bertjax.load_pretrained(tmp_path)
  assert bundle.tokenizer is None
  word = bundle.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  np.testing.assert_array_equal(
      word, model.embeddings.word_embeddings.weight.detach().to(torch.bfloat16).float().numpy())


def test_reads_sharded_safetensors(tmp_path):
  config = SHAPES["L2_H32_A4"]
  model = reference.reference_model("BertForPreTraining", seed=6, **config)
  model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
  assert os.path.exists(tmp_path / "sharded" / hf.SAFETENSORS_INDEX_FILE)
  model.save_pretrained(tmp_path / "single")
  sharded = bertjax.load_pretrained(tmp_path / "sharded")
  single = bertjax.load_pretrained(tmp_path / "single")
  jax.tree.map(np.testing.assert_array_equal, sharded.params, single.params)


def test_reads_pytorch_pickle_with_weights_only(tmp_path, caplog):
  config = SHAPES["L2_H32_A4"]
  model = reference.reference_model("BertForMaskedLM", seed=7, **config)
  model.save_pretrained(tmp_path)
  os.remove(tmp_path / "model.safetensors")
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  with caplog.at_level("WARNING"):
    bundle = bertjax.load_pretrained(tmp_path)
  assert "weights_only=True" in caplog.text
  batch = reference.example_batch(config["vocab_size"])
  with torch.no_grad():
    expected = model(**_torch_inputs(batch)).logits
  _assert_close(bundle.model().apply({"params": bundle.params}, *batch)["mlm_logits"],
                expected, "MLM logits from a pickle")


# Bad input: every error names the file and the key; nothing is written.

@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("good")
  return _save(reference.reference_model("BertForPreTraining", seed=8,
                                         **SHAPES["L2_H32_A4"]), directory)


def _copy_with(good_dir, target, config_edit=None, tensors_edit=None):
  import shutil
  shutil.copytree(good_dir, target)
  if config_edit:
    path = os.path.join(target, "config.json")
    with open(path) as f:
      values = json.load(f)
    config_edit(values)
    with open(path, "w") as f:
      json.dump(values, f)
  if tensors_edit:
    from safetensors.numpy import save_file
    path = os.path.join(target, "model.safetensors")
    tensors = {k: np.array(v) for k, v in hf.read_safetensors(path).items()}
    tensors_edit(tensors)
    save_file(tensors, path)
  return target


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.pop("hidden_size"), "required key 'hidden_size' is missing"),
    (lambda c: c.update(num_attention_heads="4"), "'num_attention_heads' must be an integer"),
    (lambda c: c.update(num_attention_heads=5), "not divisible by num_heads=5"),
    (lambda c: c.update(model_type="roberta", architectures=["RobertaForMaskedLM"]),
     "unsupported architecture"),
    (lambda c: c.update(position_embedding_type="relative_key"), "relative_key"),
    (lambda c: c.update(hidden_act="mish"), "hidden_act='mish' is not supported"),
])
def test_bad_config_names_file_and_key(good_dir, tmp_path, edit, message):
  bad = _copy_with(good_dir, tmp_path / "bad", config_edit=edit)
  with pytest.raises(ValueError, match=message) as error:
    bertjax.load_pretrained(bad)
  assert "config.json" in str(error.value)


def test_shape_mismatch_names_weight_and_file(good_dir, tmp_path):
  def shrink(tensors):
    tensors["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((36, 32), np.float32)
  bad = _copy_with(good_dir, tmp_path / "bad", tensors_edit=shrink)
  with pytest.raises(ValueError, match=r"model.safetensors: weight "
                     r"bert.encoder.layer.1.intermediate.dense.weight has shape \(36, 32\), "
                     r"but the config needs \(37, 32\)"):
    bertjax.load_pretrained(bad)


def test_missing_weight_names_weight_and_file(good_dir, tmp_path):
  bad = _copy_with(good_dir, tmp_path / "bad", tensors_edit=lambda t: t.pop(
      "bert.encoder.layer.0.attention.self.key.bias"))
  with pytest.raises(ValueError, match="model.safetensors: weight "
                     "bert.encoder.layer.0.attention.self.key.bias .* is missing"):
    bertjax.load_pretrained(bad)


def test_weights_of_more_layers_than_the_config_are_an_error(good_dir, tmp_path):
  bad = _copy_with(good_dir, tmp_path / "bad",
                   config_edit=lambda c: c.update(num_hidden_layers=1))
  with pytest.raises(ValueError, match=r"model.safetensors: encoder weights the config has "
                     r"no place for: bert.encoder.layer.1.*num_layers=1"):
    bertjax.load_pretrained(bad)


def test_causal_masked_lm_exports_as_the_decoder_class(tmp_path):
  import transformers

  config = {**SHAPES["L2_H32_A4"], "is_decoder": True}
  model = reference.reference_model("BertLMHeadModel", seed=9, **config)
  bundle = bertjax.load_pretrained(_save(model, tmp_path / "in"))
  bertjax.export_hf(bundle, tmp_path / "out")
  exported = json.loads((tmp_path / "out" / "config.json").read_text())
  assert exported["architectures"] == ["BertLMHeadModel"] and exported["is_decoder"]
  reloaded, info = transformers.BertLMHeadModel.from_pretrained(tmp_path / "out",
                                                                output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]


def test_vocabulary_larger_than_embedding_table_is_an_error(tmp_path):
  config = {**SHAPES["L2_H32_A4"], "vocab_size": 200}
  bad = _save(reference.reference_model("BertModel", **config), tmp_path)
  with pytest.raises(ValueError, match="tokenizer has 206 tokens but the model's vocab_size "
                     "is 200"):
    bertjax.load_pretrained(bad)


def test_truncated_safetensors_names_file_and_tensor(good_dir, tmp_path):
  bad = _copy_with(good_dir, tmp_path / "bad")
  path = bad / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[:len(data) - 100])
  with pytest.raises(ValueError, match=r"model.safetensors: truncated safetensors file: "
                     r"tensor \S+ needs bytes"):
    bertjax.load_pretrained(bad)
  path.write_bytes(data[:5])
  with pytest.raises(ValueError, match="model.safetensors: truncated safetensors file"):
    bertjax.load_pretrained(bad)


def test_not_a_model_directory(tmp_path):
  with pytest.raises(ValueError, match="not a model directory"):
    bertjax.load_pretrained(tmp_path)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    bertjax.load_pretrained(tmp_path / "nothing")


def test_failed_export_leaves_nothing(good_dir, tmp_path, monkeypatch):
  bundle = bertjax.load_pretrained(good_dir)

  def fail(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr("safetensors.numpy.save_file", fail)
  with pytest.raises(OSError, match="disk full"):
    bertjax.export_hf(bundle, tmp_path / "out")
  assert os.listdir(tmp_path) == []
  with pytest.raises(FileExistsError):
    bertjax.export_hf(bundle, good_dir)


def test_transposed_weights_of_the_right_size_are_refused(good_dir, tmp_path):
  def transpose(tensors):
    name = "bert.encoder.layer.0.intermediate.dense.weight"  # [37, 32] in the reference
    tensors[name] = np.ascontiguousarray(tensors[name].T)
  bad = _copy_with(good_dir, tmp_path / "bad", tensors_edit=transpose)
  with pytest.raises(ValueError, match=r"intermediate.dense.weight has shape \(32, 37\), but "
                     r"the config needs \(37, 32\)"):
    bertjax.load_pretrained(bad)


def test_decoder_must_be_tied_and_its_bias_is_used(good_dir, tmp_path):
  def untie(tensors):
    tensors["cls.predictions.decoder.weight"] = tensors[
        "bert.embeddings.word_embeddings.weight"] + 1
  bad = _copy_with(good_dir, tmp_path / "untied", tensors_edit=untie)
  with pytest.raises(ValueError, match="decoder.weight differs from the word embeddings"):
    bertjax.load_pretrained(bad)

  def only_decoder_bias(tensors):
    tensors["cls.predictions.decoder.bias"] = tensors.pop("cls.predictions.bias")
  moved = _copy_with(good_dir, tmp_path / "moved", tensors_edit=only_decoder_bias)
  np.testing.assert_array_equal(bertjax.load_pretrained(moved).params["mlm"]["bias"],
                                bertjax.load_pretrained(good_dir).params["mlm"]["bias"])

  def different_biases(tensors):
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"] + 1
  bad = _copy_with(good_dir, tmp_path / "biases", tensors_edit=different_biases)
  with pytest.raises(ValueError, match="decoder.bias differs from cls.predictions.bias"):
    bertjax.load_pretrained(bad)


def test_missing_shard_names_the_index(tmp_path):
  model = reference.reference_model("BertForPreTraining", seed=6, **SHAPES["L2_H32_A4"])
  model.save_pretrained(tmp_path, max_shard_size="20KB")
  shard = sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors"))[1]
  os.remove(tmp_path / shard)
  with pytest.raises(FileNotFoundError, match=f"index.json: shard {shard} is missing"):
    bertjax.load_pretrained(tmp_path)


def test_checkpoint_naming_masked_lm_but_holding_both_heads_loads_everything(tmp_path):
  # Google's bert-base-uncased on the Hub: BertForMaskedLM in config.json,
  # the pooler and next-sentence head in the weights.
  import transformers

  config = SHAPES["L2_H32_A4"]
  model = reference.reference_model("BertForPreTraining", seed=14, **config)
  _save(model, tmp_path / "model")
  path = tmp_path / "model" / "config.json"
  path.write_text(path.read_text().replace('"BertForPreTraining"', '"BertForMaskedLM"'))
  bundle = bertjax.load_pretrained(tmp_path / "model")
  assert bundle.task == "pretraining" and bundle.has_summary
  features = bertjax.encode(bundle, ["hello world"])
  batch = {k: torch.tensor(features[k], dtype=torch.long)
           for k in ("input_ids", "attention_mask", "token_type_ids")}
  with torch.no_grad():
    expected = model.bert(**batch).pooler_output
  _assert_close(features["pooled_output"], expected, "pooled output")

  # As a masked LM the pooler stays (for encode) and export leaves it out.
  masked_lm = bertjax.load_pretrained(tmp_path / "model", task="masked_lm")
  assert masked_lm.has_summary
  bertjax.export_hf(masked_lm, tmp_path / "out")
  _, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "out",
                                                         output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]


def test_encoder_without_pooler_loads(tmp_path, caplog):
  import transformers

  model = reference.randomize(transformers.BertModel(
      transformers.BertConfig(**SHAPES["L2_H32_A4"]), add_pooling_layer=False), seed=15)
  _save(model, tmp_path / "model")
  bundle = bertjax.load_pretrained(tmp_path / "model")
  assert bundle.task == "encoder" and not bundle.has_summary
  features = bertjax.encode(bundle, ["hello world"])
  assert "pooled_output" not in features
  with caplog.at_level("WARNING"):
    bertjax.export_hf(bundle, tmp_path / "out")
  assert "no pooler" in caplog.text
  reloaded = transformers.BertModel.from_pretrained(tmp_path / "out", add_pooling_layer=False)
  batch = {k: torch.tensor(features[k], dtype=torch.long)
           for k in ("input_ids", "attention_mask", "token_type_ids")}
  with torch.no_grad():
    torch.testing.assert_close(reloaded.eval()(**batch).last_hidden_state,
                               model(**batch).last_hidden_state, rtol=0, atol=0)


def test_corrupt_pickle_names_the_file(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({**SHAPES["L2_H32_A4"],
                                                    "model_type": "bert"}))
  (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
  with pytest.raises(ValueError, match="pytorch_model.bin: cannot read the PyTorch pickle"):
    bertjax.load_pretrained(tmp_path)
  torch.save({"model": {"weight": torch.zeros(2)}}, tmp_path / "pytorch_model.bin")
  with pytest.raises(ValueError, match="pytorch_model.bin: expected a flat state dict"):
    bertjax.load_pretrained(tmp_path)


def test_tokenizer_settings_follow_the_reference(good_dir, tmp_path):
  import shutil

  import transformers

  directory = _copy_with(good_dir, tmp_path / "Cased_Looking_Name")
  text = "Hello World, Café"
  # A tokenizer_config.json without do_lower_case: transformers lower-cases.
  (directory / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
  bundle = bertjax.load_pretrained(directory)
  assert bundle.tokenizer.tokenize(text) == transformers.BertTokenizer.from_pretrained(
      directory).tokenize(text)
  # Only a tokenizer.json: its normaliser decides (here: cased).
  fast = transformers.BertTokenizer(str(directory / "vocab.txt"), do_lower_case=False)
  fast.save_pretrained(tmp_path / "fast")
  only_json = tmp_path / "only_json"
  shutil.copytree(directory, only_json)
  for name in ("vocab.txt", "tokenizer_config.json"):
    os.remove(only_json / name)
  shutil.copy(tmp_path / "fast" / "tokenizer.json", only_json)
  assert bertjax.load_pretrained(only_json).tokenizer.tokenize(text) == fast.tokenize(text)


def test_load_options_are_checked(good_dir):
  with pytest.raises(ValueError, match=r"cannot override \['num_layers'\]"):
    bertjax.load_pretrained(good_dir, num_layers=1)
  with pytest.raises(ValueError, match="labels are for"):
    bertjax.load_pretrained(good_dir, labels=["a", "b"])


def test_special_tokens_in_text_are_the_tokens_unless_a_directory_says_split(good_dir,
                                                                            tmp_path):
  """"[MASK]" typed in the text is the token in a Hugging Face directory, as
  transformers reads it, and in a bare vocab.txt (a Google directory: as
  transformers reads the Hub's copies of the same weights); only words longer
  than the original's 200 characters or transformers' 100 tell them apart. A
  directory whose tokenizer_config.json says `split_special_tokens` splits
  them, as transformers does, and its export says so again."""
  import shutil

  import transformers

  text = "a [MASK] b " + "x" * 150
  directory = _copy_with(good_dir, tmp_path / "hf")
  (directory / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
  hf_style = bertjax.load_pretrained(directory).tokenizer
  assert hf_style.tokenize(text) == transformers.AutoTokenizer.from_pretrained(
      directory).tokenize(text)
  assert hf_style.tokenize(text)[:3] == ["a", "[MASK]", "b"]
  assert hf_style.tokenize(text)[-1] == "[UNK]"

  google = tmp_path / "google"
  shutil.copytree(directory, google)
  os.remove(google / "tokenizer_config.json")
  original_style = bertjax.load_pretrained(google).tokenizer
  assert original_style.tokenize(text)[:3] == ["a", "[MASK]", "b"]
  assert original_style.tokenize(text)[-1] != "[UNK]"  # 150 characters: pieced
  bertjax.export_hf(bertjax.load_pretrained(google), tmp_path / "exported")
  config = json.loads((tmp_path / "exported" / "tokenizer_config.json").read_text())
  assert config["split_special_tokens"] is False
  exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
  assert exported.tokenize("a [MASK] b") == ["a", "[MASK]", "b"]

  (directory / "tokenizer_config.json").write_text(
      '{"tokenizer_class": "BertTokenizer", "split_special_tokens": true}')
  split = bertjax.load_pretrained(directory)
  pieces = split.tokenizer.tokenize("a [MASK] b")
  assert "[MASK]" not in pieces and pieces[1] == "["
  assert pieces == transformers.AutoTokenizer.from_pretrained(directory).tokenize("a [MASK] b")
  bertjax.export_hf(split, tmp_path / "split_exported")
  assert transformers.AutoTokenizer.from_pretrained(tmp_path / "split_exported").tokenize(
      "a [MASK] b") == pieces
