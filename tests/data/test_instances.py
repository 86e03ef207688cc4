"""Instance creation: the original NSP generator and sequence packing."""

import grain
import numpy as np

from bertjax.data import instances

CLS, SEP = 2, 3


def _corpus(num_documents=400, seed=0):
  """Documents whose token ids identify them: ids of document d are d*10000 + 100 +
  (increasing within the document)."""
  rng = np.random.default_rng(seed)
  documents = []
  for d in range(num_documents):
    sentences = [np.arange(rng.integers(3, 25), dtype=np.int32) + d * 10000 + 100 + 30 * s
                 for s in range(rng.integers(2, 30))]
    documents.append(sentences)
  return documents


def _instances(documents, max_seq_length=64, short_seq_prob=0.1, seed=0, candidates=None):
  result = []
  for d, sentences in enumerate(documents):
    rng = np.random.default_rng([seed, d])
    result.append(instances.create_instances_from_document(
        sentences, d, candidates if candidates is not None else np.arange(len(documents)),
        documents.__getitem__, max_seq_length, short_seq_prob, CLS, SEP, rng, stream_index=d))
  return result


def test_structure_and_next_sentence_labels():
  documents = _corpus()
  per_document = _instances(documents)
  for d, created in enumerate(per_document):
    for instance in created:
      ids, first = instance.token_ids, instance.num_first
      assert len(ids) <= 64 and ids[0] == CLS and ids[first - 1] == SEP and ids[-1] == SEP
      a, b = ids[1:first - 1], ids[first:-1]
      assert len(a) >= 1 and len(b) >= 1 and not np.isin([CLS, SEP], a).any()
      assert (a // 10000 == d).all()
      if instance.next_sentence_label == 0:
        assert (b // 10000 == d).all()
        assert b[0] > a[-1]  # B continues A (ids grow within a document)
      else:
        assert (b // 10000 != d).all() and len(set(b // 10000)) == 1


def test_random_next_segments_come_from_the_candidates_only():
  documents = _corpus(200)
  candidates = np.arange(0, 200, 3)  # e.g. the training split
  sources = {int(i.token_ids[i.num_first] // 10000)
             for created in _instances(documents, candidates=candidates)
             for i in created if i.next_sentence_label == 1}
  assert sources and sources <= set(candidates.tolist())


def _original_statistics(documents, max_seq_length, short_seq_prob, seed):
  """Instances per document, the share of random-next pairs and the mean
  lengths of A and B, from Google's create_pretraining_data.py."""
  import random

  from tests import reference

  original = reference.original("create_pretraining_data")
  all_documents = [[[str(t) for t in s.tolist()] for s in d] for d in documents]
  rng = random.Random(seed)
  counts, random_next, a_lengths, b_lengths = [], [], [], []
  for d in range(len(all_documents)):
    # masked_lm_prob 0: the tokens stay as they are; only the pairs matter here.
    created = original.create_instances_from_document(
        all_documents, d, max_seq_length, short_seq_prob, 0.0, 0, ["x"], rng)
    counts.append(len(created))
    for instance in created:
      random_next.append(instance.is_random_next)
      a_lengths.append(instance.segment_ids.count(0) - 2)
      b_lengths.append(instance.segment_ids.count(1) - 1)
  return np.mean(counts), np.mean(random_next), np.mean(a_lengths), np.mean(b_lengths)


def test_instances_are_distributed_as_the_originals():
  """The same corpus through Google's generator and bertjax's: as many
  instances a document, as many random-next pairs, the same segment lengths
  (the random streams differ, so statistics, not instances, are compared).
  A tenth of the documents have one sentence: the original keeps them."""
  rng = np.random.default_rng(3)
  documents = []
  for d in range(4000):
    count = 1 if d % 10 == 0 else int(rng.integers(2, 25))
    documents.append([np.arange(rng.integers(3, 30), dtype=np.int32) + d * 10000 + 100
                      + 30 * s for s in range(count)])
  ours = _instances(documents, 64, 0.1)
  flat = [i for created in ours for i in created]
  statistics = (np.mean([len(c) for c in ours]),
                np.mean([i.next_sentence_label for i in flat]),
                np.mean([i.num_first - 2 for i in flat]),
                np.mean([len(i.token_ids) - i.num_first - 1 for i in flat]))
  expected = _original_statistics(documents, 64, 0.1, seed=5)
  # Seed to seed, each statistic moves by up to about 1.5% at this size.
  np.testing.assert_allclose(statistics, expected, rtol=0.03)


def test_a_one_sentence_document_gives_one_random_next_instance():
  """As the original's loop (which needs no TensorFlow to say so): a document
  of one sentence is kept, as one instance whose B is a random sentence."""
  rng = np.random.default_rng(4)
  documents = [[np.arange(rng.integers(3, 30), dtype=np.int32) + d * 10000 + 100 + 30 * s
                for s in range(1 if d % 10 == 0 else int(rng.integers(2, 25)))]
               for d in range(400)]
  ours = _instances(documents, 64, 0.1)
  single = [ours[d] for d in range(0, 400, 10)]
  assert all(len(c) == 1 and c[0].next_sentence_label == 1 for c in single)
  for (instance,), d in zip(single, range(0, 400, 10)):
    first = instance.token_ids[1:instance.num_first - 1]
    assert np.all(first // 10000 == d)  # A: the document's sentence
    second = instance.token_ids[instance.num_first:-1]
    assert np.all(second // 10000 != d)  # B: from another document


def test_next_sentence_coin_is_fair():
  # With short sentences a document's first chunk always holds several, so its
  # label is the generator's coin: random half the time. (Over all instances
  # the original generator yields somewhat more random pairs: a random B hands
  # A's unused sentences back, making more chunks.)
  rng = np.random.default_rng(5)
  documents = [[np.arange(rng.integers(3, 9), dtype=np.int32) + d * 10000 + 100 + 10 * s
                for s in range(rng.integers(20, 40))] for d in range(3000)]
  first = np.array([created[0].next_sentence_label
                    for created in _instances(documents, 64, 0.0)])
  assert abs(first.mean() - 0.5) < 4 * 0.5 / np.sqrt(len(first))


def test_short_seq_prob_shortens_a_tenth_of_the_documents():
  documents = [[np.arange(20, dtype=np.int32) + d * 10000 + 100 + 20 * s for s in range(40)]
               for d in range(3000)]
  shortened = []
  for short_seq_prob in (0.0, 0.1):
    lengths = [created[0].token_ids.size for created in _instances(documents, 128,
                                                                   short_seq_prob)]
    shortened.append(np.mean(np.array(lengths) < 100))
  # A random B can run out of its document, so a few are short anyway; a short
  # target (uniform in [2, 125]) lands under 100 about 78% of the time.
  assert shortened[0] < 0.03
  assert abs(shortened[1] - shortened[0] - 0.1 * 0.78) < 0.02


def test_truncation_is_random_at_both_ends():
  rng = np.random.default_rng(0)
  removed_front = []
  for _ in range(2000):
    first, second = instances.truncate_pair_at_random_ends(list(range(10)), list(range(100, 130)), 20, rng)
    assert first == list(range(10)) and len(second) == 10  # the longer one is cut
    removed_front.append(second[0] - 100)
  assert abs(np.mean(removed_front) - 10) < 0.3  # 20 removals, each end half the time


def test_instance_keys_are_distinct():
  keys = [i.key for created in _instances(_corpus(100)) for i in created]
  assert len(set(keys)) == len(keys)
  assert instances.instance_key(1, 2) != instances.instance_key(2, 1)


def _documents_stream(documents):
  return grain.MapDataset.source(documents).map_with_index(
      lambda i, sentences: instances.DocumentRef(i, i, sentences)).to_iter_dataset()


def test_packing_keeps_every_token_in_order():
  documents = _corpus(60, seed=1)
  packed = list(instances.PackedSequences(_documents_stream(documents), 64, 0.1, CLS, SEP, 0))
  stream = []
  for instance in packed:
    ids = instance.token_ids
    assert len(ids) <= 64 and ids[0] == CLS and ids[-1] == SEP and instance.num_first == len(ids)
    assert instance.next_sentence_label == -1
    body = ids[1:-1]
    assert not (body[:1] == SEP).any() and not (body[-1:] == SEP).any()
    stream += body[body != SEP].tolist()
  expected = [t for sentences in documents for s in sentences for t in s.tolist()]
  assert stream == expected
  # Documents are separated by [SEP] inside a sequence.
  crossing = [i for i in packed if SEP in i.token_ids[1:-1]]
  assert crossing
  for instance in crossing:
    body = instance.token_ids[1:-1]
    for cut in np.flatnonzero(body == SEP):
      assert body[cut - 1] // 10000 < body[cut + 1] // 10000


def test_packing_restores_exactly():
  documents = _corpus(40, seed=2)
  iterator = iter(instances.PackedSequences(_documents_stream(documents), 48, 0.1, CLS, SEP, 3))
  for _ in range(17):
    next(iterator)
  state = iterator.get_state()
  expected = [next(iterator).token_ids for _ in range(20)]
  restored = iter(instances.PackedSequences(_documents_stream(documents), 48, 0.1, CLS, SEP, 3))
  restored.set_state(state)
  for want in expected:
    np.testing.assert_array_equal(next(restored).token_ids, want)


def test_long_sentences_are_cut():
  documents = [[np.arange(500, dtype=np.int32) + 10]]
  packed = list(instances.PackedSequences(_documents_stream(documents), 128, 0.0, CLS, SEP, 0))
  assert [len(p.token_ids) for p in packed] == [128, 128, 128, 124]  # 126 + 126 + 126 + 122
  np.testing.assert_array_equal(np.concatenate([p.token_ids[1:-1] for p in packed]),
                                documents[0][0])


def _modernbert_sequence(sentences, max_seq_length):
  """ModernBERT's sequence of a document (src/text_data.py: the tokenizer
  with truncation=True, max_length): [CLS], the document's first
  `max_seq_length - 2` tokens, [SEP]."""
  tokens = np.concatenate(sentences)[:max_seq_length - 2]
  return np.concatenate([[CLS], tokens, [SEP]]).astype(np.int32)


def test_truncated_documents_give_one_sequence_each_as_modernbert():
  """ModernBERT's rule: one sequence a document, its first tokens (the last
  sentence cut to fit), the rest left out; and it restores exactly."""
  documents = _corpus(80, seed=4)
  make = lambda: instances.PackedSequences(_documents_stream(documents), 64, 0.0, CLS, SEP, 0,
                                           cross_documents=False, truncate_documents=True)
  made = list(make())
  assert len(made) == len(documents)
  for instance, sentences in zip(made, documents):
    np.testing.assert_array_equal(instance.token_ids, _modernbert_sequence(sentences, 64))
  long = sum(sum(len(s) for s in d) >= 62 for d in documents)
  assert long > 20 and sum(len(i.token_ids) == 64 for i in made) == long  # full when long
  iterator = iter(make())
  for _ in range(11):
    next(iterator)
  state = iterator.get_state()
  restored = iter(make())
  restored.set_state(state)
  for want in made[11:]:
    np.testing.assert_array_equal(next(restored).token_ids, want.token_ids)
