"""The encoder's computation options agree with each other, and sharding works.

Parity with the reference implementation is in tests/interop/test_hf.py; here
scan vs loop, remat, the attention kernels, bfloat16, dropout, the causal mask
and logical-axis sharding on 8 fake devices.
"""

import functools
import importlib.util
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import (EncoderConfig, BertEncoder, BertForPreTraining, init_params,
                            to_layout)
from tests import reference

CONFIG = EncoderConfig(vocab_size=101, hidden_size=32, num_layers=3, num_heads=4,
                    intermediate_size=48, max_position_embeddings=32)
BATCH = tuple(jnp.asarray(x) for x in reference.example_batch(101, batch=4, length=12))


def _rules():
  path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "common.py")
  spec = importlib.util.spec_from_file_location("configs_common", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.LOGICAL_AXIS_RULES


@pytest.fixture(scope="module")
def params():
  return nn.meta.unbox(init_params(BertForPreTraining(CONFIG), jax.random.key(0)))


@functools.partial(jax.jit, static_argnames=("config", "deterministic"))
def _loss(config, params, deterministic=True, rng=None):
  out = BertForPreTraining(config).apply(
      {"params": params}, *BATCH, masked_positions=jnp.array([[1, 2]] * 4),
      deterministic=deterministic, rngs={"dropout": rng} if rng is not None else None)
  return (out["mlm_logits"] ** 2).mean() + out["nsp_logits"].sum()


@functools.partial(jax.jit, static_argnames="config")
def _encode(config, bert_params):
  return BertEncoder(config.replace(return_hidden_states=True)).apply(
      {"params": bert_params}, *BATCH)


def _assert_trees_close(a, b, atol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=0), a, b)


def test_scan_matches_loop_forward_and_gradients(params):
  scanned_config = CONFIG.replace(scan_layers=True)
  scanned = to_layout(params, scan_layers=True)
  assert scanned["bert"]["layers"]["layer"]["intermediate"]["kernel"].shape == (3, 32, 48)
  looped_out = _encode(CONFIG, params["bert"])
  scanned_out = _encode(scanned_config, scanned["bert"])
  _assert_trees_close(looped_out, scanned_out, atol=1e-6)
  grads_loop = jax.jit(jax.grad(lambda p: _loss(CONFIG, p)))(params)
  grads_scan = jax.jit(jax.grad(lambda p: _loss(scanned_config, p)))(scanned)
  _assert_trees_close(to_layout(grads_scan, scan_layers=False), grads_loop, atol=1e-6)
  # The layouts convert back exactly.
  jax.tree.map(np.testing.assert_array_equal, to_layout(scanned, scan_layers=False), params)


@pytest.mark.parametrize("policy", ["full", "dots_saveable", "nothing_saveable"])
@pytest.mark.parametrize("scan", [False, True])
def test_remat_does_not_change_results(params, policy, scan):
  base = CONFIG.replace(scan_layers=scan)
  layout = to_layout(params, scan_layers=scan)
  expected = jax.grad(lambda p: _loss(base, p))(layout)
  got = jax.grad(lambda p: _loss(base.replace(remat_policy=policy), p))(layout)
  _assert_trees_close(got, expected, atol=1e-6)


def test_remat_holds_less_with_scanned_layers():
  """Rematerialising every layer leaves less held for the backward pass in the
  compiled program. (Looped layers: tests/tools/test_compile.py, on the TPU
  compiler; the CPU's holds the same either way.)"""
  config = CONFIG.replace(scan_layers=True, num_layers=4, hidden_size=64,
                          intermediate_size=256)
  batch = tuple(jnp.asarray(x) for x in reference.example_batch(101, batch=8, length=32))

  def temporaries(policy):
    model = BertForPreTraining(config.replace(remat_policy=policy))
    layout = nn.meta.unbox(init_params(model, jax.random.key(0)))

    def loss(p):
      out = model.apply({"params": p}, *batch, masked_positions=jnp.array([[1, 2]] * 8))
      return (out["mlm_logits"] ** 2).mean() + out["nsp_logits"].sum()

    compiled = jax.jit(jax.grad(loss)).lower(layout).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  assert temporaries("full") < 0.7 * temporaries("none")


def _real(encoded):
  """The outputs at real tokens (fused kernels write zeros at padding queries)."""
  real = BATCH[1].astype(bool)[None, ..., None]
  states = jnp.where(real, encoded.hidden_states, 0)
  return states, encoded.pooled_output


@pytest.mark.parametrize("causal", [False, True])
def test_dot_product_attention_matches_xla(params, causal):
  config = CONFIG.replace(causal=causal)
  expected = _encode(config.replace(attention_impl="xla"), params["bert"])
  got = _encode(config.replace(attention_impl="dot_product"), params["bert"])
  _assert_trees_close(_real(got), _real(expected), atol=1e-5)


