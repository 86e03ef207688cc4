"""The bertjax model directory, loading into another task, and casing rules."""

import json
import os

import jax
import numpy as np
import pytest

import bertjax
import bertjax.data.tokenizers
from bertjax.interop import mapping
from tests import reference
from tests.conftest import modes_not_the_umasks

CONFIG = dict(vocab_size=210, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=40, max_position_embeddings=40, type_vocab_size=2)


def _reference_dir(directory, class_name="BertForPreTraining", seed=21, **extra):
  model = reference.reference_model(class_name, seed=seed, **CONFIG, **extra)
  model.save_pretrained(directory)
  reference.write_vocab(os.path.join(directory, "vocab.txt"))
  return directory


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
  return bertjax.load_pretrained(_reference_dir(tmp_path_factory.mktemp("pretraining")))


def _assert_same_params(a, b):
  flat_a, flat_b = mapping.params_to_reference(a), mapping.params_to_reference(b)
  assert flat_a.keys() == flat_b.keys()
  for name in flat_a:
    np.testing.assert_array_equal(flat_a[name], flat_b[name], err_msg=name)


def test_save_and_load_bertjax_directory_is_exact(pretraining, tmp_path):
  bertjax.save_pretrained(pretraining, tmp_path / "model")
  assert sorted(os.listdir(tmp_path)) == ["model"]  # no temporary left behind
  loaded = bertjax.load_pretrained(tmp_path / "model")
  assert loaded.config == pretraining.config and loaded.task == "pretraining"
  _assert_same_params(loaded.params, pretraining.params)
  text = "Hello world, the quick brown fox"
  assert loaded.tokenizer.encode(text) == pretraining.tokenizer.encode(text)

  scanned = bertjax.load_pretrained(tmp_path / "model", scan_layers=True, dtype="bfloat16")
  assert scanned.config.scan_layers and scanned.config.dtype == "bfloat16"
  assert scanned.params["bert"]["layers"]["layer"]["output"]["kernel"].shape == (2, 40, 32)
  batch = reference.example_batch(CONFIG["vocab_size"])
  expected = pretraining.model().apply({"params": pretraining.params}, *batch)
  got = bertjax.load_pretrained(tmp_path / "model", scan_layers=True).model().apply(
      {"params": scanned.params}, *batch)
  np.testing.assert_allclose(got["mlm_logits"], expected["mlm_logits"], atol=1e-5)


def test_new_head_on_a_pretrained_encoder(pretraining, tmp_path, caplog):
  bertjax.save_pretrained(pretraining, tmp_path / "model")
  with caplog.at_level("WARNING"):
    bundle = bertjax.load_pretrained(tmp_path / "model", task="sequence_classification",
                                     labels=["neg", "neutral", "pos"], seed=3)
  assert "initialised randomly: classifier/bias, classifier/kernel" in caplog.text
  assert bundle.num_labels == 3 and bundle.labels == ["neg", "neutral", "pos"]
  assert bundle.params["classifier"]["kernel"].shape == (32, 3)
  jax.tree.map(np.testing.assert_array_equal, bundle.params["bert"],
               pretraining.params["bert"])
  logits = bundle.model().apply({"params": bundle.params},
                                *reference.example_batch(CONFIG["vocab_size"]))["logits"]
  assert logits.shape == (3, 3)


def test_pretraining_heads_carry_over_between_pretraining_tasks(tmp_path, caplog):
  directory = _reference_dir(tmp_path / "model")
  with caplog.at_level("WARNING"):
    masked_lm = bertjax.load_pretrained(directory, task="masked_lm")
  assert "initialised randomly" not in caplog.text
  assert "cls.seq_relationship.bias, cls.seq_relationship.weight" in caplog.text  # unused
  jax.tree.map(np.testing.assert_array_equal, masked_lm.params["mlm"],
               bertjax.load_pretrained(directory).params["mlm"])


def test_new_head_initialises_a_missing_pooler(tmp_path, caplog):
  _reference_dir(tmp_path / "qa", "BertForQuestionAnswering")
  with caplog.at_level("WARNING"):
    bundle = bertjax.load_pretrained(tmp_path / "qa", task="multiple_choice")
  assert "bert/pooler/kernel" in caplog.text
  assert bundle.params["bert"]["pooler"]["kernel"].shape == (32, 32)


