"""Every fine-tuning task with a ModernBERT model, through the same configs as
BERT's: from a bertjax ModernBERT pre-training run (WordPiece vocabulary) and
from a transformers ModernBERT directory with a byte-level BPE tokenizer.
Each fine-tuned model learns its small task, and the classifiers export to
transformers' `ModernBertFor*` classes with the same outputs.
"""

import json
import os

import numpy as np
import pytest

from tests import reference
from tests.tasks.finetuning import tiny_config
from tests.tasks.test_glue import write_rte, write_sst2
from tests.tasks.test_ner import write_conll_dir
from tests.tasks.test_squad import write_squad
from tests.tasks.test_swag import write_swag_dir


@pytest.fixture(scope="module")
def modernbert_run(prepared_dir, tmp_path_factory):
  """A short bertjax ModernBERT pre-training run (configs/modernbert_pretrain.py
  at L3/H32, one phase, no batch warmup) on the test vocabulary."""
  from bertjax.configs import modernbert_pretrain
  from bertjax.tasks import pretrain

  config = modernbert_pretrain.get_config()
  config.data.dir, config.data.vocab_size = prepared_dir, 210
  config.model.update(vocab_size=210, hidden_size=32, num_layers=3, num_heads=2,
                      intermediate_size=48, max_position_embeddings=64, local_attention=8,
                      dtype="float32", vocab_pad_multiple=1)
  config.train.update(batch_size=8, batch_ramp_steps=0, max_seq_length=32, max_predictions=23,
                      long_from_step=-1, total_steps=20)
  config.optimizer.update(warmup_steps=2, decay_steps=5)
  config.eval.every_steps, config.eval.batch_size = 0, 8
  workdir = str(tmp_path_factory.mktemp("modernbert_run"))
  pretrain.run(config, workdir)
  return workdir


@pytest.fixture(scope="module")
def modernbert_hf(tmp_path_factory):
  """transformers' ModernBertModel (L3/H32, random weights) saved with a
  byte-level BPE `tokenizer.json`, as ModernBERT's released directories are."""
  import torch
  import transformers

  directory = tmp_path_factory.mktemp("modernbert_hf")
  vocab_size = reference.write_bpe_tokenizer(directory)
  config = transformers.ModernBertConfig(
      vocab_size=vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
      intermediate_size=48, max_position_embeddings=128, local_attention=8,
      pad_token_id=3, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
  torch.manual_seed(0)  # the same weights in every process: the thresholds below hold for them
  transformers.ModernBertModel(config).save_pretrained(directory)
  return str(directory)


def _logits_agree(model_dir, hf_class, ids, keys=("logits",)):
  """bertjax's outputs `keys` of the model in `model_dir` equal transformers'
  `hf_class` loaded from its export."""
  import torch
  import transformers

  import bertjax

  bundle = bertjax.load_pretrained(model_dir)
  out = model_dir + "_hf"
  bertjax.export_hf(bundle, out)
  theirs = getattr(transformers, hf_class).from_pretrained(out, attn_implementation="eager")
  ours = bundle.model().apply({"params": bundle.params}, np.asarray([ids]))
  with torch.no_grad():
    ids = torch.tensor([ids])
    outputs = theirs(ids, attention_mask=torch.ones_like(ids))  # mean pooling reads it
  for name in keys:
    np.testing.assert_allclose(np.asarray(ours[name]), getattr(outputs, name).numpy(),
                               atol=1e-5, err_msg=name)
  return bundle


def _glue(task, write, checkpoint, max_seq_length, tmp_path):
  """Fine-tunes GLUE `task` on data made by `write`; its results."""
  from bertjax.configs import glue as glue_config
  from bertjax.tasks import glue

  data = str(tmp_path / task)
  write(data)
  config = tiny_config(glue_config.get_config(task), checkpoint, max_seq_length,
                       **{"data.dir": data, "train.epochs": 4.0})
  return glue.run(config, str(tmp_path / "run"))


def test_glue_from_a_modernbert_pretraining_run(modernbert_run, tmp_path):
  result = _glue("sst2", write_sst2, modernbert_run, 16, tmp_path)
  assert result["dev"]["accuracy"] > 95.0, result
  bundle = _logits_agree(str(tmp_path / "run" / "model"), "ModernBertForSequenceClassification",
                         [1, 20, 30, 40, 2])
  assert bundle.config.family == "modernbert" and bundle.config.classifier_pooling == "mean"


def test_glue_pairs_from_a_transformers_directory(modernbert_hf, tmp_path):
  """RTE's pairs are joined without token types (ModernBERT has none); the
  classifier pools as the checkpoint's config says."""
  result = _glue("rte", write_rte, modernbert_hf, 48, tmp_path)
  assert result["dev"]["accuracy"] > 90.0, result
  bundle = _logits_agree(str(tmp_path / "run" / "model"), "ModernBertForSequenceClassification",
                         [1, 20, 30, 2, 40, 50, 2])
  assert bundle.config.classifier_pooling == "cls"  # transformers' default, as saved


def test_squad_from_a_transformers_directory(modernbert_hf, tmp_path):
  from bertjax.configs import squad as squad_config
  from bertjax.tasks import squad

  train = write_squad(tmp_path / "train.json", 400, 0, "1.1")
  dev = write_squad(tmp_path / "dev.json", 100, 1, "1.1")
  config = tiny_config(squad_config.get_config("v1.1"), modernbert_hf, 96,
                       **{"doc_stride": 32, "max_query_length": 16,
                          "data.train_file": train, "data.predict_file": dev})
  results = squad.run(config, str(tmp_path / "run"))
  assert results["dev"]["exact_match"] > 90.0, results
  _logits_agree(str(tmp_path / "run" / "model"), "ModernBertForQuestionAnswering",
                [1, 20, 30, 2, 40, 50, 60, 2], ("start_logits", "end_logits"))


def test_ner_from_a_transformers_directory(modernbert_hf, tmp_path):
  from bertjax.configs import ner as ner_config
  from bertjax.tasks import ner

  data = write_conll_dir(tmp_path / "conll")
  config = tiny_config(ner_config.get_config(), modernbert_hf, 64, **{"data.dir": str(data)})
  results = ner.run(config, str(tmp_path / "run"))
  assert results["dev"]["f1"] > 90.0 and results["test"]["f1"] > 90.0, results
  _logits_agree(str(tmp_path / "run" / "model"), "ModernBertForTokenClassification",
                [1, 20, 30, 40, 2])


def test_swag_from_a_modernbert_pretraining_run(modernbert_run, tmp_path):
  from bertjax.configs import swag as swag_config
  from bertjax.tasks import swag

  data = write_swag_dir(tmp_path / "swag")
  config = tiny_config(swag_config.get_config(), modernbert_run, 24,
                       **{"data.dir": str(data), "train.batch_size": 16})
  results = swag.run(config, str(tmp_path / "run"))
  assert results["dev"]["accuracy"] > 90.0, results
  saved = json.load(open(os.path.join(str(tmp_path / "run"), "results.json")))
  assert saved["dev"] == results["dev"]
  _logits_agree(str(tmp_path / "run" / "model"), "ModernBertForMultipleChoice",
                [[1, 20, 30, 2, 40, 2], [1, 20, 30, 2, 50, 2]])
