"""Ahead-of-time compiles for Cloud TPU slices on this CPU host.

The compiles run the tool in subprocesses (libtpu stays out of the test
process) on tiny configs; they need libtpu (`pip install '.[tpu]'`) and are
skipped without it. The slice table, the HLO reading and the batch shapes are
checked here without it.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax import topology

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install '.[tpu]')")

# Two phases (32 then 64 tokens) of a small model; dropout off keeps the
# compiled programs (and the compile times) small.
TINY = ["--config.train.total_steps=10", "--config.train.long_from_step=8",
        "--config.optimizer.warmup_steps=1", "--config.train.batch_size=16",
        "--config.eval.batch_size=16", "--config.train.max_seq_length=32",
        "--config.train.max_predictions=5", "--config.train.long_seq_length=64",
        "--config.train.long_max_predictions=10", "--config.model.hidden_dropout_prob=0",
        "--config.model.attention_dropout_prob=0"]


def run_tool(*args):
  env = {k: v for k, v in os.environ.items()  # as a user runs it, no test cache
         if k not in ("XLA_FLAGS", "JAX_PLATFORMS") and not k.startswith("JAX_PERSISTENT")
         and k != "JAX_COMPILATION_CACHE_DIR"}
  result = subprocess.run([sys.executable, "-m", "bertjax.tools.compile", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
  report = None
  lines = result.stdout.strip().splitlines()
  if lines and lines[-1].startswith("{"):
    report = json.loads(lines[-1])
  return result, report


def test_gcloud_types_map_to_google_slice_shapes():
  expected = {  # type: (grid, chips, hosts, HBM GiB), from cloud.google.com/tpu/docs
      "v4-8": ("v4:2x2x1", 4, 1, 32), "v4-32": ("v4:2x2x4", 16, 4, 32),
      "v4-128": ("v4:4x4x4", 64, 16, 32), "v5p-8": ("v5p:2x2x1", 4, 1, 95),
      "v5p-64": ("v5p:2x4x4", 32, 8, 95), "v5litepod-4": ("v5e:2x2", 4, 1, 16),
      "v5litepod-8": ("v5e:2x4", 8, 1, 16), "v5litepod-16": ("v5e:4x4", 16, 4, 16),
      "v6e-8": ("v6e:2x4", 8, 1, 32), "v6e-16": ("v6e:4x4", 16, 4, 32),
      "v4:2x2x2": ("v4:2x2x2", 8, 2, 32)}
  for name, (grid, chips, hosts, hbm) in expected.items():
    tpu_slice = topology.parse(name)
    assert (tpu_slice.topology_name, tpu_slice.chips, tpu_slice.hosts,
            tpu_slice.generation.hbm_bytes / 2**30) == (grid, chips, hosts, hbm), name
  for name in topology.known_types():
    assert topology.parse(name).accelerator_type == name
  for bad in ("v4-6", "v5p-12", "v3-8", "v5e:2x2x2", "tpu"):
    with pytest.raises(ValueError, match="--topology") as error:
      topology.parse(bad)
    assert "\n" not in str(error.value)


HLO = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[])->f32[]}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%body (param: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %param = (s32[], f32[1024]{0}) parameter(0)
  %gte = f32[1024]{0:T(1024)} get-tuple-element(%param), index=1
  %all-reduce.1 = f32[1024]{0:T(1024)} all-reduce(%gte), channel_id=1, to_apply=%add
  %i = s32[] get-tuple-element(%param), index=0
  ROOT %tuple = (s32[], f32[1024]{0}) tuple(%i, %all-reduce.1)
}

%cond (param.1: (s32[], f32[1024])) -> pred[] {
  %param.1 = (s32[], f32[1024]{0}) parameter(0)
  %constant.3 = s32[]{:T(128)} constant(12)
  %gte.1 = s32[] get-tuple-element(%param.1), index=0
  ROOT %lt = pred[] compare(%gte.1, %constant.3), direction=LT
}

%fused_scatter (p: bf16[32,64]) -> bf16[8,64] {
  %p = bf16[32,64]{1,0} parameter(0)
  ROOT %reduce-scatter.1 = bf16[8,64]{1,0:T(8,128)(2,1)} reduce-scatter(%p), to_apply=%add
}

ENTRY %main (p0: bf16[8,256], p1: (s32[], f32[1024]), p2: bf16[32,64]) -> f32[] {
  %p0 = bf16[8,256]{1,0} parameter(0)
  %all-gather-start = (bf16[8,256]{1,0}, bf16[32,256]{1,0}) all-gather-start(%p0), dimensions={0}
  %all-gather-done = bf16[32,256]{1,0} all-gather-done(%all-gather-start)
  %get-tuple-element.9 = bf16[2,64]{1,0} get-tuple-element(%all-reduce.2), index=1
  %all-reduce.2 = (f32[]{:T(128)}, bf16[2,64]{1,0}) all-reduce(%a, %b), to_apply=%add
  %p1 = (s32[], f32[1024]{0}) parameter(1)
  %while = (s32[], f32[1024]{0}) while(%p1), condition=%cond, body=%body, metadata={op_name="x"}
  %p2 = bf16[32,64]{1,0} parameter(2)
  %fusion = bf16[8,64]{1,0} fusion(%p2), kind=kCustom, calls=%fused_scatter
  %after-all = token[] after-all()
  %send = (bf16[2,64]{1,0:T(2,128)}, u32[], token[]) send(%fusion, %after-all), channel_id=3, \
is_host_transfer=true, frontend_attributes={_xla_megascale_transfer_type="ALL_REDUCE"}
  %send-done = token[] send-done(%send), channel_id=3, is_host_transfer=true
  %recv = (bf16[2,64]{1,0}, u32[], token[]) recv(%after-all), channel_id=2, \
is_host_transfer=true, frontend_attributes={_xla_megascale_transfer_type="ALL_REDUCE"}
  ROOT %out = f32[] constant(0)
}
"""


