"""CoNLL-2003 files and BERT's NER features."""

import numpy as np
import pytest

from bertjax.data import conll
from bertjax.data.tokenizers import JsonTokenizer, WordPieceTokenizer
from tests import reference

FILE = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP I-NP I-LOC
1996-08-22 CD I-NP O
"""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  reference.write_vocab(str(path))
  return WordPieceTokenizer(str(path), do_lower_case=False)


def test_reads_sentences_tags_and_documents(tmp_path):
  path = tmp_path / "eng.train"
  path.write_text(FILE)
  sentences = conll.read_conll(str(path))
  assert [s.words for s in sentences] == [["EU", "rejects", "German", "call", "."],
                                          ["Peter", "Blackburn"], ["BRUSSELS", "1996-08-22"]]
  assert sentences[0].tags == ["I-ORG", "O", "I-MISC", "O", "O"]
  assert [s.document for s in sentences] == [0, 0, 1]
  assert [s.line for s in sentences] == [3, 9, 14]
  assert conll.label_list(sentences) == ["O", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
  with pytest.raises(ValueError, match=r"eng.train:4: tag 'O' is not one of"):
    conll.check_tags(sentences, ["I-ORG"], str(path))


def test_a_word_without_its_tag_is_counted(tmp_path, caplog):
  path = tmp_path / "bad.txt"
  path.write_text("EU NNP I-NP I-ORG\nrejects\n\n")
  with caplog.at_level("WARNING"):
    sentences = conll.read_conll(str(path))
  assert sentences[0].words == ["EU"]
  assert f"{path}:2: a word without a tag" in caplog.text


@pytest.mark.parametrize("max_seq_length,context", [(64, True), (64, False), (8, True), (5, False)])
def test_every_word_is_scored_once_at_its_first_piece(tmp_path, tokenizer, max_seq_length,
                                                      context):
  rng = np.random.default_rng(0)
  words = "the quick brown fox jumped over lazy dogs Hello World tokenizer".split()
  tags = ["O", "B-PER", "I-PER", "B-LOC"]
  lines = []
  for document in range(3):
    lines.append("-DOCSTART- -X- -X- O\n")
    for _ in range(4):
      for _ in range(rng.integers(1, 9)):
        lines.append(f"{rng.choice(words)} X X {rng.choice(tags)}")
      lines.append("")
  path = tmp_path / "f.txt"
  path.write_text("\n".join(lines) + "\n")
  sentences = conll.read_conll(str(path))
  labels = conll.label_list(sentences)
  features = conll.featurize(sentences, tokenizer, labels, max_seq_length, context)
  arrays = features.arrays
  assert arrays["input_ids"].shape[1] == max_seq_length
  scored = [(s, w) for row in features.scored for s, w, _ in row]
  assert sorted(scored) == [(s, w) for s, sentence in enumerate(sentences)
                            for w in range(len(sentence.words))]
  # The scored positions are exactly the weighted ones, each a word's first piece.
  for row, items in enumerate(features.scored):
    weighted = np.flatnonzero(arrays["label_weights"][row])
    assert sorted(p for _, _, p in items) == weighted.tolist()
    for sentence, word, position in items:
      first = tokenizer.encode_pieces([sentences[sentence].words[word]])[0][0]
      assert arrays["input_ids"][row, position] == first
      assert labels[arrays["labels"][row, position]] == sentences[sentence].tags[word]
  # Logits that put the gold label first decode to the gold tags.
  logits = np.eye(len(labels))[arrays["labels"]]
  assert conll.word_predictions(features, logits, sentences, labels) == [
      s.tags for s in sentences]
  # A row is one contiguous stretch of its document (or, without context, of
  # its sentence): a split sentence's rows hold the rest of the sentence first.
  for row, items in enumerate(features.scored):
    sentence = items[0][0]
    owners = [i for i, s in enumerate(sentences)
              if (s.document == sentences[sentence].document if context else i == sentence)]
    stream = [p for i in owners for w in tokenizer.encode_pieces(sentences[i].words) for p in w]
    length = int(arrays["attention_mask"][row].sum())
    pieces = arrays["input_ids"][row, 1:length - 1].tolist()
    assert any(stream[k:k + len(pieces)] == pieces for k in range(len(stream) - len(pieces) + 1))
    if context or len(stream) <= max_seq_length - 2:
      assert len(pieces) == min(len(stream), max_seq_length - 2)  # as full as it can be
  if context and max_seq_length == 64:
    # Context fills the rows with the document's other sentences.
    assert arrays["attention_mask"].sum() > sum(len(s.words) + 2 for s in sentences)


def test_context_stays_inside_the_document(tmp_path, tokenizer):
  path = tmp_path / "eng.train"
  path.write_text(FILE)
  sentences = conll.read_conll(str(path))
  features = conll.featurize(sentences, tokenizer, conll.label_list(sentences), 64)
  # BRUSSELS ...: alone in its document, so its row holds nothing else.
  assert features.arrays["attention_mask"][2].sum() == 2 + len(
      [p for w in tokenizer.encode_pieces(sentences[2].words) for p in w])
  first_row = tokenizer.convert_ids_to_tokens(
      features.arrays["input_ids"][0][:features.arrays["attention_mask"][0].sum()])
  assert "P" in "".join(first_row) and "BR" not in "".join(first_row)


def test_tfds_conll2003_layout(tmp_path):
  import tensorflow_datasets as tfds

  from tests import tfds_builders

  names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
  tfds_builders.prepare("FakeConll", {
      "tokens": tfds.features.Sequence(tfds.features.Text()),
      "ner": tfds.features.Sequence(tfds.features.ClassLabel(names=names))}, {
      "train": [{"tokens": ["Peter", "Blackburn", "spoke"], "ner": [1, 2, 0]},
                {"tokens": [], "ner": []}]}, str(tmp_path))
  sentences = conll.read_tfds("fake_conll", "train", str(tmp_path))
  assert [(s.words, s.tags) for s in sentences] == [
      (["Peter", "Blackburn", "spoke"], ["B-PER", "I-PER", "O"])]


def test_a_byte_level_bpe_reads_the_words_as_running_text(tmp_path):
  """With a byte-level BPE (ModernBERT's kind), a row is transformers'
  encoding of the words joined by spaces (the words after the first marked as
  following a space, as in pre-training text): the document's with context,
  the sentence's without, each label on its word's first piece."""
  transformers = pytest.importorskip("transformers")
  path = tmp_path / "eng.train"
  path.write_text(FILE)
  sentences = conll.read_conll(str(path))
  labels = conll.label_list(sentences)
  reference.write_bpe_tokenizer(tmp_path / "bpe")
  bpe = JsonTokenizer(str(tmp_path / "bpe" / "tokenizer.json"))
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "bpe")
  # With context, a row that holds its whole document is the document's text.
  arrays = conll.featurize(sentences, bpe, labels, 64).arrays
  document = [w for s in sentences[:2] for w in s.words]  # EU rejects ... Peter Blackburn
  length = int(arrays["attention_mask"][0].sum())
  assert arrays["input_ids"][0, :length].tolist() == theirs(" ".join(document))["input_ids"]
  # Without, each row is its sentence's.
  features = conll.featurize(sentences, bpe, labels, 64, document_context=False)
  arrays = features.arrays
  for row, sentence in enumerate(sentences):
    text = " ".join(sentence.words)
    length = int(arrays["attention_mask"][row].sum())
    assert arrays["input_ids"][row, :length].tolist() == theirs(text)["input_ids"]
    pieces = reference.running_text_pieces(theirs, text, sentence.words)
    firsts = 1 + np.cumsum([0] + [len(p) for p in pieces[:-1]])  # after [CLS]
    assert [p for _, _, p in features.scored[row]] == firsts.tolist()
    assert [labels[i] for i in arrays["labels"][row, firsts]] == sentence.tags
