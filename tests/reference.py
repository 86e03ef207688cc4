"""The reference BERTs the tests compare against: transformers' (PyTorch)
with random weights, and Google's original code (`bert-tensorflow`, the
google-research/bert release on PyPI)."""

from __future__ import annotations

import importlib
import json
import os
import string

import numpy as np

# A small vocabulary in BERT's layout: specials, single characters (with their
# "##" continuations), whole words and word pieces, cased and uncased forms.
_WORDS = ("the quick brown fox jump over lazy dog hello world un aff able cafe "
          "resume naive token izer test ##s ##ed ##ing ##able ##aff The Hello World "
          "Café résumé NAIVE").split()
_CHARS = (list(string.ascii_letters + string.digits + string.punctuation)
          + list("éèàüöñçÉÀ東京都日本語中文首") + ["😀"])


def original(module: str):
  """`bert.<module>` of Google's original code (tokenization,
  create_pretraining_data, ...); the test is skipped without TensorFlow, which
  it imports (the `[tf]` extra)."""
  import pytest

  pytest.importorskip("tensorflow", reason="Google's original BERT code imports TensorFlow")
  from absl import flags

  loaded = importlib.import_module(f"bert.{module}")
  if not flags.FLAGS.is_parsed():  # its modules read flags (preserve_unused_tokens)
    flags.FLAGS.mark_as_parsed()
  return loaded


def vocab_tokens() -> list[str]:
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tokens += [f"[unused{i}]" for i in range(3)]
  tokens += _WORDS + _CHARS + ["##" + c for c in string.ascii_letters + "éèàü"]
  seen: set[str] = set()
  return [t for t in tokens if not (t in seen or seen.add(t))]


def write_vocab(path: str) -> list[str]:
  tokens = vocab_tokens()
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in tokens))
  return tokens


def randomize(model, seed: int = 0, scale: float = 0.2):
  """Replaces every weight (LayerNorm and biases included) with random values."""
  import torch

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in model.named_parameters():
      noise = torch.randn(param.shape, generator=generator) * scale
      param.copy_(noise + (1.0 if "LayerNorm.weight" in name else 0.0))
  return model.eval()


def reference_model(class_name: str, seed: int = 0, **config):
  """A randomly weighted `transformers.<class_name>` in eval mode."""
  import transformers

  model = getattr(transformers, class_name)(transformers.BertConfig(**config))
  return randomize(model, seed)


def example_batch(vocab_size: int, batch: int = 3, length: int = 11, seed: int = 0):
  """Ids, a padding mask (rows of different lengths) and both token types."""
  rng = np.random.RandomState(seed)
  input_ids = rng.randint(5, vocab_size, (batch, length))
  attention_mask = np.ones((batch, length), np.int64)
  token_type_ids = np.zeros((batch, length), np.int64)
  for row in range(batch):
    real = length - 3 * row
    attention_mask[row, real:] = 0
    input_ids[row, real:] = 0
    token_type_ids[row, real // 2:real] = 1
  return input_ids, attention_mask, token_type_ids


def write_tiny_checkpoint(directory, num_layers: int = 2) -> str:
  """A Hugging Face BERT directory: L`num_layers`/H32, the test vocabulary, and
  random weights drawn from a fixed seed (the same whichever tests ran before
  in the process, which would otherwise have moved torch's generator)."""
  import torch
  import transformers

  with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=210, hidden_size=32, num_hidden_layers=num_layers, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64))
  model.save_pretrained(directory)
  write_vocab(str(directory / "vocab.txt"))
  return str(directory)


BPE_SPECIAL = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
BPE_TEXTS = ["The quick brown fox jumps over the lazy dog.",
             "Ünïcödé text, émoji 🦊 and tabs\there.", "A [MASK] in the text.", "",
             "   spaces   everywhere  "]


def write_bpe_tokenizer(directory) -> int:
  """A byte-level BPE `tokenizer.json` built as ModernBERT's is (its special
  tokens, [CLS] A [SEP] B [SEP] post-processing), trained on a few sentences;
  with a `tokenizer_config.json` for transformers. Returns the vocabulary size."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  backend = tokenizers.Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=BPE_SPECIAL,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  backend.train_from_iterator(BPE_TEXTS * 20 + ["the cat sat on the mat"] * 20, trainer)
  cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
  backend.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  os.makedirs(directory, exist_ok=True)
  backend.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
               "unk_token": "[UNK]"}, f)
  return backend.get_vocab_size()


def running_text_pieces(tokenizer, text: str, words: list[str]) -> list[list[int]]:
  """Each word's ids in a transformers tokenizer's encoding of `text` (the
  words joined by single spaces, after an optional leading space), assigned to
  words through the character offsets."""
  owner = [None] * len(text)  # the word of each character; None for the spaces
  position = len(text) - len(" ".join(words))  # after a leading space, if any
  for index, word in enumerate(words):
    owner[position:position + len(word)] = [index] * len(word)
    position += len(word) + 1
  encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
  pieces = [[] for _ in words]
  for token_id, (start, _) in zip(encoding["input_ids"], encoding["offset_mapping"]):
    # A piece belongs to the word of its first character after any space (a
    # lone "Ġ" to the word that follows it).
    pieces[next(o for o in owner[start:] if o is not None)].append(token_id)
  return pieces
