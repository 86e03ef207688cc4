"""ModernBERT interop: every head equals transformers' `ModernBert*` (PyTorch, float32).

Each reference model gets random weights everywhere (LayerNorm scales too), is
saved with `save_pretrained`, read with `bertjax.load_pretrained`, and run on a
padded batch longer than the local window, so that local and global layers
both matter. Exported directories load into transformers with no missing or
unexpected weights, and compute the same.
"""

import copy
import json

import numpy as np
import pytest
import torch
import transformers

import bertjax
from bertjax import errors
from bertjax.interop import hf, modernbert
from tests import reference

TOLERANCE = 1e-5
LENGTH = 40  # > the local window of 2 * 6 + 1 tokens

# Two shapes: global attention every 3rd layer with a tail layer left over
# (L5: layers 0 and 3 global), and every 2nd (L4) with the original release's
# rotary bases swapped for others.
SHAPES = {
    "L5_H32_A4": dict(vocab_size=150, hidden_size=32, num_hidden_layers=5,
                      num_attention_heads=4, intermediate_size=40,
                      local_attention=12, global_attn_every_n_layers=3),
    "L4_H48_A3": dict(vocab_size=170, hidden_size=48, num_hidden_layers=4,
                      num_attention_heads=3, intermediate_size=64,
                      local_attention=12, global_attn_every_n_layers=2,
                      global_rope_theta=5000.0, local_rope_theta=300.0,
                      hidden_activation="gelu_pytorch_tanh",
                      classifier_activation="gelu_pytorch_tanh"),
}
CLASSES = ["ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
           "ModernBertForTokenClassification", "ModernBertForQuestionAnswering",
           "ModernBertForMultipleChoice"]


def reference_config(shape, pooling="cls", num_labels=3):
  config = transformers.ModernBertConfig(
      **SHAPES[shape], max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
      eos_token_id=2, cls_token_id=1, sep_token_id=2, classifier_pooling=pooling,
      num_labels=num_labels)
  config._attn_implementation = "eager"
  return config


def reference_model(class_name, config, seed=0):
  """A transformers model with every weight random (its LayerNorms' scales too)."""
  config = copy.deepcopy(config)
  if class_name == "ModernBertForQuestionAnswering":
    config.num_labels = 2
  torch.manual_seed(seed)
  model = getattr(transformers, class_name)(config).eval()
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if "norm" in name:
        weight.add_(torch.randn_like(weight) * 0.2)
  return model


