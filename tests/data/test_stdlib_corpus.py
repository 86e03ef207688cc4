"""The demo corpus: the standard library's docstrings as English prose."""

from bertjax.data import stdlib_corpus


def test_demo_corpus_is_english_prose():
  documents = list(stdlib_corpus.stdlib_documents())
  assert len(documents) > 300
  sentences = [s for d in documents for s in d]
  assert sum(len(s.split()) for s in sentences) > 150_000
  assert not any(s.lstrip().startswith(">>>") for s in sentences)
  assert list(stdlib_corpus.stdlib_documents()) == documents  # deterministic
