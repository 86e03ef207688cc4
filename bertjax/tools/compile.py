r"""Compiles the pre-training step for a Cloud TPU slice ahead of time, on any host.

  python -m bertjax.tools.compile --config=configs/large_pretrain.py --topology=v4-32
  python -m bertjax.tools.compile --config=configs/base_pretrain.py --topology=v5litepod-16 \
      --config.train.accumulation_steps=2 --find_max_batch
  python -m bertjax.tools.compile --config=configs/base_pretrain.py --topology=v5p-8 \
      --data_dir=gs://my-bucket/data

The training step and the evaluation step of each phase (length 128, then 512
in the paper's recipe) are compiled by libtpu for the slice's chips, on the
mesh and with the shardings a real run of the config would use there, from
abstract shapes only: nothing is allocated, no TPU is needed (`pip install
'.[tpu]'` brings libtpu). `--topology` takes gcloud's accelerator types
(`v4-32`, `v5litepod-16`, `v5p-64`, `v6e-8`, ...) or libtpu's grids
(`v4:2x2x4`); `--num_slices` joins several slices over the data-center network.

Prints a line per compiled step, then, as the last line, one JSON object:
`topology`, `chips`, `hosts`, `mesh`, `hbm_bytes` (a chip's), `per_chip_bytes`
(arguments, outputs, aliased, temporaries, generated code and their total,
per step), `fits`, `flops_per_step` (for all chips: `matmuls`, the step's
matrix products traced, every loop iteration and the attention kernels'
blocks counted; `model`, `bertjax.flops`' count of full rows; with
`--padding` or `--data_dir`, `model_real`, that of the real tokens; XLA's
`cost_analysis` of the compiled step, which counts a loop's body once),
`collectives` (count and bytes a chip of each kind the compiled step runs,
loops unrolled) and, with `--find_max_batch`, the largest per-chip batch of
each phase that fits and the fewest accumulation steps with which the
configured batch fits (checked by compiling them). docs/tpu.md defines
every field.
Exit status: 0 when every step fits, 1 when one does not, 2 for a setting to
change (said in one line). See docs/tpu.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any, Callable, Sequence

from absl import flags, logging
from ml_collections import config_flags

from bertjax import errors, paths, usage
from bertjax import phases as phase_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pre-training config file.",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "gcloud accelerator type (v4-32, "
                                "v5litepod-16, v5p-64, v6e-8, ...) or libtpu grid (v4:2x2x4).")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices joined over the data-center "
                                   "network (multi-slice); the data axis spans them.")
_FIND_MAX_BATCH = flags.DEFINE_bool("find_max_batch", False, "Also search the largest "
                                    "per-chip batch of each phase that fits (more compiles).")
_EVAL = flags.DEFINE_bool("eval", True, "Compile the evaluation steps too.")
_PADDING = flags.DEFINE_float("padding", None, "The share of token slots that are padding in "
                              "the data (the `padding` a run or benchmark_data reports): adds "
                              "the FLOPs of the real tokens (`model_real`).")
_DATA_DIR = paths.DEFINE_path("data_dir", None, "A prepared pre-training dataset: measures its "
                              "tokens, sequences and predictions a row for `model_real` (one "
                              "on gs:// is copied to the local cache first, as a run does).")
_DATA_BATCHES = flags.DEFINE_integer("data_batches", 16, "Batches of 64 rows read from "
                                     "--data_dir at each phase's length.")
flags.mark_flags_as_required(["config", "topology"])
flags.register_validator("padding", lambda share: share is None or 0 <= share < 1,
                         "--padding is a share of the token slots, in [0, 1)")
flags.register_multi_flags_validator(
    ["padding", "data_dir"], lambda given: given["padding"] is None or given["data_dir"] is None,
    "give --padding or --data_dir, not both")

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory")


@dataclasses.dataclass
class Target:
  """The slice(s) compiled for and the run's mesh over them."""

  tpu_slice: Any  # bertjax.topology.Slice
  num_slices: int
  devices: list[Any]
  mesh: Any

  @property
  def chips(self) -> int:
    return len(self.devices)

  @property
  def hosts(self) -> int:
    return self.tpu_slice.hosts * self.num_slices


def make_target(config, accelerator_type: str, num_slices: int) -> Target:
  """The devices and mesh of a run of `config` on the slice(s).

  Raises:
    errors.UsageError: an unknown slice, or a config that does not fit its shape.
  """
  from bertjax import sharding, topology
  from bertjax.tasks import pretrain

  if config.get("task") != "pretrain":
    raise errors.UsageError(
        f"config.task is {config.get('task')!r}: give a pre-training config "
        "(configs/base_pretrain.py, configs/large_pretrain.py, configs/demo.py)")
  if num_slices < 1:
    raise errors.UsageError(f"--num_slices={num_slices}: set it to 1 or more")
  try:
    tpu_slice = topology.parse(accelerator_type)
    devices = topology.devices(tpu_slice, num_slices)
    shape = pretrain.validate(config, len(devices))
    mesh = sharding.make_mesh(shape, devices)
  except ValueError as e:
    raise errors.UsageError(str(e)) from None
  hosts = tpu_slice.hosts * num_slices
  batches = [("train.batch_size", config.train.batch_size),
             ("eval.batch_size", config.eval.batch_size)]
  batches += [("train.long_batch_size", phase.batch_size)
              for phase in phase_lib.phases(config)[1:]]
  batches += [("train.batch_ramp_start", phase.ramp_start)
              for phase in phase_lib.phases(config) if phase.ramp_steps]
  for name, batch in batches:
    if batch % hosts:  # each host loads its share (pretrain.validate checks one host here)
      raise errors.UsageError(f"{name}={batch} does not divide over the {hosts} hosts of "
                              f"{accelerator_type}" + (f" x {num_slices}" if num_slices > 1 else "")
                              + f"; make it a multiple of {hosts}")
  return Target(tpu_slice, num_slices, devices, mesh)


