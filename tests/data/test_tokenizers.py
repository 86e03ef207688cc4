"""Tokenizers against the original `tokenization.py` (Google's code, from
`bert-tensorflow`) and the BERT tokenizers of `transformers`.

`BertTokenizerLegacy` is transformers' pure-Python port of the original;
`BertTokenizer` is its `tokenizers` pipeline. bertjax reads special tokens
written in the text as such, as both do, where the original reads them as plain
text (`special_tokens_in_text=False` does so too); it caps words at the
original's 200 characters, transformers at 100 (`HF` below).
"""

import unicodedata

import numpy as np
import pytest

from bertjax.data.tokenizers import (JsonTokenizer, SentencePieceTokenizer, WordPieceTokenizer,
                                     current_settings, tokenizer_from_settings, truncate_pair)
from tests import reference

TEXTS = [
    "The quick brown fox jumped over the lazy dog!",
    "unaffable tokenizers testing",
    "Café naïve RÉSUMÉ résumé Résumé",           # accents, both cases
    "東京都は日本の首都です。中文字符",              # CJK ideographs, kana, fullwidth stop
    "emoji 😀 😀😀 and ♥ symbols",
    "zero\u200bwidth join\u200d non\u200cjoiner \ufeffbom soft\u00adhyphen",
    "control \x00 nul \x07 bell \x1b esc \x7f del \ufffd replacement",
    "tabs\tnew\nlines\r\ncarriage \u2028 separator \u00a0 nbsp \u3000 ideographic",
    "a" * 100 + " " + "b" * 101 + " " + "x" * 250,  # at and over the 100-char limit
    "c" * 200 + " " + "d" * 201,                  # at and over the 200-char limit
    "x [MASK] y [CLS] [SEP]z [mask]",             # special tokens written in text
    "Hello,World...??!!--'quoted'\"double\"(paren)[bracket]{brace}",
    "\u0301 combining first, e\u0301 decomposed, ﬁ ligature, Ⅻ numeral, ½ fraction",
    "mixed1234numbers 3.14159 1,000,000 $5 50%",
    "",
    "   ",
    "ǅ titlecase ß sharp İstanbul ΣΊΣΥΦΟΣ",
    "Ω ohm Å angstrom K kelvin",                  # letters with compatibility forms
    "dog" * 40,                                   # long word of known pieces
]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  reference.write_vocab(str(path))
  return str(path)


def _references(vocab_file, **settings):
  from transformers import BertTokenizer
  from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
  return (BertTokenizerLegacy(vocab_file, **settings), BertTokenizer(vocab_file, **settings))


# transformers' behaviour: the tokenizer of a Hugging Face directory.
HF = dict(max_input_chars_per_word=100)

SETTINGS = [
    dict(do_lower_case=True),
    dict(do_lower_case=False),
    dict(do_lower_case=True, strip_accents=False),
    dict(do_lower_case=False, strip_accents=True),
    dict(do_lower_case=True, tokenize_chinese_chars=False),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=[str(s) for s in SETTINGS])
def test_tokens_and_ids_match_reference(vocab_file, settings):
  ours = WordPieceTokenizer(vocab_file, **settings, **HF)
  for ref in _references(vocab_file, **settings):
    legacy = type(ref).__name__ == "BertTokenizerLegacy"
    for text in TEXTS:
      if legacy and unicodedata.normalize("NFC", text) != text:
        # transformers added NFC composition to its Python port; the original
        # tokenization.py and the `tokenizers` pipeline have none.
        continue
      assert ours.tokenize(text) == ref.tokenize(text), (type(ref).__name__, text)
      assert ours.encode(text) == ref.encode(text), (type(ref).__name__, text)
    for a, b in zip(TEXTS, TEXTS[1:]):
      if legacy and (not b or unicodedata.normalize("NFC", a + b) != a + b):
        continue  # It also adds an empty segment B; the original code doesn't.
      assert ours.encode(a, b) == ref.encode(a, b), (type(ref).__name__, a, b)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_tokens_and_ids_match_the_original(vocab_file, do_lower_case):
  """The original FullTokenizer: words of up to 200 characters (the default),
  "[MASK]" in the text read as `[`, `mask`, `]` (with
  `special_tokens_in_text=False`)."""
  tokenization = reference.original("tokenization")
  original = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
  ours = WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case,
                            special_tokens_in_text=False)
  for text in TEXTS:
    assert ours.tokenize(text) == original.tokenize(text), text
    assert ours.encode_pieces([text])[0] == original.convert_tokens_to_ids(
        original.tokenize(text)), text


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_special_tokens_written_in_text_are_the_tokens(vocab_file, do_lower_case):
  """"[MASK]" typed in the text is the [MASK] token, as transformers reads it
  (a fill-mask pipeline needs it); lower-cased it is plain text, as there.
  `special_tokens_in_text=False` reads it as the original FullTokenizer (which
  needs no TensorFlow to say so): the pieces `[`, `mask`, `]`."""
  ours = WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case)
  plain = WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case,
                             special_tokens_in_text=False)
  for special in ("[MASK]", "[SEP]", "[CLS]", "[PAD]", "[UNK]"):
    assert ours.tokenize(f"x {special} y") == ["x", special, "y"]
    assert ours.encode_pieces([f"x {special} y"])[0][1] == ours.token_to_id(special)
    pieces = plain.tokenize(f"x {special} y")
    assert pieces[1] == "[" and pieces[-2:] == ["]", "y"] and special not in pieces
    assert plain.token_to_id(special) not in plain.encode_pieces([f"x {special} y"])[0]
  assert "[MASK]" not in ours.tokenize("x [mask] y")