def test_collectives_count_loop_iterations_and_bytes():
  from bertjax.tools.compiling import program as compiled_program

  found = compiled_program.collectives(HLO)
  assert found["all-reduce"] == {"count": 12 + 1, "bytes": 12 * 1024 * 4 + 4 + 2 * 64 * 2}
  assert found["all-gather"] == {"count": 1, "bytes": 32 * 256 * 2}
  assert found["reduce-scatter"] == {"count": 1, "bytes": 8 * 64 * 2}
  assert found["all-to-all"] == found["collective-permute"] == {"count": 0, "bytes": 0}
  assert found["dcn-all-reduce"] == {"count": 1, "bytes": 2 * 64 * 2}  # between slices


def _attention_gradient_jaxpr(causal, mesh=None, length=256, window=None):
  """The ClosedJaxpr of splash attention's forward and backward passes
  (interpreted on this CPU: the same kernels, with the same grids), its
  constants holding the kernels' block masks."""
  import jax
  import jax.numpy as jnp

  from bertjax.models import attention

  batch, heads, head_dim = 4, 2, 64
  spec = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.float32)
  ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)

  def loss(q, k, v, ids):
    segments = attention.Segments.unpacked(ids)
    return attention.fused("splash", q, k, v, segments, causal, window=window).sum()

  gradient = jax.grad(loss, argnums=(0, 1, 2))
  if mesh is None:
    return jax.make_jaxpr(gradient)(spec, spec, spec, ids)
  rows = jax.sharding.NamedSharding(mesh, jax.P("data"))
  spec, ids = (jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows) for x in (spec, ids))
  import flax.linen as nn
  from bertjax.configs.common import LOGICAL_AXIS_RULES
  with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_AXIS_RULES):
    return jax.make_jaxpr(gradient)(spec, spec, spec, ids)


@pytest.mark.parametrize("causal", [False, True])
def test_the_attention_kernels_count_every_block_they_compute(causal):
  """Splash attention's three kernels (forward, dq, dkv) compute 2 + 3 + 4
  products of a [length, length] block per head: the forward's two, then the
  scores and the probabilities' gradient again in both backward kernels. A
  causal mask skips the blocks above the diagonal."""
  from bertjax.tools.compiling import jaxpr_flops

  batch, length, heads, head_dim = 4, 256, 2, 64
  share = jaxpr_flops.causal_block_share(length, 128) if causal else 1.0
  assert share == (0.75 if causal else 1.0)  # 3 of the 4 blocks of 128 x 128
  closed = _attention_gradient_jaxpr(causal)
  counted = jaxpr_flops.traced_flops(closed)  # the share read from the kernels' masks
  dense = 2 * batch * heads * length * length * head_dim  # one product, all blocks
  assert counted.kernel_calls == 3
  assert counted.kernel_flops == 9 * dense * share
  # Outside them only the backward's row sums of the output times its gradient.
  assert counted.matmuls - counted.kernel_flops == 2 * batch * heads * length * head_dim
  # Without the masks (a bare Jaxpr), the share given.
  assert jaxpr_flops.traced_flops(closed.jaxpr, share).kernel_flops == 9 * dense * share
  assert jaxpr_flops.traced_flops(closed.jaxpr).kernel_flops == 9 * dense


