"""`bertjax.encode` against the reference model and tokenizer."""

import os

import numpy as np
import pytest
import torch

import bertjax
from tests import reference

CONFIG = dict(vocab_size=210, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=40, max_position_embeddings=64, type_vocab_size=2)
TEXTS = ["The quick brown fox jumped over the lazy dog!", "hello", "Café résumé 東京",
         "unaffable tokenizers", "world " * 20]
PAIRS = ["hello world", "the dog", "world", "naive", "fox"]


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("model")
  model = reference.reference_model("BertModel", seed=31, **CONFIG)
  model.save_pretrained(directory)
  reference.write_vocab(os.path.join(directory, "vocab.txt"))
  (directory / "tokenizer_config.json").write_text('{"do_lower_case": true}')
  return directory, model


@pytest.mark.parametrize("pairs", [None, PAIRS])
def test_encode_matches_reference(reference_dir, pairs):
  import transformers

  directory, model = reference_dir
  bundle = bertjax.load_pretrained(directory)
  out = bertjax.encode(bundle, TEXTS, pairs, max_length=32, batch_size=2)
  tokenizer = transformers.BertTokenizer.from_pretrained(directory)
  expected_inputs = tokenizer(TEXTS, pairs, max_length=32, truncation=True, padding=True,
                              return_tensors="pt")
  length = expected_inputs["input_ids"].shape[1]
  assert out["input_ids"].shape[1] % 8 == 0 and out["input_ids"].shape[1] >= length
  for name in ("input_ids", "attention_mask", "token_type_ids"):
    np.testing.assert_array_equal(out[name][:, :length], expected_inputs[name].numpy())
    assert not out[name][:, length:].any()

  inputs = {k: torch.tensor(out[k], dtype=torch.long)
            for k in ("input_ids", "attention_mask", "token_type_ids")}
  with torch.no_grad():
    expected = model(**inputs, output_hidden_states=True)
  np.testing.assert_allclose(out["sequence_output"], expected.last_hidden_state, atol=1e-5)
  np.testing.assert_allclose(out["pooled_output"], expected.pooler_output, atol=1e-5)
  assert out["hidden_states"].shape == (3, len(TEXTS), out["input_ids"].shape[1], 32)
  for layer, hidden in enumerate(expected.hidden_states):
    np.testing.assert_allclose(out["hidden_states"][layer], hidden, atol=1e-5)


def test_encode_single_text_and_no_pooler(reference_dir, tmp_path):
  directory, _ = reference_dir
  bundle = bertjax.load_pretrained(directory)
  one = bertjax.encode(bundle, "hello world", output_hidden_states=False)
  assert one["sequence_output"].shape == (1, 8, 32) and "hidden_states" not in one
  many = bertjax.encode(bundle, ["hello world", "the quick brown fox"])
  np.testing.assert_allclose(many["sequence_output"][0, :4], one["sequence_output"][0, :4],
                             atol=1e-6)

  model = reference.reference_model("BertForQuestionAnswering", seed=32, **CONFIG)
  model.save_pretrained(tmp_path)
  reference.write_vocab(os.path.join(tmp_path, "vocab.txt"))
  qa = bertjax.encode(bertjax.load_pretrained(tmp_path), ["hello"])
  assert "pooled_output" not in qa and qa["sequence_output"].shape == (1, 8, 32)
