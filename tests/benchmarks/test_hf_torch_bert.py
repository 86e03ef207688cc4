"""benchmarks/hf_torch_bert.py: the PyTorch peer's step runs and says what it ran."""

import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_pytorch_peer_trains_and_prints_one_json_line():
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "hf_torch_bert.py"), "--layers=1",
       "--hidden=32", "--heads=2", "--vocab=100", "--seq_len=16", "--batch=4", "--steps=3",
       "--warmup=1"], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  figures = json.loads(result.stdout.strip().splitlines()[-1])
  assert figures["attention"] == "sdpa" and figures["max_predictions"] == 3
  assert figures["tokens_per_s"] > 0 and math.isfinite(figures["final_loss"])
  # MLM over 100 tokens plus NSP, from a random start: about ln(100) + ln(2).
  assert 3.0 < figures["final_loss"] < 7.0
