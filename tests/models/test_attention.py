"""The attention kernels against plain softmax attention, unpacked and packed.

Splash attention (the TPU Pallas kernel) runs here in interpret mode, alone
and under `shard_map` on 8 fake devices; it is compiled for real TPU
topologies in tests/tools/test_compile.py. cuDNN's kernel needs an NVIDIA GPU:
here its call is traced (shapes and argument checks) and its packed layout
checked; `benchmarks/gpu.sh` compares its numbers on a GPU.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import errors, sharding
from bertjax.models import EncoderConfig, BertEncoder, attention, init_params
from bertjax.models.encoder import restarting_positions

BATCH, LENGTH, HEADS, HEAD_DIM = 4, 128, 4, 16


# The rows' real tokens: unpacked (one sequence, padding at the end) and
# packed (sequences in order, then padding), by length: rows of 128 take the
# one-block kernel under "splash", longer rows splash's own.
ROWS = {128: ([128, 100, 61, 7], [[128], [50, 40, 38], [5, 60, 3], [30]]),
        256: ([256, 200, 61, 7], [[256], [50, 140, 38], [5, 160, 3, 60], [30]])}


def _segments(packed: bool, length: int = LENGTH) -> attention.Segments:
  unpacked_rows, packed_rows = ROWS[length]
  if not packed:
    mask = np.arange(length)[None] < np.array(unpacked_rows)[:, None]
    return attention.Segments.unpacked(jnp.asarray(mask, jnp.int32))
  ids = np.zeros((BATCH, length), np.int32)
  for row, lengths in enumerate(packed_rows):
    start = 0
    for segment, n in enumerate(lengths, 1):
      ids[row, start:start + n] = segment
      start += n
  return attention.Segments.from_ids(jnp.asarray(ids))


def _qkv(seed=0, dtype=jnp.float32, length=LENGTH):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.normal(size=(BATCH, length, HEADS, HEAD_DIM)), dtype)
               for _ in range(3))


def _loss(kernel, segments, causal):
  shape = (BATCH, segments.queries.shape[1], HEADS, HEAD_DIM)
  weights = jnp.cos(jnp.arange(np.prod(shape))).reshape(shape)
  real = segments.real_queries()[:, :, None, None]

  def loss(q, k, v):
    return (jnp.where(real, kernel(q, k, v, segments, causal), 0) * weights).sum()

  return loss


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("implementation, length", [("dot_product", 128), ("splash", 128),
                                                    ("splash", 256)])
def test_kernel_matches_softmax_attention(implementation, length, causal, packed):
  segments = _segments(packed, length)
  q, k, v = _qkv(length=length)
  fused = lambda q, k, v, s, c: attention.fused(implementation, q, k, v, s, c)
  got = jax.jit(fused, static_argnums=4)(q, k, v, segments, causal)
  expected = attention.reference(q, k, v, segments, causal)
  np.testing.assert_allclose(got, expected, atol=2e-5)
  grads = jax.jit(jax.grad(_loss(fused, segments, causal), (0, 1, 2)))(q, k, v)
  expected_grads = jax.grad(_loss(attention.reference, segments, causal), (0, 1, 2))(q, k, v)
  for name, g, e in zip("qkv", grads, expected_grads):
    np.testing.assert_allclose(g, e, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("length", [128, 256])
def test_splash_in_bfloat16_as_tpus_run_it(length):
  """bfloat16 inputs, as a TPU run gives them: outputs and gradients within
  bfloat16's rounding of float32 attention over the same inputs, for the
  one-block kernel (128) and splash's (256) alike."""
  segments = _segments(True, length)
  q, k, v = _qkv(seed=2, dtype=jnp.bfloat16, length=length)
  fused = lambda q, k, v, s, c: attention.fused("splash", q, k, v, s, c)
  got = jax.jit(fused, static_argnums=4)(q, k, v, segments, True)
  assert got.dtype == jnp.bfloat16
  wide = [x.astype(jnp.float32) for x in (q, k, v)]
  np.testing.assert_allclose(got.astype(jnp.float32),
                             attention.reference(*wide, segments, True), atol=2e-2)
  grads = jax.jit(jax.grad(_loss(fused, segments, True), (0, 1, 2)))(q, k, v)
  expected = jax.grad(_loss(attention.reference, segments, True), (0, 1, 2))(*wide)
  for name, g, e in zip("qkv", grads, expected):
    assert g.dtype == jnp.bfloat16
    scale = float(jnp.abs(e).max())
    np.testing.assert_allclose(g.astype(jnp.float32), e, atol=2e-2 * scale, err_msg=name)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("implementation, length", [("dot_product", 384), ("splash", 384),
                                                    ("splash", 128)])
