"""The ModernBERT encoder: layouts, packed rows, kernels, rotary positions.

Its numerics against transformers' ModernBERT classes, head by head, are in
tests/interop/test_hf_modernbert.py.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import errors
from bertjax.data import example_packing
from bertjax.models import EncoderConfig, build_model, init_params, to_layout
from bertjax.models.rotary import Rotary

LENGTH = 48


def config(**changes):
  values = dict(family="modernbert", vocab_size=97, hidden_size=32, num_layers=6, num_heads=4,
                intermediate_size=40, max_position_embeddings=256, local_attention=10,
                layer_norm_eps=1e-5, pad_token_id=0)
  return EncoderConfig(**{**values, **changes})


def params_of(model, seed=0):
  params = nn.meta.unbox(init_params(model, jax.random.key(seed)))
  # LayerNorm scales of ones hide a swapped norm: make every one different.
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x * (1 + 0.3 * np.cos(np.arange(x.size)).reshape(x.shape))
      if "scale" in jax.tree_util.keystr(path) else x, params)


def inputs(vocab_size=97, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(4, vocab_size, size=(3, LENGTH))
  mask = (np.arange(LENGTH)[None] < np.array([[LENGTH], [33], [9]])).astype(np.int32)
  return jnp.asarray(ids * mask), jnp.asarray(mask)


@pytest.mark.parametrize("layers,every", [(6, 3), (7, 3), (5, 2), (4, 1)])
def test_scanned_blocks_match_the_loop_forward_and_gradients(layers, every):
  """Scanned: layer 0, blocks of `every` layers, and the layers left over."""
  looped = build_model(config(num_layers=layers, global_attention_every=every), "masked_lm")
  scanned = looped.clone(config=looped.config.replace(scan_layers=True))
  params = params_of(looped)
  stacked = to_layout(params, True, scanned.config)
  ids, mask = inputs()

  def loss(model, p):
    return (model.apply({"params": p}, ids, mask)["mlm_logits"] ** 2).mean()

  np.testing.assert_allclose(loss(scanned, stacked), loss(looped, params), rtol=1e-6)
  grads = to_layout(jax.grad(lambda p: loss(scanned, p))(stacked), False)
  expected = jax.grad(lambda p: loss(looped, p))(params)
  for (path, g), (_, e) in zip(jax.tree_util.tree_leaves_with_path(grads),
                               jax.tree_util.tree_leaves_with_path(expected)):
    np.testing.assert_allclose(g, e, atol=1e-6, err_msg=jax.tree_util.keystr(path))
  jax.tree.map(np.testing.assert_array_equal, to_layout(stacked, False), params)


def test_scanned_blocks_with_remat_and_hidden_states():
  model = build_model(config(num_layers=7, return_hidden_states=True), "encoder")
  params = params_of(model)
  ids, mask = inputs()
  expected = model.apply({"params": params}, ids, mask)
  scanned = model.clone(config=model.config.replace(scan_layers=True,
                                                    remat_policy="nothing_saveable"))
  got = scanned.apply({"params": to_layout(params, True, scanned.config)}, ids, mask)
  assert got["hidden_states"].shape == (8, 3, LENGTH, 32)
  np.testing.assert_allclose(got["hidden_states"], expected["hidden_states"], atol=1e-6)
  np.testing.assert_array_equal(got["hidden_states"][-1], got["sequence_output"])


def test_hidden_states_equal_transformers():
  reference = transformers.ModernBertConfig(
      vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
      intermediate_size=40, local_attention=10, pad_token_id=0, bos_token_id=1,
      eos_token_id=2, cls_token_id=1, sep_token_id=2)
  reference._attn_implementation = "eager"
  torch.manual_seed(0)
  theirs = transformers.ModernBertModel(reference).eval()
  from bertjax.interop import mapping

  tensors = {"model." + k: v.numpy() for k, v in theirs.state_dict().items()}
  ours = config(num_layers=4, return_hidden_states=True)
  params, _ = mapping.params_from_reference(tensors, ours, "encoder", 2, "test",
                                            add_summary=False)
  ids, mask = inputs()
  got = build_model(ours, "encoder", add_summary=False).apply({"params": params}, ids, mask)
  with torch.no_grad():
    out = theirs(torch.tensor(np.asarray(ids)), attention_mask=torch.tensor(np.asarray(mask)),
                 output_hidden_states=True)
  real = np.asarray(mask, bool)
  for i, hidden in enumerate(out.hidden_states):
    np.testing.assert_allclose(np.asarray(got["hidden_states"][i])[real], hidden.numpy()[real],
                               atol=1e-5, err_msg=f"hidden state {i}")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_examples_equal_each_example_alone(pooling):
  """Several examples a row (fine-tuning's packing): each one's logits equal
  its logits on a row of its own, for the pooled and the per-token heads."""
  rng = np.random.default_rng(1)
  lengths = [20, 7, 15, 30, 11]
  examples = [rng.integers(4, 97, size=n) for n in lengths]
  classifier = build_model(config(classifier_pooling=pooling), "sequence_classification",
                           num_labels=3)
  tagger = build_model(config(), "token_classification", num_labels=3)
  for model in (classifier, tagger):
    params = params_of(model, seed=2)
    alone = []
    for tokens in examples:
      row = np.zeros((1, LENGTH), np.int32)
      row[0, :len(tokens)] = tokens
      mask = (row > 0).astype(np.int32)
      alone.append(model.apply({"params": params}, row, mask)["logits"][0])
    rows = [[0, 1, 2], [3, 4]]  # 42 and 41 tokens a row
    ids = np.zeros((2, LENGTH), np.int32)
    segment_ids = np.zeros((2, LENGTH), np.int32)
    starts = np.zeros((2, 3), np.int32)
    for r, members in enumerate(rows):
      start = 0
      for s, e in enumerate(members):
        ids[r, start:start + lengths[e]] = examples[e]
        segment_ids[r, start:start + lengths[e]] = s + 1
        starts[r, s] = start
        start += lengths[e]
    kwargs = dict(segment_ids=jnp.asarray(segment_ids))
    if model is classifier:
      kwargs["pool_positions"] = jnp.asarray(starts)
    packed = model.apply({"params": params}, jnp.asarray(ids), None, **kwargs)["logits"]
    for r, members in enumerate(rows):
      start = 0
      for s, e in enumerate(members):
        if model is classifier:
          np.testing.assert_allclose(packed[r, s], alone[e], atol=2e-5)
        else:
          np.testing.assert_allclose(packed[r, start:start + lengths[e]],
                                     alone[e][:lengths[e]], atol=2e-5)
        start += lengths[e]


def test_splash_runs_local_and_global_layers_as_xla_does():
  """The model with splash attention (interpreted here) on rows of 256: local
  layers through splash's local mask, global ones through its full mask."""
  base = config(num_layers=3, local_attention=64, max_position_embeddings=256)
  model = build_model(base, "masked_lm")
  params = params_of(model)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(4, 97, size=(2, 256)))
  mask = jnp.asarray((np.arange(256)[None] < np.array([[256], [190]])).astype(np.int32))
  expected = model.apply({"params": params}, ids, mask)["mlm_logits"]
  splash = model.clone(config=base.replace(attention_impl="splash"))
  got = splash.apply({"params": params}, ids, mask)["mlm_logits"]
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(expected)[real], atol=1e-4)