def batch(vocab_size, multiple_choice=False, seed=0):
  """[2, LENGTH] ids and a mask with the second row padded after 27 tokens."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab_size, size=(2, LENGTH))
  mask = np.ones((2, LENGTH), np.int64)
  mask[1, 27:] = 0
  ids[1, 27:] = 0
  if multiple_choice:
    ids, mask = np.stack([ids, ids[::-1]], 1), np.stack([mask, mask[::-1]], 1)
  return ids, mask


def reference_outputs(model, ids, mask):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  if isinstance(model, transformers.ModernBertModel):
    return out.last_hidden_state.numpy()
  if isinstance(model, transformers.ModernBertForQuestionAnswering):
    return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
  return out.logits.numpy()


def our_outputs(bundle, ids, mask):
  out = bundle.model().apply({"params": bundle.params}, ids, mask)
  if "start_logits" in out:
    return np.stack([out["start_logits"], out["end_logits"]], -1)
  for key in ("sequence_output", "mlm_logits", "logits"):
    if key in out:
      return np.asarray(out[key])


def assert_close(ours, theirs, mask, what):
  assert ours.shape == theirs.shape, what
  if ours.ndim == 3 and ours.shape[1] == LENGTH:  # per token: real tokens only
    ours, theirs = ours[mask.astype(bool)], theirs[mask.astype(bool)]
  error = np.abs(ours - theirs).max()
  tolerance = TOLERANCE * max(1.0, float(np.abs(theirs).max()))
  assert error <= tolerance, f"{what}: max abs error {error} (tolerance {tolerance})"


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("class_name", CLASSES)
def test_every_class_imports_equal_to_transformers(tmp_path, shape, class_name):
  config = reference_config(shape)
  model = reference_model(class_name, config)
  model.save_pretrained(tmp_path)
  bundle = bertjax.load_pretrained(str(tmp_path))
  assert bundle.task == modernbert.CLASS_TO_TASK[class_name]
  ids, mask = batch(config.vocab_size, class_name.endswith("MultipleChoice"))
  assert_close(our_outputs(bundle, ids, mask), reference_outputs(model, ids, mask),
               mask if ids.ndim == 2 else None, class_name)


@pytest.mark.parametrize("class_name", ["ModernBertForSequenceClassification",
                                        "ModernBertForMultipleChoice"])
def test_mean_pooling_equals_transformers(tmp_path, class_name):
  config = reference_config("L5_H32_A4", pooling="mean")
  model = reference_model(class_name, config, seed=1)
  model.save_pretrained(tmp_path)
  bundle = bertjax.load_pretrained(str(tmp_path))
  assert bundle.config.classifier_pooling == "mean"
  ids, mask = batch(config.vocab_size, class_name.endswith("MultipleChoice"), seed=1)
  assert_close(our_outputs(bundle, ids, mask), reference_outputs(model, ids, mask), None,
               class_name)


def test_a_float32_stream_follows_torch_autocast(tmp_path):
  """ModernBERT trains under `torch.autocast(bfloat16)`, which rounds the
  matmuls' inputs and keeps the residual stream in float32. Over 12 layers,
  bertjax in bfloat16 with `residual_dtype="float32"` comes nearer to
  autocast's logits than with the stream in bfloat16 (on these weights, by a
  third less mean error; equal if the setting did nothing)."""
  shape = dict(SHAPES["L5_H32_A4"], num_hidden_layers=12)
  config = transformers.ModernBertConfig(**{**reference_config("L5_H32_A4").to_dict(),
                                            **shape, "layer_types": None})
  config._attn_implementation = "eager"
  model = reference_model("ModernBertForMaskedLM", config)
  model.save_pretrained(tmp_path)
  ids, mask = batch(config.vocab_size)
  with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    autocast = model(input_ids=torch.tensor(ids),
                     attention_mask=torch.tensor(mask)).logits.float().numpy()
  real = mask.astype(bool)

  def error(**computation):
    bundle = bertjax.load_pretrained(str(tmp_path), dtype="bfloat16", **computation)
    return np.abs(our_outputs(bundle, ids, mask) - autocast)[real].mean()

  assert error(residual_dtype="float32") < 0.8 * error()


def test_local_layers_matter_on_these_rows(tmp_path):
  """The same weights with every layer global give other outputs on the rows
  of these tests: the comparisons above would catch a window left out."""
  config = reference_config("L5_H32_A4")
  model = reference_model("ModernBertModel", config)
  model.save_pretrained(tmp_path)
  bundle = bertjax.load_pretrained(str(tmp_path))
  everywhere = bertjax.load_pretrained(str(tmp_path))
  everywhere.config = everywhere.config.replace(global_attention_every=1)
  ids, mask = batch(config.vocab_size)
  ours = our_outputs(bundle, ids, mask)
  assert np.abs(ours - our_outputs(everywhere, ids, mask)).max() > 1e-3


@pytest.mark.parametrize("class_name", CLASSES)
def test_export_loads_into_transformers_and_round_trips(tmp_path, class_name):
  config = reference_config("L5_H32_A4")
  model = reference_model(class_name, config, seed=2)
  model.save_pretrained(tmp_path / "in")
  bundle = bertjax.load_pretrained(str(tmp_path / "in"))
  bertjax.export_hf(bundle, str(tmp_path / "out"))

  saved = json.loads((tmp_path / "out" / "config.json").read_text())
  assert saved["architectures"] == [class_name]
  loaded, info = getattr(transformers, class_name).from_pretrained(
      tmp_path / "out", output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, mask = batch(config.vocab_size, class_name.endswith("MultipleChoice"))
  assert_close(our_outputs(bundle, ids, mask), reference_outputs(loaded.eval(), ids, mask),
               mask if ids.ndim == 2 else None, class_name)

  again = bertjax.load_pretrained(str(tmp_path / "out"))
  assert again.config == bundle.config and again.task == bundle.task
  for (path, a), (_, b) in zip(*(_leaves(x.params) for x in (again, bundle))):
    np.testing.assert_array_equal(a, b, err_msg=path)


def _leaves(params):
  import jax
  return [(jax.tree_util.keystr(k), np.asarray(v))
          for k, v in jax.tree_util.tree_leaves_with_path(params)]


def test_a_bertjax_model_exports_and_loads_with_the_original_keys(tmp_path):
  """A model made in bertjax (a preset's shape, scanned layers) exports a
  config that transformers reads with both its own keys and the original
  release's (global_attn_every_n_layers, *_rope_theta)."""
  import jax
  import flax.linen as nn

  config = bertjax.BertConfig.from_preset(
      "modernbert_base", num_layers=4, hidden_size=32, num_heads=2, intermediate_size=24,
      vocab_size=90, pad_token_id=0, max_position_embeddings=64, local_attention=8,
      scan_layers=True)
  model = bertjax.models.build_model(config, "masked_lm")
  params = nn.meta.unbox(bertjax.models.init_params(model, jax.random.key(3)))
  assert "layers" in params["bert"]  # scanned: layers_0, one block of 3
  bundle = bertjax.Pretrained(config, params, None, "masked_lm")
  bertjax.export_hf(bundle, str(tmp_path / "out"))
  saved = json.loads((tmp_path / "out" / "config.json").read_text())
  assert saved["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention",
                                  "full_attention"]
  assert (saved["global_attn_every_n_layers"], saved["local_rope_theta"]) == (3, 10000.0)
  loaded = transformers.ModernBertForMaskedLM.from_pretrained(
      tmp_path / "out", attn_implementation="eager").eval()
  ids, mask = batch(90)
  assert_close(our_outputs(bundle, ids, mask), reference_outputs(loaded, ids, mask), mask,
               "exported masked LM")

  original = {k: v for k, v in saved.items() if k not in ("layer_types", "rope_parameters")}
  assert hf.config_from_dict(original, "config.json") == config.replace(scan_layers=False)


def test_the_export_keeps_the_dropout_the_model_trained_with(tmp_path):
  """The recipe's dropout, 0.1 on the attention output alone, survives the
  export and the import (transformers' one `attention_dropout` says the
  probabilities'); transformers loads the file as it is."""
  import jax
  import flax.linen as nn

  config = bertjax.EncoderConfig.from_preset(
      "modernbert_base", num_layers=3, hidden_size=32, num_heads=2, intermediate_size=24,
      vocab_size=90, pad_token_id=0, max_position_embeddings=64, local_attention=8,
      attention_dropout_prob=0.0, attention_output_dropout_prob=0.1, mlp_dropout_prob=0.05)
  model = bertjax.models.build_model(config, "masked_lm")
  params = nn.meta.unbox(bertjax.models.init_params(model, jax.random.key(0)))
  bertjax.export_hf(bertjax.Pretrained(config, params, None, "masked_lm"), str(tmp_path / "out"))
  saved = json.loads((tmp_path / "out" / "config.json").read_text())
  assert (saved["attention_dropout"], saved["attention_output_dropout"],
          saved["mlp_dropout"]) == (0.0, 0.1, 0.05)
  back = hf.config_from_dict(saved, "config.json")
  assert (back.attention_dropout_prob, back.attention_output_dropout) == (0.0, 0.1)
  assert back == config
  transformers.ModernBertForMaskedLM.from_pretrained(tmp_path / "out")


def test_a_classifier_starts_from_the_masked_lm_head(tmp_path):
  """As transformers does, a classifier loaded from a masked LM keeps its
  prediction head (ModernBERT's classifiers read it) and only the output layer
  is new."""
  config = reference_config("L5_H32_A4")
  reference_model("ModernBertForMaskedLM", config).save_pretrained(tmp_path)
  masked_lm = bertjax.load_pretrained(str(tmp_path))
  classifier = bertjax.load_pretrained(str(tmp_path), task="sequence_classification",
                                       labels=["a", "b"])
  np.testing.assert_array_equal(classifier.params["bert"]["head"]["dense"]["kernel"],
                                masked_lm.params["bert"]["head"]["dense"]["kernel"])
  assert classifier.params["classifier"]["kernel"].shape == (32, 2)


@pytest.mark.parametrize("change, message", [
    ({"norm_bias": True}, "norm_bias=True is not supported"),
    ({"mlp_bias": True}, "mlp_bias=True is not supported"),
    ({"classifier_activation": "silu"}, "classifier_activation='silu' differs"),
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention",
                      "sliding_attention", "full_attention"]}, "is not global attention every"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}},
     "rope_type='yarn' is not supported"),
    ({"architectures": ["ModernBertForCausalLM"]}, "unsupported architecture"),
])
def test_configs_bertjax_does_not_build_are_refused(tmp_path, change, message):
  values = reference_config("L5_H32_A4").to_dict()
  values.update(change)
  with pytest.raises(errors.UsageError, match=message):
    hf.config_from_dict(values, "config.json")


