"""The README's Python example runs as written (on a small reference model)."""

import os
import re

from tests import reference

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_python_example_runs(tmp_path, monkeypatch):
  text = open(README, encoding="utf-8").read()
  example = re.search(r"## Extract features\n.*?```python\n(.*?)```", text, re.S).group(1)
  model_dir = tmp_path / "bert-base-uncased"
  model = reference.reference_model("BertForPreTraining", vocab_size=210, hidden_size=32,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=40)
  model.save_pretrained(model_dir)
  reference.write_vocab(str(model_dir / "vocab.txt"))
  monkeypatch.chdir(tmp_path)
  namespace = {}
  exec(example.replace("path/to/bert-base-uncased", str(model_dir)), namespace)
  assert namespace["features"]["hidden_states"].shape[:2] == (3, 2)
  assert namespace["logits"]["logits"].shape == (1, 2)
  assert os.path.isfile(tmp_path / "my_model" / "bertjax.json")
  assert os.path.isfile(tmp_path / "my_model_hf" / "model.safetensors")
