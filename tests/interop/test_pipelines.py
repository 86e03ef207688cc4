"""transformers' pipelines on bertjax's exports.

Every pipeline a task model supports (`fill-mask`, `text-classification`,
`token-classification`, `feature-extraction`; `question-answering` as its
parts, the pipeline being gone from transformers 5) runs on the export of a
bertjax model of that task, in both families (BERT with WordPiece, ModernBERT
with a byte-level BPE), and gives what bertjax computes itself: the same
tokens in the same order, labels, tags and answer, with scores and features
within float32 rounding. Each family's weights start from
a random reference model; the task heads are bertjax's own initialisation.
"""

import json
import os
import re

import numpy as np
import pytest
import torch
import transformers

import bertjax
from tests import reference
from tests.conftest import modes_not_the_umasks

TOLERANCE = 1e-5
BERT = dict(vocab_size=210, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=40, max_position_embeddings=40, type_vocab_size=2)
MODERNBERT = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=40, local_attention=12, global_attn_every_n_layers=2,
                  max_position_embeddings=64, pad_token_id=3, bos_token_id=1, eos_token_id=2,
                  cls_token_id=1, sep_token_id=2)
# What each family's texts look like: its vocabulary's words (the BPE's
# tokenizer is cased and trained on these sentences).
TEXTS = {
    "bert": dict(masked="the quick brown [MASK] jump over the lazy dog.",
                 plain="the quick brown fox jump over the lazy dog.",
                 question="what did the fox jump over?"),
    "modernbert": dict(masked="The quick brown [MASK] jumps over the lazy dog.",
                       plain="The quick brown fox jumps over the lazy dog.",
                       question="What did the fox jump over?"),
}
CLASSES = ["negative", "neutral", "positive"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def family(request, tmp_path_factory):
  """(family, a Hugging Face directory of its masked-LM weights and tokenizer)."""
  directory = tmp_path_factory.mktemp(request.param)
  with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    if request.param == "bert":
      model = transformers.BertForPreTraining(transformers.BertConfig(**BERT))
      reference.write_vocab(str(directory / "vocab.txt"))
    else:
      vocab_size = reference.write_bpe_tokenizer(directory)
      model = transformers.ModernBertForMaskedLM(
          transformers.ModernBertConfig(vocab_size=vocab_size, **MODERNBERT))
  reference.randomize(model, seed=3).save_pretrained(directory)
  return request.param, str(directory)


def _export(family, task, tmp_path, labels=None):
  """A bertjax model of `task` on the family's weights, and its export."""
  name, directory = family
  bundle = bertjax.load_pretrained(directory, task=task, labels=labels, seed=5)
  bertjax.export_hf(bundle, str(tmp_path / "export"))
  assert not modes_not_the_umasks(tmp_path / "export")  # readable by others, as usual
  return bundle, str(tmp_path / "export")


def _outputs(bundle, texts, pairs=None):
  inputs = bundle.tokenizer.encode_batch(texts, pairs)
  outputs = bundle.model().apply({"params": bundle.params}, **inputs)
  return inputs, {k: np.asarray(v) for k, v in outputs.items() if v is not None}


def _softmax(logits):
  exp = np.exp(logits - logits.max(-1, keepdims=True))
  return exp / exp.sum(-1, keepdims=True)


def _assert_close(ours, theirs, what):
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  assert ours.shape == theirs.shape, what
  tolerance = TOLERANCE * max(1.0, float(np.abs(theirs).max()))
  assert np.abs(ours - theirs).max() <= tolerance, (what, ours, theirs)


def test_fill_mask_gives_bertjaxs_top_5(family, tmp_path):
  task = "pretraining" if family[0] == "bert" else "masked_lm"  # the demo's: pretraining
  bundle, export = _export(family, task, tmp_path)
  text = TEXTS[family[0]]["masked"]
  config = json.loads(open(os.path.join(export, "tokenizer_config.json")).read())
  assert not config.get("split_special_tokens", False)
  inputs, outputs = _outputs(bundle, [text])
  position = list(inputs["input_ids"][0]).index(bundle.tokenizer.mask_id)
  probabilities = _softmax(outputs["mlm_logits"][0, position])
  ours = np.argsort(-probabilities, kind="stable")[:5]

  theirs = transformers.pipeline("fill-mask", model=export)(text, top_k=5)
  assert [answer["token"] for answer in theirs] == list(ours)
  _assert_close([answer["score"] for answer in theirs], probabilities[ours], "scores")


def test_text_classification_gives_bertjaxs_label(family, tmp_path):
  bundle, export = _export(family, "sequence_classification", tmp_path, CLASSES)
  text = TEXTS[family[0]]["plain"]
  probabilities = _softmax(_outputs(bundle, [text])[1]["logits"][0])
  theirs = transformers.pipeline("text-classification", model=export)(text, top_k=None)
  assert theirs[0]["label"] == CLASSES[int(np.argmax(probabilities))]
  scores = {answer["label"]: answer["score"] for answer in theirs}
  _assert_close([scores[label] for label in CLASSES], probabilities, "scores")


def test_token_classification_gives_bertjaxs_tags(family, tmp_path):
  bundle, export = _export(family, "token_classification", tmp_path, TAGS)
  text = TEXTS[family[0]]["plain"]
  inputs, outputs = _outputs(bundle, [text])
  length = int(inputs["attention_mask"][0].sum())
  probabilities = _softmax(outputs["logits"][0, 1:length - 1])  # [CLS] and [SEP] have none
  theirs = transformers.pipeline("token-classification", model=export)(text, ignore_labels=[])
  assert [(tag["index"], tag["entity"]) for tag in theirs] == [
      (index, TAGS[i]) for index, i in enumerate(probabilities.argmax(-1), start=1)]
  assert len({tag["entity"] for tag in theirs}) > 1  # not one tag everywhere
  _assert_close([tag["score"] for tag in theirs], probabilities.max(-1), "scores")


def test_question_answering_gives_bertjaxs_span(family, tmp_path):
  """transformers 5 removed its question-answering pipeline; what it was made
  of is here: the question-answering class and the tokenizer's character
  offsets, which put bertjax's best span (the pipeline's rule: the largest
  start + end score in the context, up to 15 tokens) on the context's text."""
  bundle, export = _export(family, "question_answering", tmp_path)
  question, context = TEXTS[family[0]]["question"], TEXTS[family[0]]["plain"]
  inputs, outputs = _outputs(bundle, [question], [context])
  length = int(inputs["attention_mask"][0].sum())
  ids = list(inputs["input_ids"][0, :length])
  # The context's tokens: between the question's [SEP] and the last one.
  first, last = ids.index(bundle.tokenizer.sep_id) + 1, length - 2
  start, end = outputs["start_logits"][0], outputs["end_logits"][0]
  _, begin, finish = max((start[s] + end[e], s, e) for s in range(first, last + 1)
                         for e in range(s, min(last, s + 14) + 1))
  ours = bundle.tokenizer.decode(ids[begin:finish + 1]).strip()

  tokenizer = transformers.AutoTokenizer.from_pretrained(export)
  model = transformers.AutoModelForQuestionAnswering.from_pretrained(export).eval()
  encoded = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
  offsets = encoded.pop("offset_mapping")[0].tolist()
  assert encoded["input_ids"][0].tolist() == ids
  with torch.no_grad():
    theirs = model(**encoded)
  _assert_close(start[:length], theirs.start_logits[0], "start scores")
  _assert_close(end[:length], theirs.end_logits[0], "end scores")
  assert context[offsets[begin][0]:offsets[finish][1]].strip() == ours and ours


def test_feature_extraction_gives_bertjaxs_features(family, tmp_path):
  bundle, export = _export(family, "encoder", tmp_path)
  text = TEXTS[family[0]]["plain"]
  ours = bertjax.encode(bundle, [text])
  length = int(ours["attention_mask"][0].sum())
  theirs = transformers.pipeline("feature-extraction", model=export)(text)
  _assert_close(ours["sequence_output"][0, :length], np.asarray(theirs)[0], "features")


def test_the_docs_comparison_script_runs(tmp_path, monkeypatch, capsys):
  """docs/checkpoints.md's script, as written, on a model directory and its
  export (the command before it, `convert --to=hf`, is `export_hf`)."""
  docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "checkpoints.md")
  text = open(docs, encoding="utf-8").read()
  script = re.search(r"## transformers' pipelines on an export\n.*?```python\n(.*?)```", text,
                     re.S).group(1)
  model = reference.reference_model("BertForPreTraining", seed=7, **BERT)
  model.save_pretrained(tmp_path / "hf")
  reference.write_vocab(str(tmp_path / "hf" / "vocab.txt"))
  bertjax.save_pretrained(bertjax.load_pretrained(str(tmp_path / "hf")), str(tmp_path / "demo"))
  monkeypatch.chdir(tmp_path)
  bertjax.export_hf(bertjax.load_pretrained(str(tmp_path / "demo")), "demo_hf")
  exec(script.replace('"/tmp/demo"', repr(str(tmp_path / "demo"))), {})
  lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
  assert float(lines["largest difference"]) < 1e-4
  assert lines["bertjax"].strip() == lines["transformers"].strip()