TEXTS = reference.BPE_TEXTS


@pytest.mark.parametrize("split", [None, True], ids=["special_tokens_read", "split"])
def test_a_bpe_tokenizer_json_encodes_as_transformers_does(tmp_path, split):
  """Special tokens typed in the text are the tokens, unless the directory's
  tokenizer_config.json says `split_special_tokens`, as transformers reads it;
  an export keeps the setting."""
  vocab_size = reference.write_bpe_tokenizer(tmp_path)
  if split is not None:
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({**settings, "split_special_tokens": split}))
  config = reference_config("L5_H32_A4")
  config.vocab_size = vocab_size
  reference_model("ModernBertForMaskedLM", config).save_pretrained(tmp_path)
  bundle = bertjax.load_pretrained(str(tmp_path))
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
  ours = bundle.tokenizer
  assert type(ours).__name__ == "JsonTokenizer"
  mask = ours.encode(TEXTS[2])
  assert (bundle.tokenizer.mask_id in mask) == (not split)
  for text in TEXTS:
    assert ours.encode(text) == theirs(text)["input_ids"], text
    assert ours.encode(text, "and a second one") == theirs(text, "and a second one")[
        "input_ids"], text
    assert ours.decode(ours.encode(text)) == theirs.decode(theirs(text)["input_ids"],
                                                           skip_special_tokens=True)

  bertjax.export_hf(bundle, str(tmp_path / "out"))
  again = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
  for text in TEXTS:
    assert again(text)["input_ids"] == theirs(text)["input_ids"]
  reloaded = bertjax.load_pretrained(str(tmp_path / "out")).tokenizer
  assert reloaded.encode(TEXTS[1]) == ours.encode(TEXTS[1])
  assert reloaded.encode(TEXTS[2]) == mask
  bertjax.save_pretrained(bundle, str(tmp_path / "model"))  # bertjax's own format keeps it too
  assert bertjax.load_pretrained(str(tmp_path / "model")).tokenizer.encode(TEXTS[2]) == mask