def batch_spec(objective: str, batch_size: int, length: int, predictions: int,
               sharding, max_sequences_per_row: int = 1) -> dict[str, Any]:
  """ShapeDtypeStructs of a pre-training batch as `bertjax.data.loader` makes it
  (rows of up to `max_sequences_per_row` sequences: `bertjax.data.packing`)."""
  import jax
  import jax.numpy as jnp

  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

  tokens = (batch_size, length)
  batch = {"input_ids": spec(tokens, jnp.int32), "token_type_ids": spec(tokens, jnp.int32)}
  packed = max_sequences_per_row > 1
  if packed:
    batch.update(segment_ids=spec(tokens, jnp.int32), position_ids=spec(tokens, jnp.int32))
  else:
    batch["attention_mask"] = spec(tokens, jnp.int32)
  if objective == "ltr":
    batch.update(lm_labels=spec(tokens, jnp.int32), lm_weights=spec(tokens, jnp.float32))
    return batch
  masked = (batch_size, predictions)
  batch.update(masked_positions=spec(masked, jnp.int32), masked_ids=spec(masked, jnp.int32),
               masked_weights=spec(masked, jnp.float32))
  if objective == "mlm_nsp" and packed:
    pairs = (batch_size, max_sequences_per_row)
    batch.update(next_sentence_labels=spec(pairs, jnp.int32),
                 nsp_positions=spec(pairs, jnp.int32), nsp_weights=spec(pairs, jnp.float32))
  elif objective == "mlm_nsp":
    batch["next_sentence_labels"] = spec((batch_size,), jnp.int32)
  return batch


def memory_bytes(memory) -> dict[str, int]:
  """Bytes a chip holds while the step runs: its arguments and outputs (less
  the donated arguments the outputs reuse), temporaries and code."""
  sizes = {"arguments": memory.argument_size_in_bytes, "outputs": memory.output_size_in_bytes,
           "aliased": memory.alias_size_in_bytes, "temporaries": memory.temp_size_in_bytes,
           "generated_code": memory.generated_code_size_in_bytes}
  sizes = {name: int(value) for name, value in sizes.items()}
  sizes["total"] = (sizes["arguments"] + sizes["outputs"] - sizes["aliased"]
                    + sizes["temporaries"] + sizes["generated_code"])
  return sizes


def _shape_bytes(text: str) -> int:
  """Bytes of the arrays in an HLO result type (`(bf16[2,64]{1,0}, f32[])`)."""
  total = 0
  for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text):
    if dtype in _BYTES:
      total += _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return total


