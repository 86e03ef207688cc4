"""`python -m bertjax.tools.convert` both ways, from the shell."""

import os
import subprocess
import sys

import numpy as np
import torch

from tests import reference

CONFIG = dict(vocab_size=210, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=40, max_position_embeddings=40, type_vocab_size=2)


def _convert(*args):
  return subprocess.run([sys.executable, "-m", "bertjax.tools.convert", *args],
                        capture_output=True, text=True, timeout=300)


def test_hf_to_bertjax_to_hf(tmp_path):
  import transformers

  model = reference.reference_model("BertForTokenClassification", seed=41, num_labels=4,
                                    **CONFIG)
  model.config.id2label = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC"}
  model.config.label2id = {v: k for k, v in model.config.id2label.items()}
  model.save_pretrained(tmp_path / "hf")
  reference.write_vocab(os.path.join(tmp_path / "hf", "vocab.txt"))

  result = _convert(f"--input={tmp_path / 'hf'}", f"--output={tmp_path / 'bj'}")
  assert result.returncode == 0, result.stderr
  assert "token_classification model, L=2 H=32 A=4" in result.stdout
  assert os.path.isfile(tmp_path / "bj" / "bertjax.json")
  result = _convert(f"--input={tmp_path / 'bj'}", f"--output={tmp_path / 'back'}")
  assert result.returncode == 0, result.stderr

  back = transformers.BertForTokenClassification.from_pretrained(tmp_path / "back")
  assert back.config.id2label == model.config.id2label
  batch = {k: torch.tensor(v) for k, v in zip(
      ("input_ids", "attention_mask", "token_type_ids"), reference.example_batch(210))}
  with torch.no_grad():
    np.testing.assert_array_equal(back.eval()(**batch).logits, model(**batch).logits)


def test_bad_input_is_a_message_and_writes_nothing(tmp_path):
  (tmp_path / "empty").mkdir()
  result = _convert(f"--input={tmp_path / 'empty'}", f"--output={tmp_path / 'out'}")
  assert result.returncode == 2
  assert result.stderr.startswith("error: ") and "not a model directory" in result.stderr
  assert "Traceback" not in result.stderr
  assert sorted(os.listdir(tmp_path)) == ["empty"]
