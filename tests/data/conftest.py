"""A small prepared pre-training directory shared by the data tests."""

import numpy as np
import pytest

from bertjax.data.tokenizers import WordPieceTokenizer
from bertjax.data import builder
from tests import reference


def write_corpus(path, num_documents=120, seed=0):
  """Documents of 2-12 sentences of words from the test vocabulary."""
  rng = np.random.default_rng(seed)
  words = [w for w in reference.vocab_tokens() if w.isalpha() and w.islower() and len(w) > 2]
  lines = []
  for _ in range(num_documents):
    for _ in range(rng.integers(2, 13)):
      lines.append(" ".join(rng.choice(words, rng.integers(3, 15))) + ".")
    lines.append("")
  path.write_text("\n".join(lines) + "\n")
  return path


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("prepared")
  vocab = root / "vocab.txt"
  reference.write_vocab(str(vocab))
  corpus = write_corpus(root / "corpus.txt")
  out = root / "data"
  builder.prepare(str(corpus), str(out), WordPieceTokenizer(str(vocab)),
                                   num_shards=3, show_progress=False)
  return str(out)
