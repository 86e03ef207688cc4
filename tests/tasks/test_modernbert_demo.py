"""configs/modernbert_demo.py as a newcomer runs it, shortened: it trains its
byte-level BPE on the demo corpus, prepares the data, pre-trains a
ModernBERT, says what it reached and what to do next; the workdir's
vocabulary is then the data's, and a rerun asking for another kind is refused."""

import json
import os
import sys

from bertjax import cpu_load, pace
from tests.tasks.test_pretrain import ROOT, _env, _run

XLA_ONE_DEVICE = "--xla_force_host_platform_device_count=1"

SHORT = ["--config.train.total_steps=40", "--config.train.batch_ramp_steps=12",
         "--config.optimizer.warmup_steps=10", "--config.optimizer.decay_steps=10",
         "--config.eval.every_steps=40", "--config.eval.batches=2",
         "--config.checkpoint.every_steps=40"]


def test_the_modernbert_demo_trains_its_bpe_and_its_model(tmp_path):
  import subprocess

  import tokenizers

  workdir = str(tmp_path / "demo")
  command = [sys.executable, "-m", "bertjax.main", "--config=configs/modernbert_demo.py",
             f"--workdir={workdir}"]
  # XLA's own code generation, as a user's run has it: a step whose quiet
  # speed was measured (bertjax.pace), on a CPU of the cores measured.
  result = _run(command + SHORT, {**_env(1), "XLA_FLAGS": XLA_ONE_DEVICE})
  log = result.stderr
  assert "Training a 8000-token byte-level BPE vocabulary on demo:stdlib" in log
  assert "Batch-size warmup: 8, 16, ... 24 a step over steps 0-12, then 32" in log
  assert "Training ModernBERT (L4/H128/A2, " in log
  # The first line's rates are of its ten steps, 8, 8, 8, 8, 16, 16, 16, 16,
  # 24 and 24 rows, not ten of the last one's 24: its tokens/s (padding
  # included) hold the same real tokens as the last line's, whose steps are
  # those of the whole run.
  lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))
           if '"train/eta_s"' in line]
  first, last = lines[0], lines[-1]
  assert (first["step"], last["step"]) == (10, 40)
  assert abs(first["train/padding"] - last["train/padding"]) < 0.1, (first, last)
  # Its time left counts the warmup's larger batches: steps 10 and 11 of 24
  # rows, 28 of 32, at the speed of its rows (and more: the evaluation, a
  # compile), not 30 steps at that speed.
  assert first["train/eta_s"] > 128 * (2 * 24 + 28 * 32) / first["train/tokens_per_s"]
  # It says what to expect on this CPU (once its peak was measured quiet),
  # and how far from it the run is.
  line = next(line for line in log.splitlines() if "step 10/40 " in line)
  known = cpu_load.cores() == next(step.cores for step in pace.QUIET_STEPS)
  expected = "expected on this CPU (~" in line
  assert (expected or "no rate expected on this CPU yet" in line) == known, line
  assert ("train/expected_sequences_per_s" in first) == expected
  assert first["train/other_processes_cores"] >= 0
  assert "Held-out at step 40: mlm_loss" in log
  assert f"python -m bertjax.tools.convert --input={workdir} --to=hf" in log
  # The workdir's tokenizer is a byte-level BPE, and the data's.
  backend = tokenizers.Tokenizer.from_file(os.path.join(workdir, "tokenizer.json"))
  assert json.loads(backend.to_str())["model"]["type"] == "BPE"
  assert not os.path.exists(os.path.join(workdir, "vocab.txt"))
  info = json.load(open(os.path.join(workdir, "data", "dataset_info.json")))
  assert info["tokenizer"]["type"] == "tokenizer_json"
  saved = json.load(open(os.path.join(workdir, "config.json")))
  assert saved["model"]["family"] == "modernbert" and saved["data"]["masking"] == "modernbert"
  assert saved["eval"]["masked_lm_prob"] == 0.15
  # Asked for a WordPiece now, the workdir's vocabulary and data are not reused.
  again = subprocess.run(command + SHORT + ["--config.data.tokenizer=wordpiece"], cwd=ROOT,
                         env=_env(1), capture_output=True, text=True, timeout=600)
  assert again.returncode == 2, again.stderr[-3000:]
  assert ("were built with other settings (data.tokenizer='bpe' then, 'wordpiece' now)"
          in again.stderr)
  # And a misspelt kind is refused before anything is built.
  other = str(tmp_path / "other")
  wrong = subprocess.run(command[:-1] + [f"--workdir={other}", "--config.data.tokenizer=bpee"],
                         cwd=ROOT, env=_env(1), capture_output=True, text=True, timeout=600)
  assert wrong.returncode == 2 and "data.tokenizer='bpee' is not one of" in wrong.stderr
  assert not os.path.exists(other) or not os.listdir(other)
