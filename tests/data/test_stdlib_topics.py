"""The demo's fine-tuning task: the standard library's sentences by area."""

import collections

import pytest

from bertjax import errors
from bertjax.data import stdlib_corpus, stdlib_topics


def test_every_area_has_train_and_dev_sentences_and_no_sentence_is_in_both():
  train, dev = stdlib_topics.read_split("train"), stdlib_topics.read_split("dev")
  assert len(train) > 5000 and len(dev) > 500
  assert 0.08 < len(dev) / (len(train) + len(dev)) < 0.18  # one docstring in eight
  for split in (train, dev):
    counts = collections.Counter(e.label for e in split)
    assert set(counts) == set(stdlib_topics.AREAS)
    assert min(counts.values()) >= 0.03 * len(split)
    assert [e.index for e in split] == list(range(len(split)))
    assert all(e.text_b is None for e in split)
  assert not {e.text_a for e in train} & {e.text_a for e in dev}
  assert len({e.text_a for e in train}) == len(train)  # repeated sentences are left out
  assert stdlib_topics.read_split("dev") == dev  # deterministic


def test_a_sentence_is_labelled_with_its_modules_area():
  area_of = {m: area for area, modules in stdlib_topics.AREAS.items() for m in modules}
  where = {}
  for docstring in stdlib_corpus.stdlib_docstrings():
    top = docstring.module.split("/")[0].removesuffix(".py")
    for sentence in docstring.sentences if top in area_of else ():
      where.setdefault(sentence, set()).add(area_of[top])
  for example in stdlib_topics.read_split("train")[::50]:
    assert where[example.text_a] == {example.label}
  # A docstring known to be there: the email package's.
  email = next(d for d in stdlib_corpus.stdlib_docstrings() if d.module == "email/__init__.py")
  sentences = {e.text_a: e.label for e in stdlib_topics.read_split("train")
               + stdlib_topics.read_split("dev")}
  assert {sentences[s] for s in email.sentences if s in sentences} == {"internet"}


def test_the_docstrings_make_the_demo_corpus():
  """Each file's docstrings in order, and each help topic, are one document."""
  documents = list(stdlib_corpus.stdlib_documents())
  grouped = collections.defaultdict(list)
  for docstring in stdlib_corpus.stdlib_docstrings():
    grouped[docstring.document] += docstring.sentences
  assert list(grouped.values()) == documents
  names = {d.name for d in stdlib_corpus.stdlib_docstrings() if d.module == "email/message.py"}
  assert {"", "Message", "Message.get_payload"} <= names


def test_the_task_has_no_test_split():
  with pytest.raises(errors.UsageError, match="has splits train, dev, not 'test'"):
    stdlib_topics.read_split("test")