def test_bad_bertjax_directory(pretraining, tmp_path):
  bertjax.save_pretrained(pretraining, tmp_path / "model")
  meta_path = tmp_path / "model" / "bertjax.json"
  meta = json.loads(meta_path.read_text())
  meta_path.write_text(json.dumps({**meta, "format_version": 99}))
  with pytest.raises(ValueError, match="bertjax.json: format_version 99 is not supported"):
    bertjax.load_pretrained(tmp_path / "model")
  meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "task"}))
  with pytest.raises(ValueError, match="bertjax.json: required key 'task' is missing"):
    bertjax.load_pretrained(tmp_path / "model")
  meta_path.write_text("{not json")
  with pytest.raises(ValueError, match="bertjax.json: not valid JSON"):
    bertjax.load_pretrained(tmp_path / "model")


def test_failed_save_leaves_nothing_and_overwrite_keeps_old_until_done(pretraining, tmp_path,
                                                                        monkeypatch):
  import orbax.checkpoint as ocp

  bertjax.save_pretrained(pretraining, tmp_path / "model")
  before = sorted(os.listdir(tmp_path / "model"))

  def fail(*args, **kwargs):
    raise OSError("no space left on device")

  monkeypatch.setattr(ocp.StandardCheckpointer, "save", fail)
  with pytest.raises(OSError, match="no space left"):
    bertjax.save_pretrained(pretraining, tmp_path / "model", overwrite=True)
  with pytest.raises(OSError, match="no space left"):
    bertjax.save_pretrained(pretraining, tmp_path / "other")
  assert sorted(os.listdir(tmp_path)) == ["model"]
  assert sorted(os.listdir(tmp_path / "model")) == before
  monkeypatch.undo()
  bertjax.save_pretrained(pretraining, tmp_path / "model", overwrite=True)
  assert sorted(os.listdir(tmp_path)) == ["model"]


def test_params_that_do_not_fit_the_model_are_refused(pretraining, tmp_path):
  broken = bertjax.Pretrained(pretraining.config, {"bert": pretraining.params["bert"]},
                              pretraining.tokenizer, task="pretraining")
  with pytest.raises(ValueError, match=r"\['mlm'\]\['bias'\]: missing"):
    bertjax.export_hf(broken, tmp_path / "out")
  assert not os.path.exists(tmp_path / "out")


def test_casing(tmp_path):
  cased = bertjax.load_pretrained(_reference_dir(tmp_path / "cased_model"))
  assert not cased.tokenizer.do_lower_case  # "cased" in the name
  forced = bertjax.load_pretrained(tmp_path / "cased_model", do_lower_case=True)
  assert forced.tokenizer.do_lower_case
  plain = bertjax.load_pretrained(_reference_dir(tmp_path / "plain"))
  assert not plain.tokenizer.do_lower_case  # the vocabulary has upper-case words
  bertjax.save_pretrained(cased, tmp_path / "saved")
  assert not bertjax.load_pretrained(tmp_path / "saved").tokenizer.do_lower_case
  assert bertjax.load_pretrained(tmp_path / "saved", do_lower_case=True).tokenizer.do_lower_case


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_directories_are_readable_by_others(pretraining, tmp_path, umask):
  """Every file and directory written has the umask's usual mode (0644 and
  0755 under 022), model.safetensors included, which its library writes 0600."""
  old = os.umask(umask)
  try:
    bertjax.save_pretrained(pretraining, tmp_path / "model")
    bertjax.export_hf(pretraining, tmp_path / "hf")
  finally:
    os.umask(old)
  assert (tmp_path / "model").stat().st_mode & 0o777 == 0o777 & ~umask
  assert not modes_not_the_umasks(tmp_path / "model", umask)
  assert not modes_not_the_umasks(tmp_path / "hf", umask)
  assert sorted(os.listdir(tmp_path / "hf")) == [
      "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
      "tokenizer_config.json", "vocab.txt"]


