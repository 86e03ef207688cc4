"""The matrix products a traced step computes, for all chips together.

`bertjax.flops` counts the model's useful work from the architecture and the
rows' counts; this counts what the chips are asked to compute, from the
step's jaxpr: every padding slot and prediction slot, the word table's
padded rows, recomputation (`remat_policy`), each loop iteration (XLA's cost
analysis counts a loop's body once), and the Pallas splash attention kernels
XLA cannot see, block by block. Those kernels compute 9 products of a block
where XLA's attention computes 6 (the backward kernels compute the scores
and their gradient again; bertjax's one-block kernels, for rows of 128
tokens, 7), and skip the blocks their block mask marks
empty: above a causal diagonal, outside a ModernBERT local layer's band. The
masks are constants of the jaxpr, followed here into the calls, loops and
`shard_map`s that use them, so each kernel call is counted with its own
layer's mask.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np


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