def band_blocks(length: int, window: int, causal: bool = False, block: int = 128) -> int:
  """Blocks of a [length, length] score matrix that hold a query and a key at
  most `window` apart (before the query only, if causal), by brute force over
  the positions."""
  import numpy as np

  position = np.arange(length)
  distance = position[:, None] - position[None, :]  # query - key
  near = (np.abs(distance) <= window) & ((distance >= 0) if causal else True)
  return int(near.reshape(length // block, block, length // block, block).any(axis=(1, 3)).sum())


@pytest.mark.parametrize("length, window, causal", [(1024, 64, False), (1024, 200, False),
                                                    (768, 64, True)])
def test_local_attention_kernels_count_the_blocks_of_the_band(length, window, causal):
  """A local layer's kernels compute the blocks that hold a query and a key at
  most `window` apart (before the query only, if causal): counted here from
  the positions, by brute force, against what the traced kernels' masks say."""
  from bertjax.tools.compiling import jaxpr_flops

  batch, heads, head_dim, block = 4, 2, 64, 128
  blocks = band_blocks(length, window, causal)
  assert blocks < (length // block) ** 2  # the band leaves blocks out
  dense_block = 2 * batch * heads * block * block * head_dim  # one product of a block
  counted = jaxpr_flops.traced_flops(_attention_gradient_jaxpr(causal, length=length,
                                                               window=window))
  assert counted.kernel_calls == 3
  assert counted.kernel_flops == 9 * dense_block * blocks


def test_constants_reach_only_the_sub_jaxprs_that_hold_them_throughout():
  """A while loop's condition and body get their own constants, and neither a
  loop's carry nor a scan's carry counts as known (it changes each turn)."""
  import jax
  import numpy as np
  from jax import lax

  from bertjax.tools.compiling import jaxpr_flops

  limit, step = np.array([7], np.int32), np.array([2], np.int32)
  start = np.zeros(1, np.int32)

  def loops(x):
    x = lax.while_loop(lambda c: (c < limit)[0], lambda c: c + step, x)
    return lax.scan(lambda c, _: (c + step, None), x, None, length=3)[0]

  closed = jax.make_jaxpr(loops)(start)
  known = dict(zip(closed.jaxpr.constvars, closed.consts))
  known[closed.jaxpr.invars[0]] = start  # a carry's first value
  found = {}
  for eqn in closed.jaxpr.eqns:
    for sub in jaxpr_flops._sub_jaxprs(eqn):
      inside = jaxpr_flops._known_inside(eqn, sub, known)
      kind = ("cond" if sub is eqn.params.get("cond_jaxpr") else eqn.primitive.name)
      found[kind] = sorted(int(v[0]) for v in inside.values())
  assert found == {"cond": [7], "while": [2], "scan": [2]}


def test_a_shard_map_body_counts_once_a_device():
  import jax

  from bertjax import sharding
  from bertjax.tools.compiling import jaxpr_flops

  alone = jaxpr_flops.traced_flops(_attention_gradient_jaxpr(False))
  mesh = sharding.make_mesh((4, 1, 1), jax.devices()[:4])
  sharded_causal = _attention_gradient_jaxpr(True, mesh)
  sharded = jaxpr_flops.traced_flops(_attention_gradient_jaxpr(False, mesh))
  assert sharded.kernel_flops == alone.kernel_flops  # 4 devices, a quarter of the rows each
  assert sharded.kernel_calls == 4 * alone.kernel_calls
  # The masks are found inside the shard_map too: a causal mask's share.
  assert jaxpr_flops.traced_flops(sharded_causal).kernel_flops == 0.75 * alone.kernel_flops


def test_the_real_tokens_of_a_given_padding_share():
  from bertjax import errors
  from bertjax.configs import base_pretrain
  from bertjax.tools.compiling import real_work

  config = base_pretrain.get_config()
  work = real_work.RealWork.given(config, 0.25)
  short, long = work.per_row[0], work.per_row[1]
  assert short == {"real_tokens": 96.0, "sequences": 1.0, "token_pairs": 96.0 ** 2,
                   "local_token_pairs": 96.0 ** 2,  # BERT: every layer global
                   "predictions": 14.0, "nsp_pairs": 1.0, "padding": 0.25}
  assert long["real_tokens"] == 384 and long["predictions"] == 58  # round(0.15 * 384)
  full = real_work.RealWork.given(config, 0.0).per_row[0]
  assert full["predictions"] == 19  # of 20 slots: round(0.15 * 128)
  config.data.max_sequences_per_row = 4  # how a row divides is not given: measure it
  with pytest.raises(errors.UsageError, match="--padding takes rows of one sequence each; "
                     "data.max_sequences_per_row=4 packs several: measure them with --data_dir"):
    real_work.RealWork.given(config, 0.25)


def test_the_real_tokens_measured_on_a_prepared_dataset(prepared_dir):
  """The loader's rows of a prepared dataset, counted as the trainer counts
  them, against the same rows counted here with numpy."""
  import dataclasses

  from bertjax import phases
  from bertjax.configs import demo
  from bertjax.data import loader
  from bertjax.tasks import pretrain_data
  from bertjax.tools.compiling import real_work
  from tests.tasks.finetuning import set_fields

  config = set_fields(demo.get_config(), {
      "model.vocab_size": 210, "train.max_seq_length": 64, "train.max_predictions": 10,
      "train.long_from_step": -1})
  work = real_work.RealWork.measured(config, prepared_dir, batches=3, rows=16)
  assert work.source == f"measured: 3 batches of 16 rows of {prepared_dir}"
  (phase,) = phases.phases(config)
  settings = dataclasses.replace(
      pretrain_data.loader_config(config, prepared_dir, phase, "train", 16), static=False,
      shuffle_window=min(config.data.shuffle_window, 64))
  batches = [batch for _, batch in zip(range(3), loader.make_dataset(settings))]
  lengths = np.concatenate([batch["attention_mask"].sum(axis=1) for batch in batches])
  row = work.per_row[phase.index]
  assert row["real_tokens"] == pytest.approx(lengths.mean())
  assert row["token_pairs"] == pytest.approx((lengths.astype(float) ** 2).mean())
  assert row["predictions"] == pytest.approx(
      np.mean([batch["masked_weights"].sum(axis=1) for batch in batches]))
  assert row["sequences"] == row["nsp_pairs"] == 1.0
  assert row["padding"] == pytest.approx(1 - lengths.mean() / 64)
  assert 0 < row["padding"] < 1


def test_a_dataset_that_is_not_there_is_a_usage_error(tmp_path):
  from bertjax import errors
  from bertjax.configs import demo
  from bertjax.tools.compiling import real_work

  with pytest.raises(errors.MissingFileError, match=f"{tmp_path}: no dataset_info.json"):
    real_work.RealWork.measured(demo.get_config(), str(tmp_path), batches=1)


def test_out_of_memory_messages_give_the_bytes():
  from bertjax.tools.compiling import program as compiled_program

  needed, available = compiled_program.out_of_memory_bytes(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (19.30G) exceeds available HBM (15.75G).")
  assert (needed, available) == (int(19.30 * 2**30), int(15.75 * 2**30))
  assert compiled_program.out_of_memory_bytes(
      "Ran out of memory in memory space hbm. Used 20.50G of 15.48G hbm.")[0] == int(20.5 * 2**30)
  assert compiled_program.out_of_memory_bytes("RESOURCE_EXHAUSTED: something") == (None, None)


def test_accumulation_for_the_largest_batch_that_fits():
  from bertjax.tools.compiling import report as compile_report

  assert compile_report.accumulation_for(256, 16, 16) == 1
  assert compile_report.accumulation_for(256, 16, 12) == 2   # 8 a chip
  assert compile_report.accumulation_for(256, 16, 3) == 8    # 2 a chip
  assert compile_report.accumulation_for(256, 16, 0) is None


@pytest.mark.parametrize("ramp_start", [0, 48, 96])
@pytest.mark.parametrize("limits", [(6, 36), (10, 12), (16, 6), (4, 4), (0, 4)])
def test_one_accumulation_for_every_phase_and_the_warmup(ramp_start, limits):
  """The run's accumulation is the fewest steps the trainer accepts for all its
  phases (batches of 384 then 288 on 8 data shards, with and without a batch
  warmup) that keeps each phase within its largest batch a chip; the trainer's
  own check of the config is the reference. (6, 36): the first phase alone
  would take 8 steps, whose micro-batches of the second phase (36 rows) do not
  divide over the 8 shards."""
  from bertjax import phases as phase_lib
  from bertjax.configs import modernbert_pretrain
  from bertjax.tasks import pretrain
  from bertjax.tools.compiling import report as compile_report

  config = modernbert_pretrain.get_config()
  config.train.update(batch_size=384, long_batch_size=288, batch_ramp_start=ramp_start,
                      batch_ramp_steps=10 if ramp_start else 0, total_steps=100,
                      long_from_step=50, long_seq_length=2048, long_max_predictions=719)
  config.optimizer.update(warmup_steps=10, decay_steps=10)
  pretrain.validate(config, 8)  # valid as it stands (one step): only accumulation is refused

  def accepted(steps):
    config.train.accumulation_steps = steps
    try:
      pretrain.validate(config, 8)
    except ValueError:
      return False
    return all((batch // steps) // 8 <= limit for batch, limit in zip((384, 288), limits))

  expected = next((steps for steps in range(1, 385) if accepted(steps)), None)
  phases = phase_lib.phases(config)
  assert compile_report.run_accumulation_for(phases, 8, limits, 1) == expected
  if expected is not None:
    later = next((steps for steps in range(expected + 1, 385) if accepted(steps)), None)
    assert compile_report.run_accumulation_for(phases, 8, limits, 1, more_than=expected) == later


@pytest.mark.parametrize("fixed_gib, per_sequence_gib, start", [
    (3.76, 0.4, 16), (1.0, 0.25, 64), (1.0, 0.01, 4), (20.0, 2.0, 16), (40.0, 1.0, 16)])
def test_max_batch_search_brackets_then_closes_in(fixed_gib, per_sequence_gib, start):
  """The search on a stand-in compiler whose memory is a line with bumps (as
  XLA's tiling makes it): the largest fitting batch (a multiple of 8 from 8
  on), in few compiles."""
  from bertjax.tasks.pretrain import Phase
  from bertjax.tools.compiling import compiler as step_compiler

  hbm = 32 * 2**30
  total = lambda per_chip: int(
      (fixed_gib + per_sequence_gib * per_chip + 0.3 * (per_chip % 8 != 0)) * 2**30)
  compiler = object.__new__(step_compiler.Compiler)
  compiler.target = step_compiler.Target(topology.parse("v4-8"), 1, [None] * 4, None)
  compiler.data_shards = 4
  compiled = []

  def train(phase, batch_size, accumulation_steps):
    per_chip = batch_size // 4
    compiled.append(per_chip)
    return {"fits": total(per_chip) <= hbm, "per_chip_bytes": {"total": total(per_chip)}}

  compiler.train = train
  best, tried = compiler.max_per_chip_batch(Phase(0, 0, 10, 128, 20, 256), start)
  expected = max([b for b in range(1, 10_000) if total(b) <= hbm and (b < 8 or b % 8 == 0)],
                 default=0)
  assert best == expected
  assert sorted(t["per_chip_batch"] for t in tried) == sorted(compiled)
  assert len(compiled) == len(set(compiled)) <= math.log2(max(best, 8)) + 6, compiled


def test_max_batch_search_to_one_sequence_and_under_xla_s_own_limit():
  """With step 1 the search ends at the exact largest batch, aiming under the
  limit XLA's refusal states (below the chip's HBM) once it has said it."""
  from bertjax.tools.compiling import batch_search

  hbm, limit = 16 * 2**30, 15.75 * 2**30
  total = lambda per_chip: int((5.4 + 0.37 * per_chip) * 2**30)

  def compile_at(per_chip):
    if total(per_chip) > limit:
      return {"fits": False, "per_chip_bytes": {"total": total(per_chip)},
              "xla_hbm_limit_bytes": int(limit), "error": "RESOURCE_EXHAUSTED"}
    return {"fits": True, "per_chip_bytes": {"total": total(per_chip)}}

  results = {}
  best = batch_search.largest_batch(compile_at, 16, hbm, results, step=1)
  assert best == max(b for b in range(1, 100) if total(b) <= limit) == 27
  assert len(results) <= 6, sorted(results)
  assert [t["per_chip_batch"] for t in batch_search.trials(results)] == sorted(results)
  assert batch_search.largest_batch(compile_at, 16, hbm, step=8) == 24


def pretrain_phase(length):
  from bertjax.tasks.pretrain import Phase

  return Phase(0, 0, 1, length, length * 15 // 100, 256)


def test_the_accumulation_that_fits_is_checked_by_compiling():
  """Accumulating needs memory of its own (the summed gradients): the steps the
  largest batches suggest are compiled, and raised while they do not fit."""
  from bertjax.tools.compiling import compiler as step_compiler, report as compile_report
  from bertjax.configs import large_pretrain

  config = large_pretrain.get_config()  # 256 sequences, lengths 128 and 512
  compiler = object.__new__(step_compiler.Compiler)
  compiler.target = step_compiler.Target(topology.parse("v6e-8"), 1, [None] * 8, None)
  compiler.data_shards = 8
  compiled = []

  def train(phase, batch_size, accumulation_steps):
    compiled.append((phase.max_seq_length, accumulation_steps))
    per_chip = batch_size // accumulation_steps // 8
    gib = 3.8 + per_chip * (0.4 if phase.max_seq_length == 128 else 1.7)
    gib += 5.0 * (accumulation_steps > 1)
    return {"fits": gib <= 32, "per_chip_bytes": {"total": int(gib * 2**30)}}

  compiler.train = train
  configured = {str(n): train(pretrain_phase(n), 256, 1) for n in (128, 512)}
  report = {"max_per_chip_batch": {"train_128": 64, "train_512": 16}}
  steps, tried = compile_report._accumulation_that_fits(compiler, config, report, configured)
  # 16 a chip suggests 2 steps; with the accumulator 2 does not fit, 4 does.
  assert steps == 4
  assert [(t["accumulation_steps"], t["fits"]) for t in tried] == [(2, False), (4, True)]
  assert compiled[2:] == [(128, 2), (512, 2), (128, 4), (512, 4)]


@pytest.mark.parametrize("sequences_per_row", [1, 3])
@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm", "ltr"])
def test_batch_spec_matches_the_loader(prepared_dir, objective, sequences_per_row):
  """The abstract batch compiled for is the loader's batch: names, shapes, dtypes."""
  from bertjax.data import loader
  from bertjax.data.masking import MaskingConfig
  from bertjax.tools.compiling import compiler as step_compiler

  config = loader.LoaderConfig(prepared_dir, objective=objective, max_seq_length=32,
                               batch_size=4, masking=MaskingConfig(max_predictions=5),
                               max_sequences_per_row=sequences_per_row)
  batch = next(iter(loader.make_dataset(config)))
  spec = step_compiler.batch_spec(objective, 4, 32, 5, sharding=None,
                                  max_sequences_per_row=sequences_per_row)
  assert sorted(spec) == sorted(batch)
  for name, value in batch.items():
    assert (spec[name].shape, np.dtype(spec[name].dtype)) == (value.shape, value.dtype), name


def _check_report(report, topology_name, chips, hosts, generation_hbm_gib):
  assert report["topology"] == topology_name
  assert (report["chips"], report["hosts"]) == (chips, hosts)
  assert report["mesh"] == {"data": chips, "fsdp": 1, "tensor": 1}
  assert report["hbm_bytes"] == generation_hbm_gib * 2**30
  assert report["fits"] is True
  programs = ["train_32", "eval_32", "train_64", "eval_64"]
  assert sorted(report["per_chip_bytes"]) == sorted(programs)
  parameters = report["model"]["parameters"]
  for name in programs:
    memory = report["per_chip_bytes"][name]
    assert {"arguments", "outputs", "temporaries", "total"} <= set(memory)
    assert 0 < memory["total"] < report["hbm_bytes"]
    flops = report["flops_per_step"][name]
    # The traced matmuls are the model's (bertjax.flops counts the same ones).
    assert 0.95 < flops["ratio"] < 1.1, flops
    assert flops["cost_analysis"] > 0
  for name in ("train_32", "train_64"):
    # Data parallel: every chip keeps all parameters and the optimizer's two
    # moments (float32), and sums the gradients with the other chips.
    assert report["per_chip_bytes"][name]["arguments"] >= 3 * 4 * parameters
    reduced = report["collectives"][name]
    gradient_bytes = reduced["all-reduce"]["bytes"] + reduced["reduce-scatter"]["bytes"]
    assert 2 * parameters <= gradient_bytes <= 4 * parameters * 1.1, reduced
  return report


@needs_libtpu
def test_v4_slice_both_phases_fit(prepared_dir):
  """The demo's unscanned model: XLA's own cost analysis then sees every layer.
  The real tokens are measured on a prepared dataset, at each phase's length."""
  result, report = run_tool("--config=configs/demo.py", "--topology=v4-8", *TINY,
                            f"--data_dir={prepared_dir}", "--data_batches=2")
  assert result.returncode == 0, result.stderr[-3000:]
  _check_report(report, "v4-8", 4, 1, 32)
  assert report["real_work"]["source"].startswith("measured: 2 batches of 64 rows")
  for name in ("train_32", "train_64"):
    flops = report["flops_per_step"][name]
    assert 0.8 < flops["cost_analysis_ratio"] < 1.6, flops
    row = report["real_work"]["per_row"][name[len("train_"):]]
    assert 0 < row["padding"] < 1
    assert 0 < flops["model_real"] < flops["model"]
    # Every layer's bytes too: at least each parameter read once a step (float32).
    accessed = report["bytes_accessed"][name]
    assert not accessed["loop_bodies_counted_once"]
    assert accessed["per_chip"] > 4 * report["model"]["parameters"]
    tokens = report["phases"][0 if name == "train_32" else 1]
    assert accessed["per_token"] == pytest.approx(
        accessed["per_chip"] / (tokens["batch_size"] * tokens["max_seq_length"] / 4), abs=0.1)
  assert "train_64: " in result.stdout and " GB accessed a chip;" in result.stdout
  # The last word, after the JSON: the model, and its largest step against a chip's HBM.
  largest = max(report["per_chip_bytes"], key=lambda k: report["per_chip_bytes"][k]["total"])
  verdict = result.stderr.strip().splitlines()[-1]
  assert verdict.startswith("Fits: BERT tiny (L2/H128/A2, 1.5M parameters) on v4-8, "), verdict
  used = report["per_chip_bytes"][largest]["total"] / 2**30
  assert verdict.endswith(f"at most {largest} uses {used:.2f} GiB a chip of its 32.00 GiB"), verdict


@needs_libtpu
def test_v5e_slice_scanned_layers_count_every_iteration():
  result, report = run_tool("--config=configs/base_pretrain.py:size=bert_L4_H128",
                            "--topology=v5litepod-8", "--config.model.vocab_size=512", *TINY)
  assert result.returncode == 0, result.stderr[-3000:]
  _check_report(report, "v5litepod-8", 8, 1, 16)
  assert report["device_kind"] == "TPU v5 lite"
  flops = report["flops_per_step"]["train_32"]
  # XLA's cost analysis counts the 4-layer scan's body once; the traced count does not.
  assert flops["cost_analysis"] < 0.8 * flops["matmuls"]
  assert report["bytes_accessed"]["train_32"]["loop_bodies_counted_once"]
  assert "GB accessed a chip (a loop's body once)" in result.stdout


@needs_libtpu
def test_remat_of_looped_layers_frees_memory_for_more_work():
  """Looped (unscanned) layers rematerialised: the compiled step holds less
  and computes the forward pass again, rather than XLA merging the
  recomputation back into the forward pass."""
  figures = {}
  for policy in ("none", "full"):
    result, report = run_tool("--config=configs/demo.py", "--topology=v5litepod-4", *TINY,
                              "--eval=false", "--config.train.long_from_step=-1",
                              "--config.train.batch_size=256",
                              "--config.train.max_seq_length=128",
                              "--config.train.max_predictions=20",
                              f"--config.model.remat_policy={policy}")
    assert result.returncode == 0, result.stderr[-3000:]
    figures[policy] = (report["per_chip_bytes"]["train_128"]["temporaries"],
                       report["flops_per_step"]["train_128"]["cost_analysis"])
  assert figures["full"][0] < 0.6 * figures["none"][0], figures
  assert figures["full"][1] > 1.2 * figures["none"][1], figures


@needs_libtpu
def test_two_slices_sum_gradients_over_the_data_center_network():
  """The trainer's own mesh (`sharding.make_mesh`) over two slices: the data
  axis spans them, and the gradient sums cross between slices."""
  result, report = run_tool("--config=configs/base_pretrain.py:size=bert_tiny",
                            "--topology=v5litepod-4", "--num_slices=2", "--eval=false",
                            "--config.model.vocab_size=512", *TINY[:1],
                            "--config.train.long_from_step=-1", *TINY[2:])
  assert result.returncode == 0, result.stderr[-3000:]
  assert report["chips"] == 8 and report["hosts"] == 2 and report["mesh"]["data"] == 8
  crossing = {kind: value for kind, value in report["collectives"]["train_32"].items()
              if kind.startswith("dcn-") and value["count"]}
  assert crossing, report["collectives"]["train_32"]


@needs_libtpu
def test_splash_attention_compiles_for_the_tpu():
  """The Pallas kernel, lowered by libtpu (not interpreted). Its products are
  counted from its grid: XLA's attention computes 6 [128, 128] products a
  head and layer (2 forward, 4 backward), the kernels for rows of one block
  7 (2 forward, and one backward kernel computing the scores and their
  gradient again for all three gradients); the rest of the step is the same."""
  length = ["--config.train.long_from_step=-1", "--config.train.max_seq_length=128",
            "--config.train.max_predictions=20", "--eval=false"]
  common = ["--config=configs/base_pretrain.py:size=bert_tiny", "--topology=v5litepod-8",
            "--config.model.vocab_size=512", *TINY[:1], *TINY[2:5], *length]
  reports = {}
  for kernel in ("xla", "splash"):
    result, reports[kernel] = run_tool(*common, f"--config.model.attention_impl={kernel}",
                                       "--padding=0.25")
    assert result.returncode == 0, result.stderr[-3000:]
    assert reports[kernel]["fits"] is True
  xla, splash = (reports[k]["flops_per_step"]["train_128"] for k in ("xla", "splash"))
  layers, hidden, batch = 2, 128, 16  # bert_tiny; all heads together
  product = 2 * batch * 128 * 128 * hidden * layers
  assert xla["attention_kernels"] == xla["attention_kernel_calls"] == 0
  assert splash["attention_kernel_calls"] == 2 * layers * 8  # on each of the 8 chips
  assert splash["attention_kernels"] == 7 * product
  # Nothing of the attention is left outside the kernels (splash's own leaves
  # the backward's row sums of output x gradient, a product / 128).
  outside = splash["matmuls"] - splash["attention_kernels"]
  assert outside == xla["matmuls"] - 6 * product
  assert "in 32 attention kernel calls" in result.stdout
  # The real tokens: 96 a row, 14 predictions, whatever the kernel.
  from bertjax import flops
  from bertjax.models import EncoderConfig

  config = EncoderConfig(vocab_size=512, hidden_size=128, num_layers=2, num_heads=2,
                      intermediate_size=512)
  real = flops.model_flops(config, 16 * 96, 16 * 96 ** 2, 16 * 14, 16)
  assert xla["model_real"] == splash["model_real"] == pytest.approx(real)
  assert reports["splash"]["real_work"]["source"].startswith("given: 0.25")
  assert "on real tokens" in result.stdout


@needs_libtpu
@pytest.mark.parametrize("config, settings", [
    # Left to right (a causal mask), float32, heads of 128.
    ("configs/base_pretrain.py:size=bert_tiny,ltr",
     ["--config.model.vocab_size=512", "--config.model.dtype=float32",
      "--config.model.num_heads=1", "--config.train.max_predictions=20"]),
    # ModernBERT: local layers (keys at most 64 away) and global ones.
    ("configs/modernbert_pretrain.py",
     ["--config.model.num_layers=3", "--config.model.hidden_size=128",
      "--config.model.num_heads=2", "--config.model.intermediate_size=256",
      "--config.model.vocab_size=512", "--config.data.vocab_size=512",
      "--config.train.batch_ramp_steps=0", "--config.optimizer.decay_steps=2",
      "--config.eval.batch_size=8", "--config.train.max_predictions=65"]),
])
def test_one_block_kernels_compile_for_the_tpu_with_their_masks(config, settings):
  """Rows of 128 tokens: bertjax's one-block kernels, lowered by libtpu with
  a causal mask and with a local window, 2 calls a layer (forward, backward)."""
  result, report = run_tool(
      f"--config={config}", "--topology=v5litepod-8", "--eval=false", *settings,
      "--config.model.attention_impl=splash", "--config.train.batch_size=8",
      "--config.train.max_seq_length=128", "--config.train.long_from_step=-1",
      "--config.train.total_steps=10", "--config.optimizer.warmup_steps=1")
  assert result.returncode == 0, result.stderr[-3000:]
  flops = report["flops_per_step"]["train_128"]
  layers = 3 if "modernbert" in config else 2
  assert flops["attention_kernel_calls"] == 2 * layers * 8  # on each of the 8 chips


@needs_libtpu
def test_modernbert_local_and_global_splash_kernels_compile_for_the_tpu():
  """ModernBERT's splash kernels, lowered by libtpu: the global layer's
  computes every block, the local layers' the blocks of their band only (keys
  at most 64 positions away), as their block masks in the compiled program say."""
  # Layer 0, then one scanned block of layers 1-3 (local, local, global): the
  # masks reach the kernels through the scan too.
  layers, hidden, batch, length = 4, 128, 8, 1024
  result, report = run_tool(
      "--config=configs/modernbert_pretrain.py", "--topology=v5litepod-8", "--eval=false",
      f"--config.model.num_layers={layers}", f"--config.model.hidden_size={hidden}",
      "--config.model.num_heads=2", "--config.model.intermediate_size=256",
      "--config.model.vocab_size=512", "--config.data.vocab_size=512",
      "--config.model.attention_impl=splash", f"--config.train.batch_size={batch}",
      "--config.train.batch_ramp_steps=0", "--config.train.long_from_step=-1",
      "--config.train.total_steps=10", "--config.optimizer.warmup_steps=1",
      "--config.optimizer.decay_steps=2", "--config.eval.batch_size=8")
  assert result.returncode == 0, result.stderr[-3000:]
  flops = report["flops_per_step"][f"train_{length}"]
  product = 2 * batch * 128 * 128 * hidden  # one product of a block, all heads and rows
  blocks = 2 * (length // 128) ** 2 + 2 * band_blocks(length, 64)  # 2 x 64 + 2 x 22
  assert band_blocks(length, 64) == 22
  assert flops["attention_kernels"] == 9 * product * blocks
  assert flops["attention_kernel_calls"] == 3 * layers * 8  # on each of the 8 chips


@needs_libtpu
def test_a_batch_too_large_does_not_fit():
  result, report = run_tool("--config=configs/base_pretrain.py:size=bert_tiny",
                            "--topology=v5litepod-4", "--eval=false",
                            "--config.model.vocab_size=512", *TINY[:1],
                            "--config.train.long_from_step=-1", *TINY[2:],
                            "--config.train.batch_size=98304")
  assert result.returncode == 1, result.stderr[-3000:]
  assert report["fits"] is False
  memory = report["per_chip_bytes"]["train_32"]
  # What it would need, from XLA, beyond what XLA says it can use of the chip.
  assert memory["total"] > report["xla_hbm_limit_bytes"]
  assert report["xla_hbm_limit_bytes"] <= report["hbm_bytes"]
  assert 15 * 2**30 < report["xla_hbm_limit_bytes"] <= report["hbm_bytes"]
  assert "DOES NOT FIT" in result.stdout
  verdict = result.stderr.strip().splitlines()[-1]
  assert verdict.startswith("Does not fit: BERT tiny (L2/H128/A2, "), verdict
  assert verdict.endswith(
      f" parameters) on v5litepod-4: train_32 uses {memory['total'] / 2**30:.2f} GiB a chip "
      f"of its 16.00 GiB (XLA can use {report['xla_hbm_limit_bytes'] / 2**30:.2f} GiB); "
      "--find_max_batch finds the accumulation that fits"), verdict


@pytest.mark.parametrize("args, says", [
    (["--topology=v4-6"], "--topology"),
    (["--topology=v4-8", "--config.mesh.data=3"], "mesh"),
    (["--topology=v4-32", "--config.mesh.data=1", "--config.mesh.tensor=16",
      "--config.train.batch_size=2", "--config.eval.batch_size=4"], "hosts"),
    (["--topology=v4-8", "--config.train.batchsize=2"], "batchsize"),
    (["--topology=v4-8", "--padding=1"], "--padding"),
    (["--topology=v4-8", "--padding=0.1", "--data_dir=."], "--padding"),
    (["--topology=v4-8", "--data_dir=no/such/data"], "no/such/data"),
])
@needs_libtpu
def test_usage_errors_are_one_line_and_exit_2(args, says):
  result, report = run_tool("--config=configs/base_pretrain.py:size=bert_tiny", *args)
  assert result.returncode == 2, result.stderr[-3000:]
  assert report is None
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and says in errors[0], result.stderr[-3000:]