def test_word_length_limits(vocab_file):
  ours = WordPieceTokenizer(vocab_file)
  assert ours.tokenize("a" * 200) == ["a"] + ["##a"] * 199  # the original's limit
  assert ours.tokenize("a" * 201) == ["[UNK]"]
  hugging_face = WordPieceTokenizer(vocab_file, **HF)
  assert hugging_face.tokenize("a" * 100) == ["a"] + ["##a"] * 99
  assert hugging_face.tokenize("a" * 101) == ["[UNK]"]


def test_normaliser_differences_from_the_original(tmp_path):
  """What `tokenizers`' BertNormalizer (bertjax's and transformers') does
  otherwise than the original's Python, as docs/paper.md says: private-use
  characters (category Co) are dropped, where the original keeps them (as
  [UNK]); Greek capital sigma lower-cases to σ everywhere, where Python's
  `str.lower` writes ς at a word's end."""
  tokenization = reference.original("tokenization")
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b",
                               "οδος", "οδοσ", "σ", "ς", "ο", "δ", "##ο", "##δ", "##σ",
                               "##ς"]) + "\n")
  original = tokenization.FullTokenizer(str(vocab), do_lower_case=True)
  ours = WordPieceTokenizer(str(vocab))
  assert original.tokenize("a \ue000 b") == ["a", "[UNK]", "b"]
  assert ours.tokenize("a \ue000 b") == ["a", "b"]
  assert original.tokenize("ΟΔΟΣ") == ["οδος"]
  assert ours.tokenize("ΟΔΟΣ") == ["οδοσ"]


def test_batch_matches_reference_with_truncation_and_padding(vocab_file):
  legacy, fast = _references(vocab_file, do_lower_case=True)
  ours = WordPieceTokenizer(vocab_file, **HF)
  firsts, seconds = TEXTS[:9], TEXTS[9:18]
  batch = ours.encode_batch(firsts, seconds, max_length=24)
  assert batch["input_ids"].dtype == np.int32
  for row, (a, b) in enumerate(zip(firsts, seconds)):
    # The original BERT truncation rule (the legacy tokenizer implements it);
    # an empty B is no B (the fast tokenizer agrees with the original there).
    expected = (legacy if b else fast)(a, b, max_length=24, truncation="longest_first",
                                       return_token_type_ids=True)
    mask = batch["attention_mask"][row].astype(bool)
    assert batch["input_ids"][row][mask].tolist() == expected["input_ids"]
    assert batch["token_type_ids"][row][mask].tolist() == expected["token_type_ids"]
    assert (batch["input_ids"][row][~mask] == ours.pad_id).all()
    assert mask.tolist() == sorted(mask.tolist(), reverse=True)  # padding at the end
  # Unpaired texts: the same as both references.
  single = ours.encode_batch(TEXTS, max_length=16, padding="max_length")
  assert single["input_ids"].shape == (len(TEXTS), 16)
  for row, text in enumerate(TEXTS):
    mask = single["attention_mask"][row].astype(bool)
    for ref in (legacy, fast):
      assert single["input_ids"][row][mask].tolist() == ref(
          text, max_length=16, truncation=True)["input_ids"]