_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) ([a-z][\w\-]*)\((.*)$")
_CALLEES = re.compile(r"\b(condition|body|calls|to_apply|branch_computations)="
                      r"(\{[^}]*\}|%?[\w.\-]+)")


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
  """Count and bytes (per chip, of the results) of each kind of collective a
  step executes, from the compiled HLO: an operation in a loop body counts
  once per iteration (the scan over layers, gradient accumulation). Between
  slices, collectives are transfers to the data-center network's runtime:
  `dcn-all-reduce` and the like."""
  computations: dict[str, list[tuple[str, str, str]]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and not line.startswith(" "):
      current = header.group(1)
      computations[current] = []
      if line.startswith("ENTRY"):
        entry = current
      continue
    instruction = _INSTRUCTION.match(line)
    if instruction and current is not None:
      computations[current].append(instruction.groups())

  def trip_count(condition: str) -> int:
    # jax's loops count from 0 while `i < N`: N is the condition's only integer constant.
    constants = [int(v) for _, op, rest in computations.get(condition, ())
                 if op == "constant" for v in re.findall(r"^(-?\d+)\)", rest)]
    return constants[0] if len(constants) == 1 and constants[0] > 0 else 1

  multiplier: dict[str, int] = {}

  def visit(name: str, times: int) -> None:
    multiplier[name] = multiplier.get(name, 0) + times
    for _, op, rest in computations.get(name, ()):
      called = {key: [name.strip().lstrip("%") for name in value.strip("{}").split(",")]
                for key, value in _CALLEES.findall(rest)}
      if op == "while":
        visit(called["body"][0], times * trip_count(called["condition"][0]))
      else:
        for key in ("calls", "branch_computations"):
          for callee in called.get(key, ()):
            if callee in computations:
              visit(callee, times)

  if entry is not None:
    visit(entry, 1)
  found = {kind: {"count": 0, "bytes": 0} for kind in KINDS}
  for name, times in multiplier.items():
    for result, op, rest in computations[name]:
      kind = op[:-len("-done")] if op.endswith("-done") else op
      size = _shape_bytes(result)
      if op == "send" and "_xla_megascale_transfer_type" in rest:
        # Between slices: a host transfer to the data-center network's runtime.
        transfer = re.search(r'_xla_megascale_transfer_type="(\w+)"', rest).group(1)
        kind = "dcn-" + transfer.lower().replace("_", "-")
        size = _shape_bytes(re.search(r"\w+\[[\d,]*\]", result).group())  # (data, u32[], token[])
        found.setdefault(kind, {"count": 0, "bytes": 0})
      elif kind not in found or op.endswith("-start"):
        continue
      found[kind]["count"] += times
      found[kind]["bytes"] += times * size
  return found


@dataclasses.dataclass
class TracedFlops:
  """Matrix-product FLOPs of a traced step, for all chips together.

  Attributes:
    matmuls: Every product the step computes (multiply-add = 2), each loop
      iteration counted, the attention kernels' included.
    kernel_flops: The part of `matmuls` computed inside Pallas kernels (the
      splash attention kernels, forward and backward).
    kernel_calls: How many times a step runs a Pallas kernel.
  """

  matmuls: float = 0.0
  kernel_flops: float = 0.0
  kernel_calls: float = 0.0

  def __add__(self, other: TracedFlops) -> TracedFlops:
    return TracedFlops(self.matmuls + other.matmuls, self.kernel_flops + other.kernel_flops,
                       self.kernel_calls + other.kernel_calls)

  def times(self, factor: float) -> TracedFlops:
    return TracedFlops(self.matmuls * factor, self.kernel_flops * factor,
                       self.kernel_calls * factor)


def traced_flops(jaxpr, kernel_block_share: float = 1.0,
                 known: dict[Any, Any] | None = None) -> TracedFlops:
  """The matrix products of a jaxpr, every scan iteration counted (XLA's cost
  analysis counts a loop's body once), with the Pallas kernels XLA cannot see.

  A Pallas kernel's products are its body's, once per step of its grid that
  computes. Splash attention's kernels skip the steps their block mask marks
  empty (blocks outside a local band or above a causal diagonal, and the
  padding of a grid narrowed to the band); the mask is a constant of the
  jaxpr, read here. A kernel whose mask is not known computes
  `kernel_block_share` of its grid. The body of a `shard_map` runs once on
  every device of its manual axes.

  Args:
    jaxpr: The step's jaxpr, best a ClosedJaxpr (`jax.jit(...).trace(...).jaxpr`),
      whose constants hold the kernels' block masks.
    kernel_block_share: The share of a kernel's grid that computes, where its
      block mask is not known.
    known: Values of the jaxpr's variables known to be constants.
  """
  return _count(jaxpr, kernel_block_share, dict(known or {}))[0]


def _count(jaxpr, kernel_block_share: float,
           known: dict[Any, Any]) -> tuple[TracedFlops, dict[Any, Any]]:
  """`traced_flops`, and the constants known by the end of the jaxpr (those
  passed through calls too: the backward pass's kernels get their masks from
  the forward's residuals)."""
  if hasattr(jaxpr, "consts"):  # a ClosedJaxpr
    known.update(zip(jaxpr.jaxpr.constvars, jaxpr.consts))
    jaxpr = jaxpr.jaxpr
  total = TracedFlops()
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contracting, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      flops = 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)
      total += TracedFlops(matmuls=flops)
      continue
    inner = []
    for item in _sub_jaxprs(eqn):
      flops, inside = _count(item, kernel_block_share, _known_inside(eqn, item, known))
      inner.append(flops)
      known.update(_known_outputs(eqn, item, inside))
    if name == "pallas_call":
      grid = math.prod(eqn.params["grid_mapping"].grid)
      share = _computing_share(eqn, known)
      share = kernel_block_share if share is None else share
      body = sum(inner, TracedFlops()).matmuls * grid * share
      total += TracedFlops(matmuls=body, kernel_flops=body, kernel_calls=1)
    elif name == "cond":
      total += max(inner, key=lambda flops: flops.matmuls, default=TracedFlops())  # one runs
    elif name == "scan":
      total += sum(inner, TracedFlops()).times(eqn.params["length"])
    elif name == "shard_map":
      mesh = eqn.params["mesh"]
      # The parameter's name has changed across versions; an empty set is one copy.
      manual = eqn.params.get("newly_manual_axes", eqn.params.get("manual_axes"))
      manual = mesh.axis_names if manual is None else manual
      copies = math.prod(mesh.shape[axis] for axis in manual)
      total += sum(inner, TracedFlops()).times(copies)
    else:
      total += sum(inner, TracedFlops())
  return total, known


def _sub_jaxprs(eqn) -> list[Any]:
  """The jaxprs an equation runs (a call's body, a cond's branches, ...), as
  they are held (a ClosedJaxpr with its constants, or a Jaxpr)."""
  found = []
  for value in eqn.params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if hasattr(getattr(item, "jaxpr", item), "eqns"):
        found.append(item)
  return found


def _operands_of(eqn, sub) -> list[tuple[Any, Any]]:
  """(variable of the sub-jaxpr `sub`, operand of `eqn` it receives), for the
  operands that hold one value throughout: a scan's and a while loop's
  constants (not their carries or a scan's slices), a cond's operands, a
  call's all."""
  inner = getattr(sub, "jaxpr", sub).invars
  params, operands = eqn.params, eqn.invars
  name = eqn.primitive.name
  if name == "scan":
    count = params["num_consts"]
    return list(zip(inner[:count], operands[:count]))
  if name == "while":
    cond_count, body_count = params["cond_nconsts"], params["body_nconsts"]
    if sub is params["cond_jaxpr"]:
      return list(zip(inner[:cond_count], operands[:cond_count]))
    return list(zip(inner[:body_count], operands[cond_count:cond_count + body_count]))
  if name == "cond":
    return list(zip(inner, operands[1:]))  # after the branch index
  if name == "pallas_call" or len(inner) != len(operands):
    return []
  return list(zip(inner, operands))


def _value(var, known: dict[Any, Any]) -> Any:
  """A variable's constant value (a Literal's own), or None."""
  return var.val if hasattr(var, "val") else known.get(var)


def _device_block(value, shape: tuple[int, ...]):
  """A device's block of shape `shape` of a constant every device holds the
  same block of (None where the blocks differ)."""
  import numpy as np

  value = np.asarray(value)
  if value.shape == shape:
    return value
  if (len(shape) != value.ndim or 0 in shape
      or any(n % m for n, m in zip(value.shape, shape))):
    return None
  block = value[tuple(slice(0, n) for n in shape)]
  tiles = [n // m for n, m in zip(value.shape, shape)]
  return block if np.array_equal(np.tile(block, tiles), value) else None


def _known_inside(eqn, sub, known: dict[Any, Any]) -> dict[Any, Any]:
  """The constants among the operands of `eqn`, as the variables of its
  sub-jaxpr `sub` that receive them (`_operands_of`); a `shard_map`'s body
  gets a device's block, where every device's is the same."""
  values = {}
  for inside, outside in _operands_of(eqn, sub):
    value = _value(outside, known)
    if value is not None and eqn.primitive.name == "shard_map":
      value = _device_block(value, tuple(inside.aval.shape))
    if value is not None and tuple(inside.aval.shape) == tuple(getattr(value, "shape", ())):
      values[inside] = value
  return values


def _known_outputs(eqn, sub, inside: dict[Any, Any]) -> dict[Any, Any]:
  """The outputs of a call `eqn` that are constants its sub-jaxpr `sub` passes
  out (known in `inside`), by position; a `shard_map`'s every device's
  (equal) block, joined. Loops and conds pass none (a carry changes)."""
  import numpy as np

  inner = getattr(sub, "jaxpr", sub).outvars
  if (eqn.primitive.name in ("scan", "while", "cond", "pallas_call")
      or len(inner) != len(eqn.outvars)):
    return {}
  values = {}
  for inside_var, outside in zip(inner, eqn.outvars):
    value = _value(inside_var, inside)
    if value is None:
      continue
    value, shape = np.asarray(value), tuple(outside.aval.shape)
    if (eqn.primitive.name == "shard_map" and value.shape != shape and value.size
        and len(shape) == value.ndim and not any(n % m for n, m in zip(shape, value.shape))):
      value = np.tile(value, [n // m for n, m in zip(shape, value.shape)])
    if value.shape == shape:
      values[outside] = value
  return values


def _computing_share(eqn, known: dict[Any, Any]) -> float | None:
  """The share of a splash kernel's grid steps that compute: the non-zero
  entries of its block mask (its second scalar operand, after `data_next`:
  0 skip, 1 partly masked, 2 whole), or None where it is not a known constant
  or the kernel is not splash's."""
  import numpy as np

  if not str(eqn.params.get("name", "")).startswith("splash_"):
    return None
  operands = eqn.invars[:eqn.params["grid_mapping"].num_index_operands]
  if len(operands) < 2:
    return None
  mask = _value(operands[1], known)
  if mask is None:
    return None
  mask = np.asarray(mask)
  if mask.ndim != 3 or not mask.size or not np.isin(mask, (0, 1, 2)).all():
    return None  # not a block mask
  return float(np.count_nonzero(mask)) / mask.size


def causal_block_share(length: int, block: int) -> float:
  """The share of a causal mask's square blocks at or below the diagonal."""
  blocks = -(-length // block)
  return (blocks + 1) / (2 * blocks)


_SIZE = r"([\d.]+)([KMGT]?)i?B?"


def out_of_memory_bytes(message: str) -> tuple[int | None, int | None]:
  """(bytes needed, bytes available) from XLA's out-of-memory error, where it
  says them (`... HLO temporaries (19.30G) exceeds available HBM (15.75G)`)."""
  scale = lambda number, unit: int(float(number) * 1024 ** " KMGT".index(unit or " "))
  for pattern in (rf"\({_SIZE}\) exceeds available HBM \({_SIZE}\)",
                  rf"Used {_SIZE} of {_SIZE} hbm"):
    match = re.search(pattern, message, re.I)
    if match:
      return scale(*match.group(1, 2)), scale(*match.group(3, 4))
  return None, None


def argument_bytes(args) -> int:
  """Bytes a chip holds of sharded abstract arguments."""
  import jax
  import numpy as np

  return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
             for leaf in jax.tree.leaves(args))


def compile_step(jitted, *args, kernel_block_share: float = 1.0) -> dict[str, Any]:
  """Compiles one step; its memory, FLOPs and collectives, or that XLA found
  it too large for the chip (`kernel_block_share`: as for `traced_flops`)."""
  start = time.perf_counter()
  traced = jitted.trace(*args)
  lowered = traced.lower()
  try:
    compiled = lowered.compile()
  except Exception as e:  # jax raises JaxRuntimeError (XlaRuntimeError) here
    message = str(e)
    if not any(marker in message for marker in _OUT_OF_MEMORY):
      raise
    first = next((line for line in message.splitlines() if line.strip()), message)
    needed, available = out_of_memory_bytes(message)
    memory = {"arguments": argument_bytes(args), "temporaries": needed}
    # Outputs reuse the donated state; code is left out: a lower bound.
    memory["total"] = None if needed is None else memory["arguments"] + needed
    return {"fits": False, "compile_s": round(time.perf_counter() - start, 1),
            "per_chip_bytes": memory, "xla_hbm_limit_bytes": available, "error": first[:500]}
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {"compile_s": round(time.perf_counter() - start, 1),
          "per_chip_bytes": memory_bytes(compiled.memory_analysis()),
          "flops_per_chip": float((cost or {}).get("flops", 0.0)),
          "traced_flops": traced_flops(traced.jaxpr, kernel_block_share),
          "collectives": collectives(compiled.as_text())}


def _phase_programs(config) -> list[tuple[str, Any]]:
  """(name, phase) of each distinct program: `128`, `512` (`512_80` where two
  phases share a length)."""
  phases = phase_lib.phases(config)
  lengths = [phase.max_seq_length for phase in phases]
  programs = {(f"{phase.max_seq_length}" if lengths.count(phase.max_seq_length) == 1 else
               f"{phase.max_seq_length}_{phase.max_predictions}"): phase for phase in phases}
  return list(programs.items())


def _window(config, phase) -> int | None:
  """ModernBERT's local window (keys either side) in a phase, None for BERT."""
  from bertjax.models import BertConfig

  bert = phase.model(BertConfig.from_run_config(config))
  return bert.local_attention // 2 if bert.modern else None


@dataclasses.dataclass
class RealWork:
  """The useful work of a row of each phase (by `Phase.index`), for the FLOPs
  of the real tokens: `bertjax.train.batch_work`'s counts a row, the share of
  padding slots, and where they come from."""

  per_row: dict[int, dict[str, float]]
  source: str

  @classmethod
  def given(cls, config, padding: float) -> RealWork:
    """Rows of one sequence each, `padding` of their slots empty."""
    from bertjax import flops

    if config.data.max_sequences_per_row > 1:
      raise errors.UsageError(
          f"--padding takes rows of one sequence each; data.max_sequences_per_row="
          f"{config.data.max_sequences_per_row} packs several: measure them with --data_dir")
    per_row = {}
    for phase in phase_lib.phases(config):
      row = flops.row_work(config.objective, (1 - padding) * phase.max_seq_length,
                           phase.max_predictions, config.data.masked_lm_prob,
                           _window(config, phase))
      per_row[phase.index] = {**row, "padding": padding}
    return cls(per_row, f"given: {padding:g} of the token slots are padding, one sequence a row")

  @classmethod
  def measured(cls, config, data_dir: str, batches: int, rows: int = 64) -> RealWork:
    """What the run's loader makes of a prepared dataset: `batches` batches of
    `rows` rows at each phase's length (masked afresh, as a run without
    `data.static` does).

    Raises:
      errors.Error: the dataset is missing, unfinished or of a larger
        vocabulary than the model's.
    """
    import numpy as np

    from bertjax import train
    from bertjax.data import loader, packing, shards
    from bertjax.tasks import pretrain_data

    if batches < 1:
      raise errors.UsageError(f"--data_batches={batches}: read 1 or more batches")
    shards.complete_shards(data_dir)  # names what is missing
    local = shards.reading_directory(data_dir, config.data.read_mode)  # streamed on gs://
    pretrain_data.check_vocabulary(config, local)
    per_row = {}
    for phase in phase_lib.phases(config):
      settings = dataclasses.replace(
          pretrain_data.loader_config(config, local, phase, "train", rows), static=False,
          shuffle_window=min(config.data.shuffle_window, 4 * rows))
      iterator = iter(loader.make_dataset(settings))
      sums: dict[str, float] = {}
      for _ in range(batches):
        batch = next(iterator)
        work = train.batch_work(batch, config.objective, _window(config, phase))
        work["padding"] = packing.padding_share(batch)
        for name, value in work.items():
          sums[name] = sums.get(name, 0.0) + float(np.asarray(value))
      per_row[phase.index] = {name: value / (batches if name == "padding" else batches * rows)
                              for name, value in sums.items()}
    return cls(per_row, f"measured: {batches} batches of {rows} rows of {data_dir}")


class Compiler:
  """The steps of `config` on a target, compiled with the run's own functions."""

  def __init__(self, config, target: Target, real_work: RealWork | None = None):
    import flax.linen as nn
    import jax

    from bertjax import checkpoint, optim, sharding, train
    from bertjax.models import BertConfig

    self.config, self.target, self.real_work = config, target, real_work
    self.bert = BertConfig.from_run_config(config)
    self.model = train.pretraining_model(self.bert, config.objective)
    self.optimizer, self.schedule = optim.make_optimizer(config)
    self.rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
    mesh = target.mesh
    with jax.set_mesh(mesh), nn.logical_axis_rules(self.rules):
      abstract = train.abstract_train_state(self.model, self.optimizer, config.seed)
      self.shardings = train.state_shardings(abstract, mesh, self.rules)
    self.state = checkpoint.abstract_with_shardings(abstract, self.shardings)
    self.batch_sharding = sharding.batch_sharding(mesh)
    self.data_shards = sharding.batch_shards(mesh)
    self.parameter_count = sum(math.prod(leaf.shape)
                               for leaf in jax.tree.leaves(self.state.params))

  def _steps(self, accumulation_steps: int, phase):
    from bertjax import sharding, train

    model = train.pretraining_model(phase.model(self.bert), self.config.objective)
    return train.jit_steps(model, self.optimizer, self.schedule, self.config.objective,
                           accumulation_steps, self.shardings, self.batch_sharding,
                           sharding.replicated(self.target.mesh))

  def train(self, phase, batch_size: int, accumulation_steps: int) -> dict[str, Any]:
    """Compiles the training step of a phase; its memory, FLOPs, collectives."""
    return self._compile(self._steps(accumulation_steps, phase)[0], phase, batch_size, True)

  def evaluate(self, phase, batch_size: int) -> dict[str, Any]:
    """Compiles the evaluation step of a phase; its memory, FLOPs, collectives."""
    return self._compile(self._steps(1, phase)[1], phase, batch_size, False)

  def _compile(self, step, phase, batch_size: int, training: bool) -> dict[str, Any]:
    import flax.linen as nn
    import jax

    from bertjax import flops
    from bertjax.models import attention

    length = phase.max_seq_length
    batch = batch_spec(self.config.objective, batch_size, length, phase.max_predictions,
                       self.batch_sharding, self.config.data.max_sequences_per_row)
    # Where a kernel's block mask cannot be read: the blocks a causal mask reaches.
    share = causal_block_share(length, attention.SPLASH_BLOCK) if self.bert.causal else 1.0
    with jax.set_mesh(self.target.mesh), nn.logical_axis_rules(self.rules):
      result = compile_step(step, self.state if training else self.state.params, batch,
                            kernel_block_share=share)
    total = result["per_chip_bytes"].get("total")
    result.setdefault("fits", total is not None
                      and total <= self.target.tpu_slice.generation.hbm_bytes)
    if "flops_per_chip" in result:
      # Full rows: every slot a token, every prediction slot used.
      full = flops.row_work(self.config.objective, length, phase.max_predictions, 1.0,
                            _window(self.config, phase))
      model = flops.work_flops(phase.model(self.bert), full, batch_size, training)
      compiled = result.pop("flops_per_chip") * self.target.chips
      traced = result.pop("traced_flops")
      counts = {
          "matmuls": traced.matmuls, "attention_kernels": traced.kernel_flops,
          "attention_kernel_calls": int(traced.kernel_calls), "model": model,
          "ratio": round(traced.matmuls / model, 3), "cost_analysis": compiled,
          "cost_analysis_ratio": round(compiled / model, 3)}
      if self.real_work is not None:
        row = self.real_work.per_row[phase.index]
        real = flops.work_flops(phase.model(self.bert), row, batch_size, training)
        counts.update(model_real=real, real_share=round(real / traced.matmuls, 3))
      result["flops_per_step"] = counts
    return result

  def max_per_chip_batch(self, phase, start: int,
                         known: dict[int, dict[str, Any]] | None = None
                         ) -> tuple[int, list[dict[str, Any]]]:
    """The largest per-chip batch (one micro-batch, in steps of 8 from 8 on)
    whose training step fits.

    Doubling brackets the answer; then each compile aims where the line
    through the nearest batches that fit and do not crosses the HBM size.

    Args:
      phase: The phase (sequence length) to search.
      start: A per-chip batch to begin from (the configured one).
      known: Results already compiled, by per-chip batch (accumulation 1).

    Returns:
      The batch (0 if not even one sequence fits) and every batch tried:
      whether it fit, its total bytes and XLA's refusal.
    """
    results = dict(known or {})
    best = self._search(phase, start, results)
    tried = [{"per_chip_batch": size, "fits": result["fits"],
              "total_bytes": result["per_chip_bytes"].get("total"),
              **({"error": result["error"]} if "error" in result else {})}
             for size, result in sorted(results.items())]
    return best, tried

  def _search(self, phase, start: int, results: dict[int, dict[str, Any]]) -> int:
    """`max_per_chip_batch`'s search, compiling into `results`."""

    def result(per_chip: int) -> dict[str, Any]:
      if per_chip not in results:
        logging.info("Trying %d sequences a chip at length %d", per_chip,
                     phase.max_seq_length)
        results[per_chip] = self.train(phase, per_chip * self.data_shards, 1)
      return results[per_chip]

    fits = lambda per_chip: result(per_chip)["fits"]
    total = lambda per_chip: result(per_chip)["per_chip_bytes"].get("total")
    low = max(1, start)
    while not fits(low):
      if low == 1:
        return 0
      low //= 2
    high = low * 2
    while fits(high):
      low, high = high, high * 2
    # Between a batch that fits and one that does not, memory grows about
    # linearly: aim at the HBM size on the line through both (XLA's own limit
    # once an error has said it), within the middle half of the gap.
    step = 8 if low >= 8 else 1
    while high - low > step:
      limit = min([self.target.tpu_slice.generation.hbm_bytes]
                  + [r["xla_hbm_limit_bytes"] for r in results.values()
                     if r.get("xla_hbm_limit_bytes")])
      middle = (low + high) // 2
      if total(high) is not None and total(high) > total(low):
        slope = (total(high) - total(low)) / (high - low)
        quarter = (high - low) // 4
        middle = min(max(int(low + (limit - total(low)) / slope), low + quarter),
                     high - quarter)
      middle = min(max(middle // step * step, low + step), high - step)
      if fits(middle):
        low = middle
      else:
        high = middle
    return low


def _accumulation_holds(batch_size: int, data_shards: int, max_per_chip: int,
                        steps: int) -> bool:
  """Whether `steps` micro-batches split the batch evenly, each over the data
  shards evenly, with at most `max_per_chip` rows a chip."""
  micro = batch_size // steps
  return (not batch_size % steps and not micro % data_shards
          and micro // data_shards <= max_per_chip)


def accumulation_for(batch_size: int, data_shards: int, max_per_chip: int,
                     more_than: int = 0) -> int | None:
  """The fewest accumulation steps (above `more_than`) whose micro-batches
  divide evenly over the data shards and hold at most `max_per_chip` a chip."""
  if max_per_chip < 1:
    return None
  return next((steps for steps in range(more_than + 1, batch_size + 1)
               if _accumulation_holds(batch_size, data_shards, max_per_chip, steps)), None)


def run_accumulation_for(phases: Sequence[Any], data_shards: int, max_per_chip: Sequence[int],
                         processes: int, more_than: int = 0) -> int | None:
  """The fewest accumulation steps (above `more_than`) that one run can set
  (`train.accumulation_steps` serves every phase): each phase's batch divides
  into that many micro-batches, which divide over the data shards and hold at
  most the phase's `max_per_chip` a chip, and every batch of the batch-size
  warmup divides into micro-batches as the trainer needs."""
  from bertjax.tasks import pretrain

  if min(max_per_chip) < 1:
    return None

  def warmup_divides(steps: int) -> bool:
    try:
      for phase in phases:
        if phase.ramp_steps:
          pretrain.check_ramp(phase, steps, data_shards, processes)
    except errors.UsageError:
      return False
    return True

  return next((steps for steps in range(more_than + 1, min(p.batch_size for p in phases) + 1)
               if all(_accumulation_holds(phase.batch_size, data_shards, limit, steps)
                      for phase, limit in zip(phases, max_per_chip))
               and warmup_divides(steps)), None)


def run(config, accelerator_type: str, num_slices: int = 1, find_max_batch: bool = False,
        evaluate: bool = True, real_work: Callable[[], RealWork] | None = None
        ) -> dict[str, Any]:
  """Compiles every step of `config` for the slice(s); the report (JSON-ready).

  Args:
    real_work: Makes the rows' useful work, for `model_real` (`RealWork`):
      called once the slice and the config are checked (a dataset may be
      read for it).

  Raises:
    errors.UsageError: a setting to change.
  """
  target = make_target(config, accelerator_type, num_slices)
  real_work = real_work() if real_work is not None else None
  compiler = Compiler(config, target, real_work)
  tpu_slice = target.tpu_slice
  train_config = config.train
  micro = train_config.batch_size // train_config.accumulation_steps
  report: dict[str, Any] = {
      "topology": accelerator_type, "libtpu_topology": tpu_slice.topology_name,
      "num_slices": num_slices, "device_kind": target.devices[0].device_kind,
      "chips": target.chips, "hosts": target.hosts,
      "mesh": {name: int(size) for name, size in target.mesh.shape.items()},
      "hbm_bytes": tpu_slice.generation.hbm_bytes,
      "model": {"parameters": compiler.parameter_count, "objective": config.objective,
                "dtype": compiler.bert.dtype},
      "batch_size": train_config.batch_size,
      "accumulation_steps": train_config.accumulation_steps,
      "per_chip_batch": micro // compiler.data_shards,
      "eval_batch_size": config.eval.batch_size,
      "phases": [], "per_chip_bytes": {}, "flops_per_step": {}, "collectives": {},
  }
  fits = True
  train_results: dict[str, dict[str, Any]] = {}
  for name, phase in _phase_programs(config):
    report["phases"].append({"name": name, "steps": [phase.start, phase.end],
                             "max_seq_length": phase.max_seq_length,
                             "max_predictions": phase.max_predictions,
                             "batch_size": phase.batch_size,
                             **({"model": dict(phase.model_changes)}
                                if phase.model_changes else {})})
    if real_work is not None:
      report.setdefault("real_work", {"source": real_work.source, "per_row": {}})
      report["real_work"]["per_row"][name] = {
          key: round(value, 4) for key, value in real_work.per_row[phase.index].items()}
    for kind in ("train", "eval") if evaluate else ("train",):
      key = f"{kind}_{name}"
      logging.info("Compiling %s for %s", key, accelerator_type)
      if kind == "train":
        result = train_results[name] = compiler.train(
            phase, phase.batch_size, train_config.accumulation_steps)
      else:
        result = compiler.evaluate(phase, config.eval.batch_size)
      fits = fits and result["fits"]
      report["per_chip_bytes"][key] = result["per_chip_bytes"]
      if "flops_per_step" in result:
        report["flops_per_step"][key] = result["flops_per_step"]
        report["collectives"][key] = result["collectives"]
      report.setdefault("compile_s", {})[key] = result["compile_s"]
      if "error" in result:
        report.setdefault("errors", {})[key] = result["error"]
        if result["xla_hbm_limit_bytes"]:
          report["xla_hbm_limit_bytes"] = result["xla_hbm_limit_bytes"]
      print(summary_line(key, result, report), flush=True)
    if find_max_batch:
      per_chip = phase.batch_size // train_config.accumulation_steps // compiler.data_shards
      known = ({per_chip: train_results[name]} if train_config.accumulation_steps == 1 else {})
      best, tried = compiler.max_per_chip_batch(phase, per_chip, known)
      report.setdefault("max_batch_trials", {})[f"train_{name}"] = tried
      steps = accumulation_for(phase.batch_size, compiler.data_shards, best)
      report.setdefault("max_per_chip_batch", {})[f"train_{name}"] = best
      report.setdefault("accumulation_to_fit", {})[f"train_{name}"] = steps
      print(f"train_{name}: at most {best} sequences a chip fit (without accumulation)",
            flush=True)
  if find_max_batch:
    steps, tried = _accumulation_that_fits(compiler, config, report, train_results)
    report["accumulation_to_fit"]["run"] = steps
    report["accumulation_trials"] = tried
    print(f"accumulation_steps={steps} makes every phase fit" if steps else
          "no accumulation makes every phase fit: shard the state (mesh.fsdp) or "
          "rematerialise (model.remat_policy)", flush=True)
  report["fits"] = fits
  return report


def _accumulation_that_fits(compiler: Compiler, config, report: dict[str, Any],
                            compiled: dict[str, dict[str, Any]]
                            ) -> tuple[int | None, list[dict[str, Any]]]:
  """The fewest accumulation steps with which every phase's training step
  compiles within the HBM: from what the largest batches suggest, checked by
  compiling (accumulating costs memory of its own: the summed gradients).

  `compiled`: the training steps already compiled at the configured setting.
  """
  shards, hosts = compiler.data_shards, compiler.target.hosts
  programs = _phase_programs(config)
  phases = [phase for _, phase in programs]
  steps = run_accumulation_for(phases, shards, [
      report["max_per_chip_batch"][f"train_{name}"] for name, _ in programs], hosts)
  unlimited = [phase.batch_size for phase in phases]
  tried = []
  while steps is not None and len(tried) < 4:
    results = {}
    for name, phase in programs:
      if steps == config.train.accumulation_steps:
        results[name] = compiled[name]
      else:
        logging.info("Trying accumulation_steps=%d at length %d", steps, phase.max_seq_length)
        results[name] = compiler.train(phase, phase.batch_size, steps)
    fit = all(result["fits"] for result in results.values())
    tried.append({"accumulation_steps": steps, "fits": fit,
                  "total_bytes": {f"train_{name}": result["per_chip_bytes"].get("total")
                                  for name, result in results.items()}})
    if fit:
      return steps, tried
    steps = run_accumulation_for(phases, shards, unlimited, hosts, more_than=steps)
  return None, tried


def summary_line(key: str, result: dict[str, Any], report: dict[str, Any]) -> str:
  gib = lambda n: "?" if n is None else f"{n / 2**30:.2f}"
  memory = result["per_chip_bytes"]
  verdict = "fits" if result["fits"] else "DOES NOT FIT"
  line = (f"{key}: {gib(memory.get('total'))} GiB a chip of {gib(report['hbm_bytes'])}, "
          f"{verdict} (compiled in {result['compile_s']} s)")
  if "temporaries" in memory:
    line += (f"; arguments {gib(memory['arguments'])}, temporaries "
             f"{gib(memory['temporaries'])} GiB")
  if "error" in result:
    line += f"; XLA: {result['error']}"
  if "flops_per_step" in result:
    flops = result["flops_per_step"]
    line += f"; {flops['matmuls']:.3g} matmul FLOPs a step"
    if flops["attention_kernel_calls"]:
      line += (f" ({flops['attention_kernels']:.3g} in {flops['attention_kernel_calls']} "
               "attention kernel calls)")
    line += f", model {flops['model']:.3g}"
    if "model_real" in flops:
      line += f", on real tokens {flops['model_real']:.3g}"
    line += f", XLA cost analysis {flops['cost_analysis']:.3g}"
    line += "".join(f"; {kind} {c['count']}x {c['bytes'] / 2**20:.1f} MiB"
                    for kind, c in result["collectives"].items() if c["count"])
  return line


def main(argv):
  import jax

  del argv
  # The chips are libtpu's description of the slice: never claim a local TPU
  # (a run may be using it) or wait for one, and let other processes load
  # libtpu meanwhile (it takes a lock for the chips otherwise).
  jax.config.update("jax_platforms", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  config = _CONFIG.value
  real_work = None
  if _PADDING.value is not None:
    real_work = lambda: RealWork.given(config, _PADDING.value)
  elif _DATA_DIR.value:
    real_work = lambda: RealWork.measured(config, _DATA_DIR.value, _DATA_BATCHES.value)
  report = run(config, _TOPOLOGY.value, _NUM_SLICES.value, _FIND_MAX_BATCH.value, _EVAL.value,
               real_work)
  print(json.dumps(report), flush=True)
  sys.exit(0 if report["fits"] else 1)


if __name__ == "__main__":
  usage.run_main(main)