def test_dot_product_attention_refuses_attention_dropout(params):
  with pytest.raises(ValueError, match="has no attention dropout"):
    _loss(CONFIG.replace(attention_impl="dot_product"), params, deterministic=False,
          rng=jax.random.key(0))
  # Without attention dropout it trains.
  config = CONFIG.replace(attention_impl="dot_product", attention_dropout_prob=0.0)
  assert np.isfinite(_loss(config, params, deterministic=False, rng=jax.random.key(0)))


@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="cuDNN attention needs a GPU")
def test_cudnn_attention_matches_xla(params):
  config = CONFIG.replace(dtype="bfloat16")
  expected = _encode(config.replace(attention_impl="xla"), params["bert"])
  got = _encode(config.replace(attention_impl="cudnn"), params["bert"])
  _assert_trees_close(jax.tree.map(lambda x: x.astype(jnp.float32), _real(got)),
                      jax.tree.map(lambda x: x.astype(jnp.float32), _real(expected)), atol=3e-2)


def test_bfloat16_compute_keeps_float32_params_and_logits(params):
  config = CONFIG.replace(dtype="bfloat16")
  out = jax.jit(BertForPreTraining(config).apply)({"params": params}, *BATCH)
  ref = jax.jit(BertForPreTraining(CONFIG).apply)({"params": params}, *BATCH)
  assert out["mlm_logits"].dtype == jnp.float32 and out["nsp_logits"].dtype == jnp.float32
  encoded = _encode(config, params["bert"])
  assert encoded.sequence_output.dtype == jnp.bfloat16
  scale = np.abs(ref["mlm_logits"]).max()
  assert np.abs(out["mlm_logits"] - ref["mlm_logits"]).max() < 0.05 * scale
  fresh = init_params(BertForPreTraining(config), jax.random.key(0))
  assert {x.dtype for x in jax.tree.leaves(nn.meta.unbox(fresh))} == {jnp.dtype("float32")}
  grads = jax.grad(lambda p: _loss(config, p))(params)
  assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype("float32")}


@pytest.mark.parametrize("scan", [False, True])
def test_a_float32_residual_stream(params, scan):
  """`residual_dtype="float32"`: the LayerNorms' outputs, which each layer
  passes on, stay float32 (those of the embeddings equal float32's to the
  bit) while the matmuls run in bfloat16, as under PyTorch's autocast."""
  config = CONFIG.replace(dtype="bfloat16", residual_dtype="float32", scan_layers=scan)
  bert = to_layout({"bert": params["bert"]}, scan, config)["bert"]
  kept = _encode(config, bert)
  exact = _encode(CONFIG, params["bert"])
  rounded = _encode(config.replace(residual_dtype=""), bert)
  assert kept.hidden_states.dtype == jnp.float32 and kept.sequence_output.dtype == jnp.float32
  assert rounded.hidden_states.dtype == jnp.bfloat16
  np.testing.assert_array_equal(kept.hidden_states[0], exact.hidden_states[0])
  kept_error, rounded_error = (np.abs(np.asarray(x.sequence_output, np.float32)
                                      - exact.sequence_output).mean() for x in (kept, rounded))
  assert 0 < kept_error < rounded_error


def test_dropout_is_random_per_rng_and_off_when_deterministic(params):
  first = _loss(CONFIG, params, deterministic=False, rng=jax.random.key(1))
  again = _loss(CONFIG, params, deterministic=False, rng=jax.random.key(1))
  other = _loss(CONFIG, params, deterministic=False, rng=jax.random.key(2))
  assert first == again and first != other
  assert _loss(CONFIG, params) != first


def test_causal_mask_hides_the_future(params):
  config = CONFIG.replace(causal=True)
  input_ids, attention_mask, token_type_ids = BATCH
  changed = input_ids.at[:, 6:].set(7)
  before = BertEncoder(config).apply({"params": params["bert"]}, input_ids, attention_mask,
                                     token_type_ids).sequence_output
  after = BertEncoder(config).apply({"params": params["bert"]}, changed, attention_mask,
                                    token_type_ids).sequence_output
  np.testing.assert_array_equal(before[:, :6], after[:, :6])
  assert not np.allclose(before[:, 6:], after[:, 6:])