def test_truncate_pair_is_the_original_rule():
  def original(len_a, len_b, budget):  # remove from the longer, B on ties
    while len_a + len_b > budget:
      if len_a > len_b:
        len_a -= 1
      else:
        len_b -= 1
    return len_a, len_b

  for len_a in range(0, 20):
    for len_b in range(0, 20):
      for budget in range(0, 25):
        assert truncate_pair(len_a, len_b, budget) == original(len_a, len_b, budget)


def test_padding_options(vocab_file):
  ours = WordPieceTokenizer(vocab_file)
  batch = ours.encode_batch(["hello", "hello world the fox"], pad_to_multiple_of=8)
  assert batch["input_ids"].shape == (2, 8)
  assert batch["attention_mask"].sum(axis=1).tolist() == [3, 6]
  with pytest.raises(ValueError, match="Row 1 has 6 tokens, more than max_length=4"):
    ours.encode_batch(["hello", "hello world the fox"], max_length=4, truncation=False)
  with pytest.raises(ValueError, match="2 texts but 1 text pairs"):
    ours.encode_batch(["a", "b"], ["c"])


def test_vocabulary_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing.txt"):
    WordPieceTokenizer(str(tmp_path / "missing.txt"))
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"[PAD]\n[UNK]\nok\n\xff\xfe\n")
  with pytest.raises(ValueError, match=r"bad.txt, line 4: not valid UTF-8"):
    WordPieceTokenizer(str(bad))
  partial = tmp_path / "partial.txt"
  partial.write_text("[PAD]\n[UNK]\n[CLS]\nhello\n")
  with pytest.raises(ValueError, match=r"partial.txt: special tokens \['\[SEP\]', '\[MASK\]'\]"):
    WordPieceTokenizer(str(partial))


@pytest.mark.parametrize("special_tokens_in_text", [False, True])
def test_save_and_restore(vocab_file, tmp_path, special_tokens_in_text):
  ours = WordPieceTokenizer(vocab_file, do_lower_case=False, strip_accents=True,
                            special_tokens_in_text=special_tokens_in_text)
  settings = ours.save(str(tmp_path))
  restored = tokenizer_from_settings(str(tmp_path), settings)
  for text in TEXTS:
    assert restored.encode(text) == ours.encode(text)
  assert restored.decode(ours.encode("hello world")) == "hello world"
  assert restored.decode(ours.encode("hello [MASK]")) == (
      "hello" if special_tokens_in_text else "hello [ MASK ]")
  assert settings["split_special_tokens"] == (not special_tokens_in_text)


@pytest.mark.parametrize("saved", [False, True, None])
def test_settings_of_earlier_versions_read_special_tokens(vocab_file, tmp_path, saved):
  """Settings saved while plain text was the default (`special_tokens_in_text:
  false`, which no one chose), with the token read (true) and from before the
  setting existed (none): typed special tokens restore as the tokens."""
  settings = WordPieceTokenizer(vocab_file).save(str(tmp_path))
  del settings["split_special_tokens"]
  if saved is not None:
    settings["special_tokens_in_text"] = saved
  restored = tokenizer_from_settings(str(tmp_path), settings)
  assert restored.tokenize("a [MASK] b") == ["a", "[MASK]", "b"]
  assert current_settings(settings) == WordPieceTokenizer(vocab_file).save(str(tmp_path))


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory):
  import sentencepiece

  directory = tmp_path_factory.mktemp("spm")
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa",
           "lambda", "sigma", "omega", "token", "piece", "model", "Hello", "World"]
  sentences = [" ".join(rng.choice(words, 8)) for _ in range(2000)]
  prefix = str(directory / "spm")
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=40,
      user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], pad_id=0, unk_id=1, bos_id=-1,
      eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]", minloglevel=2)
  return prefix + ".model"


def test_sentencepiece_layout_and_pieces(sentencepiece_model):
  import sentencepiece

  processor = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model)
  ours = SentencePieceTokenizer(sentencepiece_model)
  text, pair = "alpha beta gammadelta", "omega token"
  assert ours.tokenize(text) == processor.encode(text, out_type=str)
  ids = ours.encode(text, pair)
  assert ids == ([ours.cls_id] + processor.encode(text) + [ours.sep_id]
                 + processor.encode(pair) + [ours.sep_id])
  assert ours.special_tokens == {"unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]",
                                 "mask": "[MASK]", "pad": "[PAD]"}
  assert ours.pad_id == 0 and ours.unk_id == 1
  masked = ours.encode("alpha [MASK] beta")
  assert masked == [ours.cls_id] + processor.encode("alpha") + [ours.mask_id] + \
      processor.encode("beta") + [ours.sep_id]
  batch = ours.encode_batch([text, "beta"], [pair, "zeta"], max_length=8)
  assert batch["input_ids"].shape == (2, 8)
  assert batch["token_type_ids"][1].tolist()[:5] == [0, 0, 0, 1, 1]
  assert ours.decode(ids) == processor.decode(processor.encode(text) + processor.encode(pair))


