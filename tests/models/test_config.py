"""Model sizes and config validation."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.models import PRESETS, EncoderConfig, BertForPreTraining, BertModel, abstract_params


def _count(model) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.meta.unbox(
      abstract_params(model))))


def _reference_count(class_name: str, preset: dict) -> int:
  import torch
  import transformers

  config = transformers.BertConfig(
      hidden_size=preset["hidden_size"], num_hidden_layers=preset["num_layers"],
      num_attention_heads=preset["num_heads"], intermediate_size=preset["intermediate_size"])
  with torch.device("meta"):
    model = getattr(transformers, class_name)(config)
  return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["bert_base", "bert_large", "bert_tiny", "bert_L6_H512",
                                  "table6_L6_H768_A3"])
def test_parameter_counts_match_reference(name):
  config = EncoderConfig.from_preset(name)
  assert _count(BertModel(config)) == _reference_count("BertModel", PRESETS[name])
  assert _count(BertForPreTraining(config)) == _reference_count("BertForPreTraining",
                                                                PRESETS[name])


def test_paper_sizes():
  # "BERT-base (L=12, H=768, A=12, Total Parameters=110M) and BERT-large (L=24,
  # H=1024, A=16, Total Parameters=340M)".
  assert round(_count(BertModel(EncoderConfig.from_preset("bert_base"))) / 1e6) == 109
  assert round(_count(BertModel(EncoderConfig.from_preset("bert_large"))) / 1e6) == 335
  small = [name for name in PRESETS if name.startswith("bert_L")]
  assert len(small) == 24
  assert PRESETS["bert_L12_H768"] == PRESETS["bert_base"]
  assert PRESETS["bert_mini"] == dict(num_layers=4, hidden_size=256, num_heads=4,
                                      intermediate_size=1024)
  table6 = sorted((p["num_layers"], p["hidden_size"], p["num_heads"])
                  for name, p in PRESETS.items() if name.startswith("table6"))
  assert table6 == [(3, 768, 12), (6, 768, 3), (6, 768, 12), (12, 768, 12), (12, 1024, 16),
                    (24, 1024, 16)]


@pytest.mark.parametrize("fields,message", [
    (dict(hidden_size=100, num_heads=12), "hidden_size=100 is not divisible by num_heads=12"),
    (dict(num_layers=0), "num_layers must be a positive integer"),
    (dict(hidden_act="mish"), "hidden_act='mish' is not one of"),
    (dict(dtype="float8"), "dtype='float8'"),
    (dict(remat_policy="sometimes"), "remat_policy='sometimes'"),
    (dict(attention_impl="flash"), "attention_impl='flash'"),
    (dict(hidden_dropout_prob=1.0), "hidden_dropout_prob must be in"),
    (dict(attention_impl="cudnn"), "attention_impl='cudnn' needs dtype"),
])
def test_invalid_configs_say_what_to_change(fields, message):
  with pytest.raises(ValueError, match=message):
    EncoderConfig(**fields)


def test_unknown_preset_and_keys():
  with pytest.raises(ValueError, match="Unknown model preset 'bert_huge'"):
    EncoderConfig.from_preset("bert_huge")
  with pytest.raises(ValueError, match=r"file.json: unknown EncoderConfig keys \['hiden_size'\]"):
    EncoderConfig.from_dict({"hiden_size": 3}, "file.json")
  config = EncoderConfig.from_preset("bert_small", dtype="bfloat16")
  assert EncoderConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("name, says", [
    # The example: BERT-tiny's pre-training model, heads included.
    ("bert_tiny", "BERT tiny (L2/H128/A2, 4.4M parameters)"),
    ("bert_large", "BERT large (L24/H1024/A16, 336.2M parameters)"),
    ("bert_L4_H256", "BERT mini (L4/H256/A4, 11.3M parameters)"),
])
def test_a_model_is_described_by_family_size_and_parameters(name, says):
  config = EncoderConfig.from_preset(name)
  assert config.describe(_count(BertForPreTraining(config))) == says


def test_a_shape_without_a_size_name_is_described_by_its_shape():
  assert EncoderConfig.from_preset("modernbert_base").describe() == (
      "ModernBERT base (L22/H768/A12)")
  # No preset of its family has the shape (nor one named by its shape).
  assert EncoderConfig.from_preset("table6_L6_H768_A3").describe(1_000) == (
      "BERT (L6/H768/A3, 1.0k parameters)")
  assert EncoderConfig.from_preset("modernbert_base", num_layers=4, hidden_size=128,
                                   num_heads=2, intermediate_size=192).describe(999) == (
      "ModernBERT (L4/H128/A2, 999 parameters)")