def test_sentencepiece_model_round_trips(pretraining, tmp_path):
  import sentencepiece

  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(" ".join(rng.choice(words, 6)) for _ in range(500)),
      model_prefix=str(tmp_path / "spm"), vocab_size=30,
      user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], pad_id=0, unk_id=1, bos_id=-1,
      eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]", minloglevel=2)
  tokenizer = bertjax.data.tokenizers.SentencePieceTokenizer(str(tmp_path / "spm.model"),
                                                             do_lower_case=True)
  bundle = bertjax.Pretrained(pretraining.config, pretraining.params, tokenizer,
                              pretraining.task)
  text = "Alpha BETA [MASK] gamma"
  bertjax.save_pretrained(bundle, tmp_path / "bj")
  assert bertjax.load_pretrained(tmp_path / "bj").tokenizer.encode(text) == tokenizer.encode(
      text)
  bertjax.export_hf(bundle, tmp_path / "hf")
  assert bertjax.load_pretrained(tmp_path / "hf").tokenizer.encode(text) == tokenizer.encode(
      text)
  assert tokenizer.encode(text)[3] == tokenizer.mask_id  # "[MASK]" typed: the token


def _upload_tree(local, url):
  from bertjax import files

  for root, _, names in os.walk(local):
    for name in names:
      path = os.path.join(root, name)
      files.upload(path, files.join(url, os.path.relpath(path, local)))


def test_gcs_directories_of_every_format_load_and_save(pretraining, gcs, tmp_path):
  from bertjax import files

  # A Hugging Face directory and a bertjax directory on gs://, read in place.
  hf_local = _reference_dir(str(tmp_path / "hf"))
  _upload_tree(hf_local, gcs.url_of("pretrained/hf"))
  for name in ("pytorch_model.bin", "tf_model.h5"):  # a Hub repository's other copies
    files.write_text(gcs.url_of(f"pretrained/hf/{name}"), "not fetched")
  from_gcs = bertjax.load_pretrained(gcs.url_of("pretrained/hf"))
  fetched = os.listdir(files.cache_path(gcs.url_of("pretrained/hf")))
  assert "model.safetensors" in fetched and not {"pytorch_model.bin", "tf_model.h5"} & set(
      fetched)
  _assert_same_params(from_gcs.params, bertjax.load_pretrained(hf_local).params)
  assert from_gcs.tokenizer.tokenize("the quick fox") == pretraining.tokenizer.tokenize(
      "the quick fox")
  bertjax.save_pretrained(pretraining, gcs.url_of("pretrained/bertjax"))
  assert files.listdir(gcs.url_of("pretrained/bertjax"))[0] == "bertjax.json"
  reloaded = bertjax.load_pretrained(gcs.url_of("pretrained/bertjax"))
  _assert_same_params(reloaded.params, pretraining.params)
  # Exported to gs://, then read by transformers from a copy.
  bertjax.export_hf(pretraining, gcs.url_of("pretrained/export"))
  copy = files.local_copy(gcs.url_of("pretrained/export"))
  import transformers
  model = transformers.BertForPreTraining.from_pretrained(copy)
  assert model.config.hidden_size == 32
  with pytest.raises(FileExistsError, match="already exists"):
    bertjax.export_hf(pretraining, gcs.url_of("pretrained/export"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    bertjax.load_pretrained(gcs.url_of("pretrained/nothing"))


def _fill_hub_cache(cache, repo_id, source):
  """The layout huggingface_hub keeps: refs/main -> snapshots/<commit>/files."""
  import shutil

  commit = "0123456789abcdef0123456789abcdef01234567"
  repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
  os.makedirs(os.path.join(repo, "refs"))
  with open(os.path.join(repo, "refs", "main"), "w") as f:
    f.write(commit)
  shutil.copytree(source, os.path.join(repo, "snapshots", commit))


def test_a_hub_id_reads_the_hugging_face_cache_offline(pretraining, tmp_path, monkeypatch):
  import huggingface_hub.constants

  assert huggingface_hub.constants.HF_HUB_OFFLINE  # tests/conftest.py: never the network
  cache = str(tmp_path / "hub")
  _fill_hub_cache(cache, "google-bert/bert-tiny-test", _reference_dir(str(tmp_path / "src")))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache)
  monkeypatch.chdir(tmp_path)  # no such relative path: an id
  bundle = bertjax.load_pretrained("google-bert/bert-tiny-test")
  _assert_same_params(bundle.params, bertjax.load_pretrained(str(tmp_path / "src")).params)
  with pytest.raises(FileNotFoundError, match="no Hugging Face Hub snapshot.*HF_HUB_OFFLINE"):
    bertjax.load_pretrained("google-bert/not-cached")