def test_sentencepiece_lower_case_and_errors(sentencepiece_model, tmp_path):
  lower = SentencePieceTokenizer(sentencepiece_model, do_lower_case=True)
  assert lower.tokenize("HELLO") == SentencePieceTokenizer(sentencepiece_model).tokenize(
      "hello")
  with pytest.raises(ValueError, match=r"special tokens \['<cls>'\] are not pieces"):
    SentencePieceTokenizer(sentencepiece_model, special_tokens={
        "unk": "[UNK]", "cls": "<cls>", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]"})
  garbage = tmp_path / "garbage.model"
  garbage.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="garbage.model: not a valid SentencePiece model"):
    SentencePieceTokenizer(str(garbage))


WORDS = ["EU", "rejects", "German", "call", ".", "Zürich's", "2,000", "🦊", "don't",
         "(jumping-resumed)", "the", "cat"]


def test_words_read_as_running_text_with_a_byte_level_bpe(tmp_path):
  """A byte-level BPE marks a word after a space ("Ġcat"): each word gets the
  pieces it has in the joined text, as transformers encodes it, the first word
  as the text's start or after a space."""
  transformers = pytest.importorskip("transformers")
  reference.write_bpe_tokenizer(tmp_path)
  ours = JsonTokenizer(str(tmp_path / "tokenizer.json"))
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
  text = " ".join(WORDS)
  assert ours.encode_words(WORDS) == reference.running_text_pieces(theirs, text, WORDS)
  assert ours.encode_words(WORDS, text_start=False) == reference.running_text_pieces(
      theirs, " " + text, WORDS)
  assert ours.encode_words(WORDS) != ours.encode_pieces(WORDS)  # the marks matter
  assert ours.encode_words(["New York"], text_start=False) == [
      theirs(" New York", add_special_tokens=False)["input_ids"]]


def test_basic_words_of_a_tokenizer_json_follow_its_normaliser(tmp_path):
  """SQuAD maps answers back through the words the normaliser leaves: lower-
  cased and without accents by a BERT normaliser, split where a Llama-style
  one marks spaces "▁"."""
  import tokenizers
  from tokenizers import models, normalizers, pre_tokenizers

  words = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "[MASK]": 4}
  for name, normalizer in (
      ("bert", normalizers.BertNormalizer(lowercase=True)),
      ("llama", normalizers.Sequence([normalizers.Prepend("\u2581"),
                                      normalizers.Replace(" ", "\u2581")]))):
    backend = tokenizers.Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / f"{name}.json"))
    ours = JsonTokenizer(str(tmp_path / f"{name}.json"))
    expected = ["cafe", "naive"] if name == "bert" else ["Café", "Naïve"]  # accents stripped
    assert ours.basic_tokenize("Café  Naïve") == expected, name


def test_a_tokenizer_json_lower_cases_as_its_normaliser_says(tmp_path):
  """`--do_lower_case` left unset takes a tokenizer.json as it is; set against
  what its normaliser does, it is refused, naming the file."""
  from bertjax import errors
  from bertjax.data import vocabulary
  from bertjax.data.tokenizers import tokenizer_from_vocab_file

  texts = lambda: iter(["Paris is in France .", "The Cat sat ."] * 50)
  cased, lower = str(tmp_path / "cased.json"), str(tmp_path / "lower.json")
  vocabulary.train_bpe(texts, cased, 400, False)
  vocabulary.train_bpe(texts, lower, 400, True)
  assert not tokenizer_from_vocab_file(cased).lowercases
  assert tokenizer_from_vocab_file(lower).lowercases
  assert tokenizer_from_vocab_file(lower, do_lower_case=True).lowercases
  with pytest.raises(errors.UsageError, match=r"--do_lower_case=true, but .*cased.json keeps "
                     "the case of the text"):
    tokenizer_from_vocab_file(cased, do_lower_case=True)
  with pytest.raises(errors.UsageError, match="lower.json lower-cases the text"):
    tokenizer_from_vocab_file(lower, do_lower_case=False)