def test_local_window_matches_softmax_attention(implementation, length, causal, packed):
  """Local attention (ModernBERT's): keys at most 40 positions away; over 3
  of splash's tiles, so that it skips the blocks outside the band, and in the
  one-block kernel's single block."""
  window = 40
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(rng.normal(size=(2, length, 2, HEAD_DIM)), jnp.float32)
             for _ in range(3))
  if packed:  # sequences of 200, 150 and 20 tokens (60, 40, 20 in 128), then padding
    lengths = [200, 150, 20] if length > 128 else [60, 40, 20]
    ids = np.repeat([1, 2, 3, 0], lengths + [length - sum(lengths)])
    segments = attention.Segments.from_ids(jnp.asarray(np.stack([ids, ids[::-1] * 0 + 1])))
  else:
    segments = attention.Segments.unpacked(jnp.asarray(
        np.arange(length)[None] < np.array([[length], [length * 3 // 4]]), jnp.int32))
  fused = lambda q, k, v: attention.fused(implementation, q, k, v, segments, causal, window)
  expected = lambda q, k, v: attention.reference(q, k, v, segments, causal, window)
  np.testing.assert_allclose(jax.jit(fused)(q, k, v), expected(q, k, v), atol=2e-5)
  real = segments.real_queries()[:, :, None, None]
  weights = jnp.cos(jnp.arange(q.size)).reshape(q.shape)
  loss = lambda f: lambda *a: (jnp.where(real, f(*a), 0) * weights).sum()
  grads = jax.jit(jax.grad(loss(fused), (0, 1, 2)))(q, k, v)
  for name, g, e in zip("qkv", grads, jax.grad(loss(expected), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(g, e, atol=1e-4, err_msg=name)


def test_local_window_is_inclusive_and_symmetric():
  """A query sees the keys at distance <= window on both sides, as
  transformers' ModernBERT mask (`abs(q - kv) <= sliding_window`)."""
  segments = attention.Segments.unpacked(jnp.ones((1, 10), jnp.int32))
  mask = np.asarray(segments.mask(False, 2))[0, 0]
  distance = np.abs(np.arange(10)[:, None] - np.arange(10)[None])
  np.testing.assert_array_equal(mask, distance <= 2)
  np.testing.assert_array_equal(np.asarray(segments.mask(True, 2))[0, 0],
                                (distance <= 2) & np.tri(10, dtype=bool))


@pytest.mark.parametrize("packed", [False, True])
def test_splash_pads_other_lengths_to_its_tiles(packed):
  segments = _segments(packed)
  short = attention.Segments(segments.queries[:, :100], segments.keys[:, :100],
                             segments.packed)
  q, k, v = (x[:, :100] for x in _qkv())
  got = attention.fused("splash", q, k, v, short, True)
  np.testing.assert_allclose(got, attention.reference(q, k, v, short, True), atol=2e-5)
  fused = lambda q, k, v, s, c: attention.fused("splash", q, k, v, s, c)
  grads = jax.grad(_loss(fused, short, True), (0, 1, 2))(q, k, v)
  expected = jax.grad(_loss(attention.reference, short, True), (0, 1, 2))(q, k, v)
  for name, g, e in zip("qkv", grads, expected):
    np.testing.assert_allclose(g, e, atol=1e-4, err_msg=name)


def test_packed_sequences_do_not_see_each_other():
  segments = _segments(packed=True)
  q, k, v = _qkv()
  out = attention.fused("splash", q, k, v, segments, False)
  # Row 1 holds sequences of 50, 40 and 38 tokens; its second sequence alone:
  alone = attention.reference(*(x[1:2, 50:90] for x in (q, k, v)),
                              attention.Segments.unpacked(jnp.ones((1, 40), jnp.int32)), False)
  np.testing.assert_allclose(out[1:2, 50:90], alone, atol=2e-5)
  changed = k.at[1, :50].set(7.0).at[1, 90:].set(-3.0)
  again = attention.fused("splash", q, changed, v, segments, False)
  np.testing.assert_array_equal(again[1, 50:90], out[1, 50:90])


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("length", [128, 256])
def test_splash_under_shard_map_on_the_mesh(length, packed):
  segments = _segments(packed, length)
  q, k, v = _qkv(seed=1, length=length)
  mesh = sharding.make_mesh((2, 2, 2))
  rules = (("batch", ("data", "fsdp")), ("heads", "tensor"), ("length", None), ("kv", None))
  spec = jax.NamedSharding(mesh, jax.P(("data", "fsdp"), None, "tensor", None))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    q, k, v = (jax.device_put(x, spec) for x in (q, k, v))
    got = jax.jit(lambda *a: attention.fused("splash", *a, segments, False))(q, k, v)
    grads = jax.jit(jax.grad(_loss(lambda *a: attention.fused("splash", *a), segments,
                                   False), (0, 1, 2)))(q, k, v)
    hlo = jax.jit(lambda *a: attention.fused("splash", *a, segments, False)).lower(
        q, k, v).as_text()
  assert "all-gather" not in hlo  # each device attends over its own rows and heads
  np.testing.assert_allclose(got, attention.reference(q, k, v, segments, False), atol=2e-5)
  expected = jax.grad(_loss(attention.reference, segments, False), (0, 1, 2))(q, k, v)
  for g, e in zip(grads, expected):
    np.testing.assert_allclose(g, e, atol=1e-4)


def test_ragged_layout_of_packed_rows():
  ids = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0, 0]])
  seqlen, offsets = attention.ragged_layout(ids)
  np.testing.assert_array_equal(seqlen, [[3, 2, 1, -1, -1, -1, -1, -1],
                                         [8, -1, -1, -1, -1, -1, -1, -1],
                                         [1, -1, -1, -1, -1, -1, -1, -1]])
  np.testing.assert_array_equal(offsets, [[0, 3, 5, -1, -1, -1, -1, -1, -1],
                                          [0, -1, -1, -1, -1, -1, -1, -1, -1],
                                          [0, -1, -1, -1, -1, -1, -1, -1, -1]])


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_call_traces(monkeypatch, packed, causal, window):
  """The cuDNN call passes the checks of jax's cuDNN wrapper (its shapes, dtypes
  and mask arguments); it runs only on a GPU. A local window goes in as a
  mask, on unpacked rows only."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn

  monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(cudnn, "check_compute_capability", lambda *a: True, raising=False)
  q, k, v = _qkv(dtype=jnp.bfloat16)
  segments = _segments(packed)
  if packed and window:  # refused, called directly too (not global attention instead)
    with pytest.raises(errors.UsageError, match="local attention on unpacked rows only"):
      attention.fused("cudnn", q, k, v, segments, causal, window)
    return
  out = jax.eval_shape(
      lambda q, k, v: attention.fused("cudnn", q, k, v, segments, causal, window), q, k, v)
  assert out.shape == q.shape and out.dtype == jnp.bfloat16


@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="cuDNN attention needs a GPU")
@pytest.mark.parametrize("packed,window", [(False, None), (True, None), (False, 20)])
def test_cudnn_matches_softmax_attention(packed, window):
  segments = _segments(packed)
  q, k, v = _qkv(dtype=jnp.bfloat16)
  got = attention.fused("cudnn", q, k, v, segments, False, window).astype(jnp.float32)
  np.testing.assert_allclose(got, attention.reference(q, k, v, segments, False, window),
                             atol=3e-2)


@pytest.mark.parametrize("target,dtype,length,dropout,expected", [
    ("tpu", "bfloat16", 128, False, "splash"),
    ("tpu", "bfloat16", 96, False, "xla"),      # not a multiple of splash's tiles
    ("gpu", "bfloat16", 96, False, "cudnn"),
    ("gpu", "float32", 128, False, "xla"),      # cuDNN's flash kernel is 16-bit
    ("cpu", "float32", 128, False, "xla"),
    ("tpu", "bfloat16", 512, True, "xla"),      # attention dropout: only XLA has it
])
def test_auto_picks_the_kernel_the_call_allows(target, dtype, length, dropout, expected):
  assert attention.choose("auto", length=length, head_dim=64, dtype=dtype, dropout=dropout,
                          target=target) == expected


@pytest.mark.parametrize("capability,packed_kernel", [
    ("8.0", "xla"), ("8.9", "xla"), ("9.0", "cudnn"), ("10.0", "cudnn"), ("12.1", "cudnn")])
def test_auto_runs_packed_rows_on_cudnn_from_hopper_on(monkeypatch, capability, packed_kernel):
  """jax refuses cuDNN's packed layout before compute capability 9.0 (A100:
  8.0): packed rows take XLA's attention there, unpacked ones cuDNN's."""

  class Gpu:
    compute_capability = capability

  monkeypatch.setattr(jax, "local_devices", lambda backend=None: [Gpu()])
  arguments = dict(length=128, head_dim=64, dtype="bfloat16", dropout=False, target="gpu")
  assert attention.choose("auto", packed=True, **arguments) == packed_kernel
  assert attention.choose("auto", packed=False, **arguments) == "cudnn"
  assert attention.choose("auto", packed=False, **{**arguments, "head_dim": 36}) == "xla"
  if packed_kernel == "xla":
    with pytest.raises(ValueError, match="Hopper GPUs and newer"):
      attention.choose("cudnn", packed=True, **arguments)
  else:  # local attention (a band mask) on cuDNN: unpacked rows only
    assert attention.choose("auto", packed=True, local=True, **arguments) == "xla"
    assert attention.choose("auto", packed=False, local=True, **arguments) == "cudnn"
    with pytest.raises(ValueError, match="local attention on unpacked rows only"):
      attention.choose("cudnn", packed=True, local=True, **arguments)


@pytest.mark.parametrize("implementation,settings,says", [
    ("splash", dict(dropout=True), "has no attention dropout"),
    ("cudnn", dict(dtype="float32"), "needs dtype"),
    ("cudnn", dict(target="tpu"), "runs on NVIDIA GPUs"),
    ("cudnn", dict(packed=True), "Hopper GPUs and newer"),  # no GPU here at all
    ("splash", dict(target="gpu"), "runs on TPUs"),
])
def test_a_kernel_that_cannot_run_the_call_says_why(implementation, settings, says):
  arguments = dict(length=128, head_dim=64, dtype="bfloat16", dropout=False, target="gpu")
  with pytest.raises(ValueError, match=says):
    attention.choose(implementation, **{**arguments, **settings})


def test_a_packed_row_encodes_each_sequence_as_if_alone():
  """Block-diagonal attention and positions restarting per sequence: the
  encoder gives each packed sequence the outputs it gets on its own row."""
  config = EncoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=48, max_position_embeddings=128)
  params = nn.meta.unbox(init_params(BertEncoder(config), jax.random.key(0), length=LENGTH))
  rng = np.random.default_rng(0)
  lengths = [50, 40, 38]
  sequences = [rng.integers(1, 64, n) for n in lengths]
  types = [(np.arange(n) >= n // 2).astype(np.int32) for n in lengths]
  ids = np.concatenate(sequences)[None]
  segment_ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])[None]
  positions = np.concatenate([np.arange(n) for n in lengths])[None]
  starts = np.cumsum([0, *lengths[:-1]])
  np.testing.assert_array_equal(restarting_positions(jnp.asarray(segment_ids)), positions)
  for implementation in ("xla", "dot_product", "splash"):
    model = BertEncoder(config.replace(attention_impl=implementation))
    packed = model.apply({"params": params}, jnp.asarray(ids),
                         token_type_ids=jnp.asarray(np.concatenate(types)[None]),
                         # the positions the encoder derives from the ids under "xla"
                         position_ids=(None if implementation == "xla"
                                       else jnp.asarray(positions)),
                         segment_ids=jnp.asarray(segment_ids),
                         pool_positions=jnp.asarray(starts[None]))
    for i, (sequence, start) in enumerate(zip(sequences, starts)):
      alone = BertEncoder(config).apply({"params": params}, jnp.asarray(sequence[None]),
                                        token_type_ids=jnp.asarray(types[i][None]))
      np.testing.assert_allclose(packed.sequence_output[0, start:start + len(sequence)],
                                 alone.sequence_output[0], atol=2e-5, err_msg=implementation)
      np.testing.assert_allclose(packed.pooled_output[0, i], alone.pooled_output[0],
                                 atol=2e-5, err_msg=implementation)
