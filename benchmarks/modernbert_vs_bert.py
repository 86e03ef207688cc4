r"""ModernBERT's recipe against the paper's at the same size and the same time.

  python benchmarks/modernbert_vs_bert.py --minutes 8 --workdir /tmp/mvb

On the demo corpus (the standard library's docstrings, an 8k WordPiece
vocabulary built once into the first run's workdir), two encoders of 4
layers, width 256 and 4 heads are pre-trained at 128 tokens for the same
wall-clock budget, each in a process of its own, one after the other:

- the paper's: `configs/demo.py` (BERT: post-LN, learned positions, masked
  LM at 15% and next-sentence prediction, AdamW with linear decay, batch 32,
  the paper's learning rate of 1e-4), feed-forward 1,024;
- ModernBERT's: `configs/modernbert_pretrain.py` scaled to the same size
  (rotary positions, GeGLU with a feed-forward of 672 so that its three
  matrices hold as many weights as BERT's two, pre-norm, local attention in 2
  layers of 4 (64 tokens either side, ModernBERT's window), masked LM at 30% on packed rows,
  StableAdamW, warmup-stable-decay over the last 20% of the steps, batch 32,
  its recipe's learning rate of 8e-4), no batch-size warmup (too short a
  run). Both warm up over the first 10% of the steps.

Each run's steps are set from a 40-step timing run of its own so that its
training takes `--minutes`. Afterwards both are scored on the same held-out
documents (5% of the corpus) by the same masked-LM evaluation: 15% of the
tokens masked (80/10/10), 128-token single-segment rows, 40 batches of 64.

Prints one JSON line per run: its steps, training seconds, and held-out
masked-LM accuracy, loss and perplexity.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

from bertjax.metrics import read_jsonl

ROOT = pathlib.Path(__file__).resolve().parent.parent

COMMON = {"model.num_layers": 4, "model.hidden_size": 256, "model.num_heads": 4,
          "model.vocab_size": 8000, "model.max_position_embeddings": 128,
          "model.dtype": "float32", "model.scan_layers": False,
          "train.batch_size": 32, "train.max_seq_length": 128, "train.long_from_step": -1,
          "data.vocab_size": 8000, "data.eval_percent": 5.0, "data.shuffle_window": 1000,
          "data.worker_count": 0, "eval.every_steps": 0, "log_every_steps": 10}
RECIPES = {
    "bert": ("configs/demo.py", {"model.intermediate_size": 1024,
                                 "model.hidden_dropout_prob": 0.0,
                                 "optimizer.learning_rate": 1e-4}),
    "modernbert": ("configs/modernbert_pretrain.py", {
        "model.intermediate_size": 672, "model.local_attention": 128,
        "model.attention_output_dropout_prob": 0.0, "train.max_predictions": 65,
        "train.batch_ramp_steps": 0, "data.build_from": "demo:stdlib",
        "data.max_sequences_per_row": 4, "optimizer.learning_rate": 8e-4}),
}


def command(recipe: str, workdir: str, data_dir: str | None, steps: int) -> list[str]:
  config, own = RECIPES[recipe]
  settings = {**COMMON, **own, "train.total_steps": steps,
              "optimizer.warmup_steps": max(1, steps // 10),
              "checkpoint.every_steps": steps}
  if recipe == "modernbert":
    settings["optimizer.decay_steps"] = steps // 5
  if data_dir:
    settings["data.dir"] = data_dir
    settings["data.build_from"] = ""
  return ([sys.executable, "-m", "bertjax.main", f"--config={config}", f"--workdir={workdir}"]
          + [f"--config.{k}={v}" for k, v in settings.items()])


def train(recipe: str, workdir: str, data_dir: str | None, steps: int) -> list[float]:
  """Runs the recipe for `steps`; returns the seconds of each logged window of
  10 training steps."""
  result = subprocess.run(command(recipe, workdir, data_dir, steps), cwd=ROOT,
                          capture_output=True, text=True)
  if result.returncode:
    sys.exit(f"error: the {recipe} run failed:\n{result.stderr[-3000:]}")
  windows = []
  for record in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    # Logged every 10 steps; the last step's line averages the whole run, so
    # its window is counted as the mean of the others.
    if "train/tokens_per_s" in record and record["step"] < steps:
      # The window's steps times the seconds a step (32 rows of 128 slots).
      windows.append(10 * 32 * 128 / record["train/tokens_per_s"])
  return windows + [sum(windows) / len(windows)] if windows else []


def evaluate(workdir: str, data_dir: str, batches: int = 40) -> dict[str, float]:
  """Held-out masked-LM metrics at 15% masking, the same rows for every run."""
  import dataclasses

  import jax
  import numpy as np

  from bertjax import checkpoint, phases, train as train_lib
  from bertjax.data import loader
  from bertjax.models import EncoderConfig
  from bertjax.tasks import pretrain_data

  config, _, params = checkpoint.params_from_run(workdir)
  bert = EncoderConfig.from_run_config(config)
  model = train_lib.pretraining_model(bert, "mlm")
  params = {"bert": {k: v for k, v in params["bert"].items() if k != "pooler"},
            "mlm": params["mlm"]}
  config.unlock()
  config.objective, config.data.masked_lm_prob = "mlm", 0.15
  config.data.max_sequences_per_row = 1
  phase = phases.phases(config)[0]
  settings = dataclasses.replace(
      pretrain_data.loader_config(config, data_dir, phase, "eval", 64, seed_offset=1),
      shuffle_window=1, worker_count=0, seed=12345)
  iterator = iter(loader.make_dataset(settings))
  step = jax.jit(lambda p, b: train_lib.eval_step(p, b, model=model, objective="mlm"))
  totals: dict[str, float] = {}
  for _ in range(batches):
    for name, value in jax.device_get(step(params, next(iterator))).items():
      totals[name] = totals.get(name, 0.0) + float(np.asarray(value))
  return train_lib.summarize_eval(totals)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--minutes", type=float, default=8.0, help="training time of each run")
  parser.add_argument("--workdir", required=True, help="where the runs and the data go")
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  data_dir = None
  rates = {}
  for recipe in RECIPES:  # timing runs; the first builds the data
    workdir = os.path.join(args.workdir, f"{recipe}_timing")
    windows = train(recipe, workdir, data_dir, 40)
    rates[recipe] = sum(windows[1:]) / (10 * len(windows[1:]))  # seconds a step
    data_dir = data_dir or os.path.join(workdir, "data")
  runs = {}
  for recipe in RECIPES:
    steps = max(10, int(args.minutes * 60 / rates[recipe]) // 10 * 10)
    workdir = os.path.join(args.workdir, recipe)
    started = time.time()
    seconds = sum(train(recipe, workdir, data_dir, steps))
    runs[recipe] = {"recipe": recipe, "steps": steps, "train_s": round(seconds, 1),
                    "wall_s": round(time.time() - started, 1)}
  # Scored after both have trained: this process's JAX (and its TPU plugin,
  # where installed) stays out of the runs' environment.
  for recipe, run in runs.items():
    metrics = evaluate(os.path.join(args.workdir, recipe), data_dir)
    print(json.dumps({**run, **{k: round(v, 4) for k, v in metrics.items()}}), flush=True)


if __name__ == "__main__":
  main()
