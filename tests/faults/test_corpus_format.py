"""A corpus of one document a line (the commonest export), built as a user
runs the builder: refused in one line naming the flag that reads it, unless
`--file_format` says how to read it; and sentence pairs (next-sentence
prediction) from fewer than two documents refused, by the builder's static
instances, the loader and a pre-training run alike.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax import errors
from bertjax.data import builder, loader, shards
from bertjax.data.masking import MaskingConfig
from bertjax.data.tokenizers import WordPieceTokenizer
from tests import reference
from tests.tasks.test_pretrain import ROOT, _args, _env

DOCUMENTS = 1200  # one a line: over the 1,000 lines that tell the format


def _tool(*args):
  return subprocess.run([sys.executable, "-m", "bertjax.tools.prepare_pretraining_data", *args],
                        capture_output=True, text=True, timeout=600)


def _error_line(result):
  assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith("error: "), line
  return line


def write_documents_a_line(path, count, seed=0):
  """`count` documents, each a line of 2-6 capitalised sentences."""
  rng = np.random.default_rng(seed)
  words = [w for w in reference.vocab_tokens() if w.isalpha() and w.islower() and len(w) > 2]
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(count):
      sentences = [" ".join(rng.choice(words, rng.integers(3, 10))).capitalize() + "."
                   for _ in range(rng.integers(2, 7))]
      f.write(" ".join(sentences) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus_format")
  vocab = str(root / "vocab.txt")
  reference.write_vocab(vocab)
  return write_documents_a_line(root / "export.txt", DOCUMENTS), vocab


def test_a_corpus_of_one_document_a_line_is_refused_and_named_the_flag_that_reads_it(
    inputs, tmp_path):
  corpus, vocab = inputs
  out = str(tmp_path / "data")
  args = [f"--input={corpus}", f"--vocab={vocab}", "--num_shards=2", "--num_workers=1"]
  line = _error_line(_tool(*args, f"--output_dir={out}"))
  assert line.startswith(f"error: {corpus}: its first 1,000 lines hold no blank line"), line
  assert "pass --file_format=documents" in line and "--file_format=sentences" in line, line
  assert not os.path.exists(out)  # refused before anything was written

  built = _tool(*args, f"--output_dir={out}", "--file_format=documents")
  assert built.returncode == 0, built.stderr[-3000:]
  assert f"documents:  {DOCUMENTS} read = {DOCUMENTS} used" in built.stdout, built.stdout
  assert shards.read_stats(out).sentences > 2 * DOCUMENTS  # each line split into sentences

  # Said to read it one sentence a line, the builder does: one document, and
  # the sentence pairs of static instances are refused, in one line.
  one = str(tmp_path / "one")
  chosen = _tool(*args, f"--output_dir={one}", "--file_format=sentences")
  assert chosen.returncode == 0, chosen.stderr[-3000:]
  assert "documents:  1 read = 1 used" in chosen.stdout
  assert "holds one document" in chosen.stderr and "--file_format=documents" in chosen.stderr
  static = _tool(*args, f"--output_dir={one}", "--file_format=sentences",
                 "--static_dupe_factor=1", "--max_seq_length=32", "--max_predictions=5")
  line = _error_line(static)
  assert f"{one}: 1 document in the train split, and the mlm_nsp objective pairs" in line, line
  assert "--file_format=documents" in line and "mlm objective" in line, line
  assert not [name for name in os.listdir(one) if name.startswith("instances")]


def test_a_corpus_of_sentences_whose_first_document_is_long_is_built(tmp_path):
  """A book one sentence a line (BookCorpus: a book a document) runs far past
  1,000 lines without a blank one: its lines are sentences, and it is built as
  written."""
  vocab = str(tmp_path / "vocab.txt")
  reference.write_vocab(vocab)
  corpus = tmp_path / "book.txt"
  lines = [f"The quick brown fox {i} jumps over the lazy dog." for i in range(2500)]
  lines[7] = "Mr. Smith met the fox. It ran."  # a line the splitter reads as two or three
  corpus.write_text("\n".join(lines + ["", "hello world."]) + "\n", encoding="utf-8")
  stats = builder.prepare(str(corpus), str(tmp_path / "data"), WordPieceTokenizer(vocab),
                          num_shards=1, show_progress=False)
  assert (stats.documents_used, stats.sentences) == (2, 2501)


@pytest.fixture(scope="module")
def one_document(tmp_path_factory):
  """A prepared directory of one document (a sentence-a-line corpus without a
  blank line, read as the user said)."""
  root = tmp_path_factory.mktemp("one_document")
  vocab = str(root / "vocab.txt")
  reference.write_vocab(vocab)
  corpus = root / "corpus.txt"
  corpus.write_text("".join(f"the quick brown fox {i}.\n" for i in range(300)))
  out = str(root / "data")
  builder.prepare(str(corpus), out, WordPieceTokenizer(vocab), file_format="sentences",
                  num_shards=1, show_progress=False)
  assert shards.read_stats(out).documents_used == 1
  return out


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm_pairs", "ltr"])
def test_the_loader_refuses_sentence_pairs_from_one_document(one_document, objective):
  config = loader.LoaderConfig(one_document, objective=objective, batch_size=2,
                               max_seq_length=32, masking=MaskingConfig(max_predictions=5),
                               split="train", eval_percent=0.0)
  with pytest.raises(errors.UsageError, match=f"1 document in the train split, and the "
                                              f"{objective} objective pairs"):
    loader.make_dataset(config)
  packed = loader.LoaderConfig(one_document, objective="mlm", batch_size=2, max_seq_length=32,
                               masking=MaskingConfig(max_predictions=5), eval_percent=0.0)
  assert next(iter(loader.make_dataset(packed)))["input_ids"].shape == (2, 32)


def test_pretraining_on_one_document_is_refused_in_one_line(one_document, tmp_path):
  workdir = str(tmp_path / "run")
  result = subprocess.run(_args(workdir, one_document, **{"data.eval_percent": 0.0,
                                                          "eval.every_steps": 0}),
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
  line = _error_line(result)
  assert f"{one_document}: 1 document in the train split, and the mlm_nsp objective" in line


def test_a_pretraining_run_that_builds_from_one_document_a_line_is_refused(inputs, tmp_path):
  """`data.build_from` reads one sentence a line: the run refuses the file before
  it trains a vocabulary on it, naming the setting that reads it as it is."""
  corpus, _ = inputs
  workdir = str(tmp_path / "run")
  args = [a for a in _args(workdir, "", **{"eval.every_steps": 0}) if "data.dir" not in a]
  args += [f"--config.data.build_from={corpus}", "--config.data.vocab_size=300"]
  result = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=600)
  line = _error_line(result)
  assert line.startswith(f"error: {corpus}: its first 1,000 lines hold no blank line"), line
  assert "pass --config.data.file_format=documents" in line, line
  assert "--config.data.file_format=sentences" in line and " --file_format" not in line, line
  assert not os.path.exists(os.path.join(workdir, "vocab.txt"))  # nothing trained on it

  bad = subprocess.run(args + ["--config.data.file_format=paragraphs"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=600)
  assert "data.file_format='paragraphs' is not one of" in _error_line(bad)