def test_rotary_equals_transformers():
  """Queries and keys rotated as transformers rotates them, at positions up to
  8,191 with ModernBERT's global base."""
  from transformers.models.modernbert import modeling_modernbert as reference

  from bertjax.models.rotary import inverse_frequencies

  head_dim, theta = 64, 160_000.0
  positions = np.array([[0, 1, 2, 127, 128, 1000, 4095, 8191]])
  hf_config = transformers.ModernBertConfig(hidden_size=head_dim, num_attention_heads=1,
                                            global_rope_theta=theta)
  embedding = reference.ModernBertRotaryEmbedding(hf_config)
  # The frequencies agree to a unit in float32's last place (transformers
  # takes a float32 power, bertjax rounds a float64 one) ...
  theirs = embedding.full_attention_inv_freq.numpy()
  ours = inverse_frequencies(head_dim, theta)
  np.testing.assert_array_less(np.abs(ours - theirs), np.spacing(theirs) * 1.01)
  # ... and from the same frequencies, the rotations agree at every position.
  embedding.full_attention_inv_freq = torch.tensor(ours)
  x = torch.randn(1, 1, positions.shape[1], head_dim)
  cos, sin = embedding(x, torch.tensor(positions), "full_attention")
  expected, _ = reference.apply_rotary_pos_emb(x, x, cos, sin)
  rotary = Rotary.at(jnp.asarray(positions), head_dim, theta)
  got = rotary.apply(jnp.asarray(x.numpy()).transpose(0, 2, 1, 3))  # [b, t, h, d]
  np.testing.assert_allclose(np.asarray(got).transpose(0, 2, 1, 3), expected.numpy(),
                             atol=1e-5)


def test_bfloat16_compute_keeps_float32_parameters_and_logits():
  model = build_model(config(dtype="bfloat16"), "sequence_classification", num_labels=2)
  params = params_of(model)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  ids, mask = inputs()
  logits = model.apply({"params": params}, ids, mask)["logits"]
  exact = model.clone(config=model.config.replace(dtype="float32")).apply(
      {"params": params}, ids, mask)["logits"]
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, exact, atol=0.1)