def test_an_unreadable_tokenizer_json_names_the_file(tmp_path):
  (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
  with pytest.raises(errors.UsageError, match="tokenizer.json: not a tokenizer file"):
    hf.load_tokenizer(str(tmp_path))


def test_encode_and_new_heads_on_a_bare_modernbert(tmp_path):
  """`bertjax.encode` runs a ModernBERT encoder as transformers does, and a
  bare ModernBertModel takes a new task head (its prediction head initialised)."""
  vocab_size = reference.write_bpe_tokenizer(tmp_path)
  config = reference_config("L5_H32_A4")
  config.vocab_size = vocab_size
  model = reference_model("ModernBertModel", config)
  model.save_pretrained(tmp_path)
  bundle = bertjax.load_pretrained(str(tmp_path))
  assert not bundle.has_summary
  out = bertjax.encode(bundle, ["The quick brown fox.", "A dog"], ["sat on the mat", ""])
  with torch.no_grad():
    expected = model(input_ids=torch.tensor(out["input_ids"]),
                     attention_mask=torch.tensor(out["attention_mask"])).last_hidden_state
  assert_close(out["sequence_output"], expected.numpy(), out["attention_mask"], "encode")
  answers = bertjax.load_pretrained(str(tmp_path), task="question_answering")
  assert answers.has_summary and "span" in answers.params
