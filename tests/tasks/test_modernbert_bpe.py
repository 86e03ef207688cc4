"""A ModernBERT pre-trained with a byte-level BPE, end to end through the
command line: the tokenizer (trained by `train_vocab --model=bpe`, or laid out
as ModernBERT's released one), the data build, a few steps of
configs/modernbert_pretrain.py scaled down, and the export to transformers,
whose `ModernBertForMaskedLM` and fast tokenizer give what bertjax gives."""

import json
import os
import sys

import numpy as np
import pytest

from tests.data.test_builder import _modernbert_layout_tokenizer
from tests.data.test_vocabulary import HARD_TEXT
from tests.tasks.test_pretrain import ROOT, _env, _run


def _tiny_run(workdir, data_dir, vocab_size):
  settings = {
      "data.dir": data_dir, "data.vocab_size": vocab_size, "model.vocab_size": vocab_size,
      "model.hidden_size": 32, "model.num_layers": 3, "model.num_heads": 2,
      "model.intermediate_size": 48, "model.max_position_embeddings": 256,
      "model.local_attention": 8, "model.dtype": "float32", "train.batch_size": 8,
      "train.batch_ramp_steps": 0, "train.total_steps": 6, "train.max_seq_length": 32,
      "train.max_predictions": 23, "train.long_from_step": -1, "optimizer.warmup_steps": 2,
      "optimizer.decay_steps": 2, "checkpoint.every_steps": 6, "eval.every_steps": 6,
      "eval.batches": 1, "eval.batch_size": 8}
  return ([sys.executable, "-m", "bertjax.main", "--config=configs/modernbert_pretrain.py",
           f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in settings.items()])


@pytest.mark.parametrize("made_by", ["train_vocab", "modernbert_layout"])
def test_a_bpe_prepares_pretrains_and_exports_a_modernbert(tmp_path, made_by):
  import tokenizers
  import torch
  import transformers

  import bertjax

  tokenizer = tmp_path / "tokenizer.json"
  if made_by == "train_vocab":
    _run([sys.executable, "-m", "bertjax.tools.train_vocab", "--input=demo:stdlib",
          f"--output={tokenizer}", "--model=bpe", "--vocab_size=2000"], _env(1))
    vocab_size = 2000
  else:
    from bertjax.data import vocabulary

    _, vocab_size = _modernbert_layout_tokenizer(
        tokenizer, list(vocabulary.sentences("demo:stdlib"))[:5000])
  data_dir, workdir, exported = (str(tmp_path / n) for n in ("data", "run", "hf"))
  _run([sys.executable, "-m", "bertjax.tools.prepare_pretraining_data", "--input=demo:stdlib",
        f"--vocab={tokenizer}", f"--output_dir={data_dir}", "--num_shards=2",
        "--num_workers=1"], _env(1))
  result = _run(_tiny_run(workdir, data_dir, vocab_size), _env(1))
  assert "Done: 6 steps" in result.stderr
  _run([sys.executable, "-m", "bertjax.tools.convert", f"--input={workdir}", "--to=hf",
        f"--output={exported}"], _env(1))

  bundle = bertjax.load_pretrained(workdir)
  trained = tokenizers.Tokenizer.from_file(str(tokenizer))
  theirs_tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
  assert json.load(open(os.path.join(exported, "tokenizer.json")))["model"]["type"] == "BPE"
  for text in HARD_TEXT:
    ours = bundle.tokenizer.encode(text)
    assert ours == theirs_tokenizer(text)["input_ids"]
    assert ours[1:-1] == trained.encode(text, add_special_tokens=False).ids
  model = transformers.AutoModelForMaskedLM.from_pretrained(exported,
                                                            attn_implementation="eager")
  assert type(model).__name__ == "ModernBertForMaskedLM"
  ids = bundle.tokenizer.encode(HARD_TEXT[1], HARD_TEXT[2])
  ours = bundle.model().apply({"params": bundle.params}, np.asarray([ids]))["mlm_logits"]
  with torch.no_grad():
    theirs = model(torch.tensor([ids])).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)
  assert os.path.isdir(ROOT)