@pytest.mark.parametrize("scan", [False, True])
def test_a_float32_residual_stream_rounds_only_the_matmuls(scan):
  """`residual_dtype="float32"` with bfloat16 compute: every layer passes a
  float32 stream on (the embeddings' output, which no matmul makes, equals
  float32's to the bit), where by default the stream is rounded to bfloat16."""
  exact_config = config(return_hidden_states=True)
  params = params_of(build_model(exact_config))
  ids, mask = inputs()

  def hidden_states(**changes):
    changed = exact_config.replace(scan_layers=scan, **changes)
    return build_model(changed).apply({"params": to_layout(params, scan, changed)}, ids,
                                      mask)["hidden_states"]

  exact = hidden_states()
  kept = hidden_states(dtype="bfloat16", residual_dtype="float32")
  rounded = hidden_states(dtype="bfloat16")
  assert kept.dtype == jnp.float32 and rounded.dtype == jnp.bfloat16
  np.testing.assert_array_equal(kept[0], exact[0])
  assert not np.array_equal(np.asarray(rounded[0], np.float32), exact[0])
  assert np.abs(kept[1:] - exact[1:]).max() > 0  # the matmuls are bfloat16's
  with pytest.raises(errors.UsageError, match="residual_dtype='float64' is not one of"):
    config(residual_dtype="float64")


def test_initialisation_follows_modernbert():
  """Projections into the residual stream start at 0.02 / sqrt(2 L), the rest
  at 0.02 (the prediction head's dense layer too, as ModernBERT's training
  code has it), classifiers at 1 / sqrt(hidden); no biases but the decoder's."""
  model = build_model(config(num_layers=8, hidden_size=64, num_heads=4), "sequence_classification")
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  layer = params["bert"]["layers_3"]
  std = lambda x: float(np.std(np.asarray(x)))
  # A normal truncated at 2 standard deviations keeps 0.88 of its spread.
  assert std(layer["attention"]["qkv"]["kernel"]) == pytest.approx(0.02 * 0.88, rel=0.05)
  assert std(layer["output"]["kernel"]) == pytest.approx(0.02 / 4 * 0.88, rel=0.05)
  assert std(layer["attention"]["output"]["kernel"]) == pytest.approx(0.02 / 4 * 0.88, rel=0.05)
  assert std(params["bert"]["head"]["dense"]["kernel"]) == pytest.approx(0.02 * 0.88, rel=0.05)
  assert std(params["classifier"]["kernel"]) == pytest.approx(64 ** -0.5 * 0.88, rel=0.25)
  biases = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)
            if "bias" in jax.tree_util.keystr(p)]
  assert biases == ["['classifier']['bias']"]
  assert "attention_norm" not in params["bert"]["layers_0"]


@pytest.mark.parametrize("changes, message", [
    (dict(family="electra"), "family='electra' is not one of"),
    (dict(causal=True), "causal=True is not a mode of ModernBERT"),
    (dict(span_bilstm=True), "span_bilstm=True is not a mode of ModernBERT .* its modes: none"),
    (dict(hidden_size=36, num_heads=4), "rotary positions need an even head width"),
    (dict(global_attention_every=0), "global_attention_every must be a positive integer"),
    (dict(classifier_pooling="max"), "classifier_pooling='max' is not one of"),
])
def test_bad_settings_say_what_to_change(changes, message):
  with pytest.raises(errors.UsageError, match=message):
    config(**changes)


def test_next_sentence_models_are_refused():
  with pytest.raises(errors.UsageError, match="masked LM only"):
    build_model(config(), "pretraining")


def test_presets_are_the_released_sizes():
  base, large = (EncoderConfig.from_preset(name) for name in ("modernbert_base", "modernbert_large"))
  assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == (
      22, 768, 12, 1152)
  assert (large.num_layers, large.hidden_size, large.num_heads, large.intermediate_size) == (
      28, 1024, 16, 2624)
  for preset in (base, large):
    assert preset.family == "modernbert" and preset.vocab_size == 50368
    assert preset.max_position_embeddings == 8192 and preset.local_attention == 128
    assert [preset.is_global_layer(i) for i in range(4)] == [True, False, False, True]
  model = build_model(base, "masked_lm")
  params = jax.eval_shape(lambda: nn.meta.unbox(init_params(model, jax.random.key(0))))
  count = sum(x.size for x in jax.tree.leaves(params))
  assert count == 149_655_232  # transformers' ModernBertForMaskedLM of ModernBertConfig()
