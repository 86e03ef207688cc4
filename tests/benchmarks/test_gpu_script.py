"""benchmarks/gpu.sh, run on this CPU with a tiny model: every line it prints
is JSON, each configuration gives its figures, and it keeps to its budget.

On a GPU the same script compares cuDNN's attention with XLA's and packed rows
with padded ones for BERT-base and BERT-large (docs/benchmarks.md); here
"auto" is XLA's attention, so only the plumbing and the packing are checked.
"""

import json
import os
import re
import subprocess
import sys
import time

from tests.tasks.test_pretrain import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "gpu.sh")


def _run(**settings):
  # The script runs `python` as the device machine's shell finds it: here,
  # the one running the tests, whether or not its environment is entered.
  path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
  env = {**os.environ, "PATH": path, **settings}
  started = time.monotonic()
  result = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
  lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
  return result, lines, time.monotonic() - started


def test_each_configuration_prints_its_figures():
  result, lines, _ = _run(SIZES="bert_tiny 8 4", LENGTHS="128", VOCAB_SIZE="2000")
  assert result.returncode == 0, result.stderr[-3000:]
  assert lines[0]["environment"]["platform"] == "cpu"
  numerics = [line for line in lines if "kernel" in line]
  assert len(numerics) == 16 and not [line for line in numerics if "error" in line], numerics
  assert sorted({line["window"] or 0 for line in numerics}) == [0, 64]  # global and local
  for line in numerics:  # float32 here: the kernels equal softmax attention
    assert line["output_max_error"] < 1e-5 and line["dq_max_error"] < 1e-4, line
  runs = {line["config"]: line for line in lines if "config" in line}
  assert sorted(runs) == ["fused", "packed", "paper"], runs
  for name, line in runs.items():
    assert line["size"] == "bert_tiny" and line["seq_len"] == 128, line
    figures = line.get("result")
    assert figures, line
    assert 0 < figures["mfu"] < 1 and figures["real_tokens_per_s"] > 0, line
    assert figures["real_tokens_per_s"] <= figures["tokens_per_s"] + 1e-6, line
  # Rows of up to three sequences carry less padding than one sequence a row.
  assert runs["packed"]["result"]["padding"] < runs["paper"]["result"]["padding"] / 2
  assert "total_s" in lines[-1]


def test_the_budget_holds_when_a_step_would_overrun_it():
  """Three seconds: the steps after the environment line get what is left (at
  least 1 s) and are stopped there, each saying so."""
  result, lines, seconds = _run(SIZES="bert_tiny 8 4", LENGTHS="128", VOCAB_SIZE="2000",
                                BUDGET_S="3")
  assert seconds < 30, seconds
  assert result.returncode == 1
  assert re.fullmatch(r"preparing the demo data timed out after \d+ s", lines[-1]["error"]), lines
  assert not [line for line in lines if "config" in line]  # no run started
