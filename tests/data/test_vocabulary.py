"""Training vocabularies that the tokenizers accept."""

import subprocess
import sys

from bertjax.data.tokenizers import SentencePieceTokenizer, WordPieceTokenizer
from bertjax.data import vocabulary
from tests.conftest import write_corpus


def test_wordpiece_vocabulary(tmp_path):
  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=80)
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.train_vocab", f"--input={corpus_path}",
       f"--output={tmp_path / 'vocab.txt'}", "--vocab_size=300"],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  tokens = (tmp_path / "vocab.txt").read_text().split("\n")[:-1]
  assert tokens[:5] == vocabulary.SPECIAL_TOKENS and len(tokens) <= 300
  assert any(t.startswith("##") for t in tokens)
  tokenizer = WordPieceTokenizer(str(tmp_path / "vocab.txt"))
  assert tokenizer.unk_id not in tokenizer.encode_pieces(["the quick brown fox"])[0]


def test_wordpiece_vocabulary_is_the_same_in_every_process(tmp_path):
  """The trainer's own numbering of its first pieces follows a hash map's
  order, which differs per process; given up front, it cannot."""
  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=80)
  outputs = []
  for run in range(3):
    output = tmp_path / f"vocab{run}.txt"
    result = subprocess.run(
        [sys.executable, "-m", "bertjax.tools.train_vocab", f"--input={corpus_path}",
         f"--output={output}", "--vocab_size=300"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    outputs.append(output.read_bytes())
  assert outputs[0] == outputs[1] == outputs[2]
  tokens = outputs[0].decode().split("\n")[:-1]
  # Every character that continues a word in the corpus has its ## piece.
  text = corpus_path.read_text().lower()
  continuing = {c for word in text.split() for c in word[1:] if c.isascii() and c.isalpha()}
  assert {"##" + c for c in continuing} <= set(tokens)


def test_sentencepiece_model(tmp_path):
  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=80)
  vocabulary.train_sentencepiece(lambda: vocabulary.sentences(str(corpus_path)),
                                 str(tmp_path / "spm.model"), 120, True)
  tokenizer = SentencePieceTokenizer(str(tmp_path / "spm.model"), do_lower_case=True)
  ids = tokenizer.encode("The QUICK brown [MASK] fox")
  assert ids[0] == tokenizer.cls_id and tokenizer.mask_id in ids
  assert tokenizer.special_tokens["pad"] == "[PAD]"


HARD_TEXT = ["Tabs\tand   runs of  spaces, then a newline-free line.",
             "Émoji 🦊🚀 and accents: naïve café, Ångström, São Paulo.",
             "CJK: 東京は日本の首都です。 한국어 텍스트.",
             "Code: def f(x): return x**2  # comment; a[i] += {'k': 1}",
             "MiXeD CaSe and numbers 3.14159, 1,000,000 and 2026-12-05."]


def test_a_bpe_is_trained_as_modernberts_the_same_in_every_process(tmp_path):
  """`--model=bpe`: a cased byte-level BPE (every byte a piece, so nothing is
  unknown) with BERT's special tokens and ModernBERT's [CLS] A [SEP] layout;
  trained again in another process, the same file byte for byte."""
  import tokenizers

  corpus_path = tmp_path / "c.txt"
  corpus_path.write_text("\n".join(HARD_TEXT * 30) + "\n", encoding="utf-8")
  outputs = []
  for run in range(2):
    output = tmp_path / f"tokenizer{run}.json"
    result = subprocess.run(
        [sys.executable, "-m", "bertjax.tools.train_vocab", f"--input={corpus_path}",
         f"--output={output}", "--model=bpe", "--vocab_size=600"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"(bpe, " in result.stdout
    outputs.append(output.read_bytes())
  assert outputs[0] == outputs[1]
  backend = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer0.json"))
  assert [backend.id_to_token(i) for i in range(5)] == vocabulary.SPECIAL_TOKENS
  assert 256 + 5 < backend.get_vocab_size() <= 600
  for text in HARD_TEXT:
    encoding = backend.encode(text)
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    assert "[UNK]" not in encoding.tokens  # byte-level: nothing is unknown
    assert backend.decode(encoding.ids) == text  # cased, every byte kept
  assert backend.encode("Paris paris").tokens != backend.encode("paris paris").tokens


def test_a_bpe_refuses_a_size_below_its_bytes_and_another_suffix(tmp_path):
  import pytest

  from bertjax import errors

  corpus = lambda: iter(HARD_TEXT)
  with pytest.raises(errors.UsageError, match="--vocab_size=200: a byte-level BPE holds the 256"):
    vocabulary.train_bpe(corpus, str(tmp_path / "t.json"), 200, False)
  with pytest.raises(errors.UsageError, match="must end in .json"):
    vocabulary.train_bpe(corpus, str(tmp_path / "vocab.txt"), 600, False)
  with pytest.raises(vocabulary.UnusableTextError, match="no usable text"):
    vocabulary.train_bpe(lambda: iter([]), str(tmp_path / "t.json"), 600, False)
  assert not list(tmp_path.iterdir())


def test_continuing_characters_leave_out_what_the_pre_tokeniser_splits():
  import tokenizers
  from tokenizers import models, normalizers, pre_tokenizers

  backend = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  backend.normalizer = normalizers.BertNormalizer(lowercase=True)
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  texts = ["Café au lait, s'il vous plaît.", "北京 is 中国's capital!", "x2 = y_3"]
  assert vocabulary._continuing_characters(iter(texts), backend) == sorted(
      set("acefilopstuvxy23"))


def test_corpus_and_vocabulary_on_gcs(gcs, tmp_path):
  """The tool reads its corpus from gs:// and writes the vocabulary there; the
  bytes are those of a local run."""
  import os

  from bertjax import files

  corpus_path = write_corpus(tmp_path / "c.txt", num_documents=40)
  files.upload(str(corpus_path), gcs.url_of("vocab/corpus/c.txt"))
  outputs = {}
  for where, output in (("local", str(tmp_path / "vocab.txt")),
                        ("gcs", gcs.url_of("vocab/vocab.txt"))):
    source = str(corpus_path) if where == "local" else gcs.url_of("vocab/corpus/*.txt")
    result = subprocess.run(
        [sys.executable, "-m", "bertjax.tools.train_vocab", f"--input={source}",
         f"--output={output}", "--vocab_size=200"], capture_output=True, text=True,
        timeout=300, env={**os.environ, **gcs.env})
    assert result.returncode == 0, result.stderr[-3000:]
    outputs[where] = files.read_bytes(output)
  assert outputs["gcs"] == outputs["local"]
