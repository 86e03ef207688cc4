"""The largest per-chip batch whose compiled step fits a chip's memory.

The search only needs a way to compile the step at a batch and read what the
compiler said, so it serves bertjax's steps (`compiler.Compiler`) and a
peer's (`benchmarks/tpu_compile_vs_peer.py`) alike.
"""

from __future__ import annotations

from typing import Any, Callable

# What compiling at a per-chip batch returns: {"fits": bool, "per_chip_bytes":
# {"total": int | None, ...}, and "xla_hbm_limit_bytes" (the memory XLA said
# it may use) where it refused the step}.
Result = dict[str, Any]


def largest_batch(compile_at: Callable[[int], Result], start: int, hbm_bytes: int,
                  results: dict[int, Result] | None = None, step: int = 8) -> int:
  """The largest per-chip batch (in steps of `step` from `step` on) whose step fits.

  Doubling from `start` brackets the answer; then each compile aims where the
  line through the nearest batches that fit and do not crosses the memory
  limit (a chip's HBM, or XLA's own limit once a refusal has said it), within
  the middle half of the gap. Memory grows about linearly with the batch far
  from the limit; near it XLA recomputes to fit and memory bends below the
  line; within the middle half, each compile still takes a quarter or more
  off the gap.

  Args:
    compile_at: Compiles the step at a per-chip batch; its `Result`.
    start: A per-chip batch to begin from.
    hbm_bytes: A chip's memory.
    results: Results already compiled, by per-chip batch; every compile of the
      search is added to it.
    step: The batches searched above `step` are its multiples (8: whole
      sublanes of sequences; 1: the exact largest batch).

  Returns:
    The batch, or 0 when not even one sequence fits.
  """
  results = {} if results is None else results

  def result(per_chip: int) -> Result:
    if per_chip not in results:
      results[per_chip] = compile_at(per_chip)
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
  step = step if low >= step else 1
  while high - low > step:
    limit = min([hbm_bytes] + [r["xla_hbm_limit_bytes"] for r in results.values()
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


def trials(results: dict[int, Result]) -> list[dict[str, Any]]:
  """Every batch compiled: whether it fit, its total bytes, its FLOPs a chip
  where the result has them (XLA recomputes to fit a step, which they show)
  and XLA's refusal."""
  return [{"per_chip_batch": size, "fits": result["fits"],
           "total_bytes": result["per_chip_bytes"].get("total"),
           **{key: result[key] for key in ("flops_per_chip", "error") if key in result}}
          for size, result in sorted(results.items())]
