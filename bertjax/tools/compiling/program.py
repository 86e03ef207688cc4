"""What a compiled step holds and sends on a chip.

`compile_step` traces, lowers and compiles one step and reads it back: the
bytes a chip holds (XLA's memory analysis), the matrix products traced
(`jaxpr_flops`), XLA's own FLOP count, and the collectives the compiled HLO
runs, each loop iteration counted; or, when XLA refuses the step as too
large, the bytes its message says it needed.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import jax
import numpy as np

from bertjax.tools.compiling import jaxpr_flops

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory")


def compile_step(jitted, *args, kernel_block_share: float = 1.0) -> dict[str, Any]:
  """Compiles one step; its memory, FLOPs and collectives, or that XLA found
  it too large for the chip (`kernel_block_share`: as for `jaxpr_flops.traced_flops`)."""
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
  hlo = compiled.as_text()
  return {"compile_s": round(time.perf_counter() - start, 1),
          "per_chip_bytes": memory_bytes(compiled.memory_analysis()),
          "flops_per_chip": float((cost or {}).get("flops", 0.0)),
          "bytes_accessed_per_chip": float((cost or {}).get("bytes accessed", 0.0)),
          "loops": " while(" in hlo,
          "traced_flops": jaxpr_flops.traced_flops(traced.jaxpr, kernel_block_share),
          "collectives": collectives(hlo)}


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


def shape_bytes(text: str) -> int:
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
      size = shape_bytes(result)
      if op == "send" and "_xla_megascale_transfer_type" in rest:
        # Between slices: a host transfer to the data-center network's runtime.
        transfer = re.search(r'_xla_megascale_transfer_type="(\w+)"', rest).group(1)
        kind = "dcn-" + transfer.lower().replace("_", "-")
        size = shape_bytes(re.search(r"\w+\[[\d,]*\]", result).group())  # (data, u32[], token[])
        found.setdefault(kind, {"count": 0, "bytes": 0})
      elif kind not in found or op.endswith("-start"):
        continue
      found[kind]["count"] += times
      found[kind]["bytes"] += times * size
  return found


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
  return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
             for leaf in jax.tree.leaves(args))
