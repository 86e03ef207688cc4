"""`python -m bertjax.tools.config_fields`: every field of every shipped
config says what it does, and docs/configs.md's tables are its output."""

import os
import re
import subprocess
import sys

import pytest

from bertjax import config_meanings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = ["base_pretrain", "base_pretrain:ltr", "large_pretrain", "demo", "modernbert_pretrain",
           "modernbert_pretrain:large", "modernbert_demo", "glue:cola", "glue:stsb", "demo_finetune",
           "squad:v1.1", "squad:v2.0", "swag", "ner", "ner_features:concat_last_four"]


def test_the_specs_name_every_shipped_config():
  files = {name[:-3] for name in os.listdir(os.path.join(ROOT, "configs"))
           if name.endswith(".py") and name not in ("__init__.py", "common.py")}
  assert files == {spec.split(":")[0] for spec in SHIPPED}


@pytest.mark.parametrize("spec", SHIPPED)
def test_every_field_says_what_it_does(spec):
  known = config_meanings.meanings(spec)
  silent = [field for field, _ in config_meanings.leaves(config_meanings.load(spec))
            if not config_meanings.meaning(field, known)]
  assert not silent, f"configs/{spec}: no comment says what {silent} do"


def test_the_docs_tables_are_the_commands_output():
  text = open(os.path.join(ROOT, "docs", "configs.md"), encoding="utf-8").read()
  tables = re.search(r"<!-- fields: begin -->\n(.*)<!-- fields: end -->", text, re.S).group(1)
  assert tables == config_meanings.docs_tables(), (
      "docs/configs.md is out of step with the configs: paste in the output of "
      "python -m bertjax.tools.config_fields --docs")


def test_a_comment_is_read_from_its_line_or_the_block_above(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text(
      "from bertjax.configs import glue\n\n\ndef get_config(arg=None):\n"
      "  config = glue.get_config('mrpc')\n"
      "  # Mine, in two\n  # lines.\n  config.train.epochs = 5.0\n"
      "  config.train.batch_size = 16  # mine too\n  return config\n")
  known = config_meanings.meanings(str(path))
  assert known["train.epochs"] == "Mine, in two lines."
  assert known["train.batch_size"] == "mine too"
  assert known["train.learning_rate"].startswith("the peak")  # common.py's finetune_config
  assert known["model.dtype"].startswith("computation")


def test_the_command_lists_a_configs_fields(tmp_path):
  # --config, as every command that reads a config; --config_path, its earlier name, too.
  for flag in ("--config", "--config_path"):
    result = subprocess.run([sys.executable, "-m", "bertjax.tools.config_fields",
                             f"{flag}=configs/glue.py:mrpc"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "data.task = 'mrpc'  # The GLUE task: the config's argument." in result.stdout
  result = subprocess.run([sys.executable, "-m", "bertjax.tools.config_fields",
                           "--config=configs/dmeo.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith(f"error: --config=configs/dmeo.py: no such file under {tmp_path} "
                         "(did you mean configs/demo.py?); the shipped configs are "), line