def test_a_causal_model_pools_its_last_real_token(params):
  """Under the causal mask [CLS] sees only itself: pooling it gives every input
  the same logits. The last real token (rows of different lengths here) has
  seen the whole input."""
  from bertjax.models import build_model

  config = CONFIG.replace(causal=True)
  input_ids, attention_mask, token_type_ids = BATCH
  model = build_model(config, "sequence_classification", 3)
  variables = init_params(model, jax.random.key(1))
  logits = model.apply({"params": variables}, input_ids, attention_mask,
                       token_type_ids)["logits"]
  other = model.apply({"params": variables}, input_ids.at[:, 1:].set(9), attention_mask,
                      token_type_ids)["logits"]
  assert not np.allclose(logits, other, atol=1e-3)  # the input counts
  # The pooled vector is the pooler on each row's last real position.
  encoder = BertEncoder(config)
  out = encoder.apply({"params": params["bert"]}, input_ids, attention_mask, token_type_ids)
  last = np.asarray(attention_mask).sum(-1) - 1  # padding is at the end
  pooler = params["bert"]["pooler"]
  rows = np.asarray(out.sequence_output)[np.arange(len(last)), last]
  np.testing.assert_allclose(out.pooled_output, np.tanh(rows @ pooler["kernel"] + pooler["bias"]),
                             atol=1e-5, rtol=0)
  # A bidirectional model pools [CLS].
  out = BertEncoder(CONFIG).apply({"params": params["bert"]}, *BATCH)
  np.testing.assert_allclose(
      out.pooled_output,
      np.tanh(np.asarray(out.sequence_output)[:, 0] @ pooler["kernel"] + pooler["bias"]),
      atol=1e-5, rtol=0)


def test_a_span_bilstm_lets_a_causal_model_see_the_right_context():
  """Table 5's "LTR & No NSP + BiLSTM": under the causal mask a position's
  start score cannot depend on later tokens; a BiLSTM over the sequence output
  gives it the right context (and stops at the padding)."""
  from bertjax.models import build_model

  input_ids, attention_mask, token_type_ids = BATCH
  later = input_ids.at[:, 6:].set(7)
  for span_bilstm in (False, True):
    config = CONFIG.replace(causal=True, span_bilstm=span_bilstm)
    model = build_model(config, "question_answering")
    variables = init_params(model, jax.random.key(2))
    start = lambda ids: model.apply({"params": variables}, ids, attention_mask,
                                    token_type_ids)["start_logits"][:, :6]
    assert np.allclose(start(input_ids), start(later), atol=1e-6) != span_bilstm
  assert "span_bilstm" in variables
  with pytest.raises(ValueError, match="span_bilstm needs an even hidden_size"):
    EncoderConfig(hidden_size=33, num_heads=3, span_bilstm=True)


def test_hidden_states_and_length_check(params):
  encoded = _encode(CONFIG, params["bert"])
  assert encoded.hidden_states.shape == (4, 4, 12, 32)  # layers + 1, batch, length, embed
  np.testing.assert_array_equal(encoded.hidden_states[-1], encoded.sequence_output)
  too_long = jnp.zeros((1, 33), jnp.int32)
  with pytest.raises(ValueError, match="exceeds max_position_embeddings=32"):
    BertEncoder(CONFIG).apply({"params": params["bert"]}, too_long)


def test_every_parameter_has_logical_axes():
  for scan in (False, True):
    boxed = init_params(BertForPreTraining(CONFIG.replace(scan_layers=scan)),
                        jax.random.key(0))
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    for leaf in leaves:
      assert len(leaf.names) == leaf.value.ndim
      assert set(leaf.names) <= {"vocab", "embed", "mlp", "heads", "kv", "layers", None}


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 2, 4), (8, 1, 1)])
def test_sharded_init_and_forward_match_single_device(params, mesh_shape):
  rules = _rules()
  config = CONFIG.replace(scan_layers=True, num_heads=4, hidden_size=32)
  model = BertForPreTraining(config)
  mesh = jax.make_mesh(mesh_shape, ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  abstract = jax.eval_shape(lambda rng: init_params(model, rng), jax.random.key(0))
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    sharded = jax.jit(lambda rng: nn.meta.unbox(init_params(model, rng)),
                      out_shardings=nn.meta.unbox(shardings))(jax.random.key(0))
    kernel = sharded["bert"]["layers"]["layer"]["intermediate"]["kernel"]
    assert kernel.sharding.spec == jax.P(None, "fsdp", "tensor")
    batch_sharding = nn.logical_to_mesh_sharding(jax.P("batch", None), mesh, rules)
    rows = [jnp.concatenate([x, x[::-1]]) for x in BATCH]  # 8 rows for 8 data shards
    batch = [jax.device_put(x, batch_sharding) for x in rows]
    out = jax.jit(lambda p, *b: model.apply({"params": p}, *b))(sharded, *batch)

  single = nn.meta.unbox(init_params(model, jax.random.key(0)))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(sharded), single)
  expected = jax.jit(model.apply)({"params": single}, *rows)
  _assert_trees_close(jax.device_get(out), expected, atol=1e-5)
