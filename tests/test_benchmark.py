"""The benchmark script runs and reports consistent figures."""

import json
import subprocess
import sys


def test_benchmark_prints_one_json_line():
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.benchmark", "--layers=1", "--hidden=64", "--heads=2",
       "--vocab=500", "--seq_len=32", "--batch=8", "--steps=3", "--warmup=1"],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  lines = [line for line in result.stdout.splitlines() if line.strip()]
  assert len(lines) == 1
  figures = json.loads(lines[0])
  for key in ("tokens_per_s", "step_s_median", "compile_s", "flops_per_token", "mfu",
              "tflops_per_s_per_device", "peak_tflops_per_device"):
    assert figures[key] > 0, key
  assert figures["max_predictions"] == 5  # 15% of 32, rounded up
  assert abs(figures["tokens_per_s"] * figures["step_s_median"] / (8 * 32) - 1) < 1e-3
  expected_mfu = figures["tflops_per_s_per_device"] / figures["peak_tflops_per_device"]
  assert abs(figures["mfu"] - expected_mfu) < 1e-3
  assert figures["final_loss"] > 0
