r"""What the demo's pre-training is worth on its fine-tuning task.

  python -m bertjax.main --config=configs/demo.py --workdir=/tmp/demo
  python benchmarks/demo_finetune.py --pretrained=/tmp/demo --learning_rates 1e-4 3e-4 1e-3

Fine-tunes `configs/demo_finetune.py` (the standard library's sentences by
area, `bertjax.data.stdlib_topics`) as a user runs it (`bertjax.main`, each
run in a process of its own), from the pre-trained demo model and from the
same architecture and vocabulary randomly initialised, at each learning rate
and seed. Prints one JSON line per run (dev accuracy after each epoch, wall
seconds), then the dev set's majority-class accuracy and, per start and
learning rate, the mean and spread of the final dev accuracy over the seeds.
"""

import argparse
import collections
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def random_copy(pretrained: str, out_dir: str, seed: int) -> None:
  """`pretrained`'s architecture and tokenizer with freshly initialised weights."""
  import flax.linen as nn
  import jax

  from bertjax.models import init_params
  from bertjax.pretrained import Pretrained, load_pretrained, save_pretrained
  bundle = load_pretrained(pretrained)
  params = nn.meta.unbox(init_params(bundle.model(), jax.random.key(seed)))
  save_pretrained(Pretrained(bundle.config, params, bundle.tokenizer, bundle.task,
                             bundle.labels), out_dir)


def fine_tune(init: str, workdir: str, learning_rate: str, seed: int) -> dict:
  command = [sys.executable, "-m", "bertjax.main", "--config=configs/demo_finetune.py",
             f"--config.init_checkpoint={init}", f"--config.train.learning_rate={learning_rate}",
             f"--config.seed={seed}", f"--workdir={workdir}"]
  start = time.perf_counter()
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  if result.returncode:
    sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
  seconds = time.perf_counter() - start
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  return {"dev_accuracy": results["dev"]["accuracy"],
          "by_epoch": [round(e["dev"]["accuracy"], 2) for e in results["epochs"]],
          "seconds": round(seconds, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--pretrained", required=True, help="The demo's workdir.")
  parser.add_argument("--learning_rates", nargs="+", default=["3e-4"])
  parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
  args = parser.parse_args()
  pretrained = os.path.abspath(args.pretrained)
  from bertjax.data import stdlib_topics
  dev = [e.label for e in stdlib_topics.read_split("dev")]
  majority = 100 * max(collections.Counter(dev).values()) / len(dev)

  finals = collections.defaultdict(list)
  with tempfile.TemporaryDirectory() as tmp:
    starts = {"pre-trained": pretrained, "random": os.path.join(tmp, "random")}
    random_copy(pretrained, starts["random"], seed=0)
    for seed in args.seeds:
      for learning_rate in args.learning_rates:
        for start, init in starts.items():
          run = fine_tune(init, os.path.join(tmp, f"{start}_{learning_rate}_{seed}"),
                          learning_rate, seed)
          print(json.dumps({"start": start, "learning_rate": learning_rate, "seed": seed,
                            **run}), flush=True)
          finals[start, learning_rate].append(run["dev_accuracy"])
  print(f"dev majority class: {majority:.1f}%")
  for (start, learning_rate), values in finals.items():
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    print(f"{start:12s} lr {learning_rate:>6s}: dev accuracy {statistics.mean(values):.1f}% "
          f"+- {spread:.1f} over {len(values)} seeds "
          f"(min {min(values):.1f}, max {max(values):.1f})")


if __name__ == "__main__":
  main()
