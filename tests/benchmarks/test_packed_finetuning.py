"""benchmarks/packed_finetuning.py: the Rotten Tomatoes snippets become SST-2
files that the GLUE reader takes, split by movie."""

import bz2
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import packed_finetuning  # noqa: E402  (a script, not a package)

from bertjax.data import glue  # noqa: E402


def test_snippets_become_sst2_files_split_by_movie(tmp_path):
  path = tmp_path / "corpus.csv.bz2"
  movies = [f"movie {i}" for i in range(40)]
  with bz2.open(path, "wt", encoding="utf-8", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["category", "text", "movie_name", "has_plot_and_reviews"])
    for i, movie in enumerate(movies):
      writer.writerow(["fresh" if i % 3 else "rotten", f"a\tgood\n film {i}", movie, "True"])
      writer.writerow(["plot", f"the plot of {movie}", movie, "True"])
  splits = packed_finetuning.rotten_tomatoes(str(path))
  assert sum(map(len, splits.values())) == 40  # the plots left out
  assert all(splits.values())  # 40 movies reach every split
  texts = {split: {text for text, _ in rows} for split, rows in splits.items()}
  assert not texts["train"] & texts["dev"] and not texts["dev"] & texts["test"]
  packed_finetuning.write_sst2(splits, str(tmp_path / "SST-2"))
  spec = glue.task_spec("sst2")
  for split in ("train", "dev"):
    examples = glue.read_tsv(spec, str(tmp_path / "SST-2"), split)
    assert [(e.text_a, e.label) for e in examples] == [
        (text, str(label)) for text, label in splits[split]]
    assert all("\t" not in e.text_a and "\n" not in e.text_a for e in examples)
