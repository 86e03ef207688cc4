"""benchmarks/modernbert_vs_bert.py: both runs are the configs users run, with
overrides that every config takes, at the same size."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import modernbert_vs_bert  # noqa: E402  (a script, not a package)
from tests.benchmarks.commands import config_of  # noqa: E402


@pytest.mark.parametrize("recipe", list(modernbert_vs_bert.RECIPES))
def test_each_run_is_a_valid_config_of_the_same_size(recipe, tmp_path):
  from bertjax.models import EncoderConfig
  from bertjax.tasks import pretrain

  args = modernbert_vs_bert.command(recipe, str(tmp_path), str(tmp_path / "data"), 500)
  config = config_of(args)
  pretrain.validate(config, 1)
  bert = EncoderConfig.from_run_config(config)
  assert (bert.num_layers, bert.hidden_size, bert.num_heads) == (4, 256, 4)
  assert bert.family == recipe
  feed_forward = (3 if recipe == "modernbert" else 2) * bert.hidden_size * bert.intermediate_size
  assert feed_forward == pytest.approx(2 * 256 * 1024, rel=0.02)  # the same weights
