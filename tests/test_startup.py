"""Commands start at once: `--help`, a flag mistake and the data tools load
no JAX, Flax or TensorFlow (seconds of imports before the first byte read)."""

import subprocess
import sys

import pytest

HEAVY = ("jax", "flax", "optax", "orbax", "tensorflow", "torch", "transformers")

# Run a command's module as `python -m` does, then list the heavy packages loaded.
_PROBE = """
import runpy, sys
sys.argv = [sys.argv[1]] + sys.argv[2:]
try:
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit:
  pass
print("loaded:", *(m for m in {heavy} if m in sys.modules))
"""


def _loaded(module, *args):
  result = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), module, *args],
                          capture_output=True, text=True, timeout=120)
  (line,) = [line for line in result.stdout.splitlines() if line.startswith("loaded:")]
  return line.removeprefix("loaded:").strip()


@pytest.mark.parametrize("module", [
    "bertjax.main", "bertjax.tools.convert", "bertjax.tools.prepare_pretraining_data",
    "bertjax.tools.train_vocab", "bertjax.tools.evaluate_squad", "bertjax.tools.sweep",
    "bertjax.tools.compile", "bertjax.tools.ship_log", "bertjax.tools.benchmark",
    "bertjax.tools.benchmark_data"])
def test_help_loads_no_framework(module):
  assert _loaded(module, "--help") == ""


def test_a_flag_mistake_is_said_before_jax_starts():
  assert _loaded("bertjax.main", "--config=configs/demo.py", "--workdir=/tmp/x",
                 "--config.train.bogus=1") == ""


@pytest.mark.parametrize("module", ["bertjax.tools.prepare_pretraining_data",
                                    "bertjax.tools.train_vocab", "bertjax.data.builder",
                                    "bertjax.data.tokenizers"])
def test_the_data_tools_import_no_framework(module):
  result = subprocess.run(
      [sys.executable, "-c", f"import sys, {module}; "
       f"print(' '.join(m for m in {HEAVY} if m in sys.modules))"],
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == ""


def test_the_public_api_is_there_when_used():
  import bertjax

  assert set(bertjax.__all__) <= set(dir(bertjax))
  assert bertjax.load_pretrained.__module__ == "bertjax.pretrained"
  with pytest.raises(AttributeError, match="no attribute 'nothing'"):
    bertjax.nothing  # pylint: disable=pointless-statement
