r"""bertjax's TPU pre-training step beside transformers' Flax BERT, by the compiler's counts.

  python -m venv /tmp/hf4 && /tmp/hf4/bin/pip install 'jax[tpu]==0.10.2' flax optax \
      'transformers==4.57.6'
  python benchmarks/tpu_compile_vs_peer.py --model=base --topology=v5litepod-4 \
      --seq_len=128 --per_chip_batch=32 --peer_python=/tmp/hf4/bin/python

No TPU is needed: both training steps are compiled by libtpu for the slice's
chips (bertjax's with `python -m bertjax.tools.compile`, the peer's with
`benchmarks/hf_flax_bert.py --compile_for`, in its own venv: transformers
4.57.6 is the last release with Flax models), each in a process of its own,
with the same recipe: data parallel over every chip, float32 parameters with
bfloat16 compute, layers unrolled, hidden dropout 0.1 and no attention
dropout (bertjax's pre-training recipe), AdamW with global-norm clipping,
masked LM at `ceil(0.15 * seq_len)` positions plus NSP. The peer scores the
vocabulary at every position, as its `run_mlm_flax.py` does.

Prints, for each side and their ratio: a chip's memory (arguments,
temporaries, total), FLOPs (XLA's count; bertjax's attention kernels are
custom calls XLA does not count, so their FLOPs, traced from the kernels'
block masks, are added) and bytes accessed (XLA's count). Then where the bytes
go: what every operation of each compiled step reads and writes (its operands
and result, from XLA's dump of the program after optimisation, before buffer
assignment), summed by part of the model and by forward and backward pass.
That sum is not XLA's count, which also counts the traffic within fusions
(about 1.8 times the sum for BERT-base at 128 tokens), so both are printed.
The last line is one JSON object with every figure.

`--find_max_batch` searches instead each side's largest per-chip batch whose
step fits a chip (`bertjax.tools.compiling.batch_search`, from
`--per_chip_batch`: doubling, then aiming along the line of memory against
batch; in steps of `--batch_step`), a process and a compile per batch tried;
`--remat` recomputes each layer in the backward pass on both sides.

  python benchmarks/tpu_compile_vs_peer.py --model=large --topology=v5litepod-4 \
      --seq_len=512 --per_chip_batch=16 --find_max_batch --batch_step=1
"""

import argparse
import collections
import glob
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from bertjax import usage
from bertjax.tools.compiling import batch_search
from bertjax.tools.compiling.program import out_of_memory_bytes, shape_bytes

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = {"base": dict(layers=12, hidden=768, heads=12), "large": dict(layers=24, hidden=1024,
                                                                       heads=16)}
# Operations that move no bytes of their own (views, bookkeeping), and the
# second halves of asynchronous pairs (their start counts).
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier", "add-dependency"}
# Part of the model, by the op_name JAX records (first match wins).
PARTS = [
    ("dropout masks (PRNG)", ("threefry", "_bernoulli", "_uniform", "random_bits", "rng")),
    ("dropout", ("dropout",)),
    ("layer norm", ("layer_norm", "layernorm")),
    ("attention", ("attention", "splash", "shard_map")),
    ("feed-forward", ("intermediate", "/output/")),
    ("heads and loss", ("cls/", "predictions", "seq_relationship", "mlm", "nsp", "pooler",
                        "log_softmax", "take_along_axis", "lm_head", "loss")),
    ("embeddings", ("embeddings",)),
    ("parameter reads", ("state.params", "params[")),
]


def _closing(text: str, start: int) -> int:
  """The index of the parenthesis closing the one at `start`."""
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return i
  return len(text) - 1


def operations(hlo: str):
  """(opcode, what, bytes read and written) of each operation of the entry
  computation of a module dumped after optimisation: `what` is the op_name
  JAX recorded, else the instruction's name (a Pallas kernel's). An operation
  reads its operands (the results of the instructions it names) and writes
  its result."""
  entry = hlo[hlo.index("\nENTRY "):]
  written: dict[str, int] = {}
  parsed = []
  for line in entry.splitlines()[1:]:
    if " = " not in line:
      continue
    target, rhs = line.split(" = ", 1)
    target = target.strip().removeprefix("ROOT ").strip()
    if rhs.startswith("("):  # a tuple type
      end = _closing(rhs, 0)
      result, rest = rhs[:end + 1], rhs[end + 1:].lstrip()
    else:
      result, _, rest = rhs.partition(" ")
    opcode, _, rest = rest.partition("(")
    operands = re.findall(r"%[\w.\-]+", rest[:_closing("(" + rest, 0) - 1])
    written[target] = shape_bytes(result)
    parsed.append((target, opcode, operands, line))
  for target, opcode, operands, line in parsed:
    if opcode in _FREE or opcode.endswith("-done"):
      continue
    name = re.search(r'op_name="([^"]*)"', line)
    what = name.group(1) if name else target.lstrip("%")
    yield opcode, what, written[target] + sum(written.get(o, 0) for o in operands)


def part_of(op_name: str) -> str:
  lowered = op_name.lower()
  for part, keys in PARTS:
    if any(key in lowered for key in keys):
      return part
  return "optimizer and the rest"


def breakdown(hlo: str) -> dict[str, dict[str, float]]:
  """GB by part of the model and pass (forward, backward, update)."""
  sums = collections.defaultdict(lambda: collections.defaultdict(float))
  for _, op_name, count in operations(hlo):
    part = part_of(op_name)
    # A Pallas kernel has no op_name: its name says the pass (splash_mha_fwd,
    # splash_mha_dq and _dkv).
    direction = ("backward" if re.search(r"transpose\(jvp\(|_bwd|_dq_|_dkv_", op_name)
                 else "forward" if re.search(r"jvp\(|_fwd", op_name)
                 else "outside the model")
    sums[part][direction] += count / 1e9
  return {part: dict(values) for part, values in sums.items()}


def largest_operations(hlo: str, count: int) -> list[tuple[str, int, float]]:
  """The `count` kinds of operation that read and write the most: (what, how
  many, GB), the layers' copies of one operation counted together (their
  op_names differ only in the layer's index)."""
  sums: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
  for opcode, op_name, moved in operations(hlo):
    what = re.sub(r"(layers?_?|/)\d+(?=/|$)", r"\1*", op_name)
    what = re.sub(r"\.\d+$", "", what)  # a kernel's instruction number
    sums[f"{opcode} {what}"][0] += 1
    sums[f"{opcode} {what}"][1] += moved / 1e9
  ranked = sorted(sums.items(), key=lambda item: -item[1][1])[:count]
  return [(what, n, gb) for what, (n, gb) in ranked]


def train_step_hlo(dump_dir: str) -> str:
  """The largest module dumped after optimisation: the training step."""
  paths = glob.glob(os.path.join(dump_dir, "*after_optimizations_before_buffer_assignment.txt"))
  if not paths:
    sys.exit(f"no HLO dumped in {dump_dir}")
  return pathlib.Path(max(paths, key=os.path.getsize)).read_text()


def run(command: list[str], dump_dir: str | None = None) -> dict:
  """The last line of `command`'s output, a JSON object; with `dump_dir`, XLA
  dumps the programs it compiles there."""
  env = dict(os.environ)
  if dump_dir:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                        + f" --xla_dump_to={dump_dir} --xla_dump_hlo_as_text")
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
  if result.returncode not in (0, 1):  # the compile tool exits 1 for a step that does not fit
    sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


class Sides:
  """The two compiles of one setting: bertjax's (the compile tool) and the
  peer's (hf_flax_bert.py in its venv), at a per-chip batch."""

  def __init__(self, args, tpu_slice):
    self.args, self.tpu_slice = args, tpu_slice
    self.sizes = MODELS[args.model]
    self.predictions = math.ceil(0.15 * args.seq_len)
    self.key = f"train_{args.seq_len}"

  def ours(self, per_chip: int, dump_dir: str | None = None) -> dict:
    args = self.args
    return run([sys.executable, "-m", "bertjax.tools.compile",
                f"--config=configs/{args.model}_pretrain.py", f"--topology={args.topology}",
                "--eval=false", f"--config.train.batch_size={per_chip * self.tpu_slice.chips}",
                f"--config.train.max_seq_length={args.seq_len}",
                f"--config.train.max_predictions={self.predictions}",
                "--config.train.long_from_step=-1", "--config.model.scan_layers=false",
                f"--config.model.remat_policy={'full' if args.remat else 'none'}",
                *(f"--config.{setting}" for setting in args.bertjax_setting)], dump_dir)

  def peer(self, per_chip: int, dump_dir: str | None = None) -> dict:
    args, tpu_slice = self.args, self.tpu_slice
    spec = {"topology_name": tpu_slice.topology_name,
            "chip_config_name": tpu_slice.generation.chip_config,
            "chips_per_host_bounds": list(tpu_slice.generation.host_bounds(tpu_slice.shape)),
            "wrap": list(tpu_slice.wraps), "accelerator_type": args.topology,
            "hbm_bytes": tpu_slice.generation.hbm_bytes}
    return run([args.peer_python, "benchmarks/hf_flax_bert.py",
                f"--layers={self.sizes['layers']}", f"--hidden={self.sizes['hidden']}",
                f"--heads={self.sizes['heads']}", f"--seq_len={args.seq_len}",
                f"--batch={per_chip * tpu_slice.chips}",
                f"--max_predictions={self.predictions}", "--dtype=bfloat16",
                "--attention_dropout=0", f"--remat={int(args.remat)}",
                f"--compile_for={json.dumps(spec)}"], dump_dir)

  def search(self) -> dict:
    """The largest per-chip batch that fits, each side, and every batch tried."""
    def ours_at(per_chip):
      report = self.ours(per_chip)
      held = report["per_chip_bytes"][self.key].get("total")
      print(f"  bertjax, {per_chip} a chip: {_verdict(report['fits'], held)}", flush=True)
      flops = report["flops_per_step"].get(self.key)
      return {"fits": report["fits"], "per_chip_bytes": report["per_chip_bytes"][self.key],
              "xla_hbm_limit_bytes": report.get("xla_hbm_limit_bytes"),
              **({"flops_per_chip": (flops["cost_analysis"] + flops["attention_kernels"])
                  / self.tpu_slice.chips} if flops else {}),
              **({"error": report["errors"][self.key]} if "errors" in report else {})}

    def peer_at(per_chip):
      result = self.peer(per_chip)
      if "error" in result:
        result["xla_hbm_limit_bytes"] = out_of_memory_bytes(result["error"])[1]
        result["error"] = next(line for line in result["error"].splitlines() if line.strip())
      held = result["per_chip_bytes"].get("total")
      print(f"  peer, {per_chip} a chip: {_verdict(result['fits'], held)}", flush=True)
      return result

    found = {}
    for side, compile_at in (("bertjax", ours_at), ("peer", peer_at)):
      if self.args.sides not in ("both", side):
        continue
      results = {}
      best = batch_search.largest_batch(compile_at, self.args.per_chip_batch,
                                        self.tpu_slice.generation.hbm_bytes, results,
                                        self.args.batch_step)
      found[side] = {"max_per_chip_batch": best, "trials": batch_search.trials(results)}
    return found


def _verdict(fits: bool, total: int | None) -> str:
  held = "?" if total is None else f"{total / 2**30:.2f} GiB"
  return f"fits ({held})" if fits else f"does not fit ({held})"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", choices=sorted(MODELS), default="base")
  parser.add_argument("--topology", default="v5litepod-4", help="gcloud accelerator type.")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--per_chip_batch", type=int, default=32,
                      help="Sequences a chip (with --find_max_batch, where the search begins).")
  parser.add_argument("--remat", action="store_true",
                      help="Both sides recompute each layer in the backward pass (bertjax's "
                      "model.remat_policy=full, transformers' gradient_checkpointing).")
  parser.add_argument("--find_max_batch", action="store_true",
                      help="Search each side's largest per-chip batch that fits a chip (in "
                      "steps of 8 from 8 on), instead of the figures at --per_chip_batch.")
  parser.add_argument("--batch_step", type=int, default=8,
                      help="--find_max_batch searches the multiples of this (1: the exact "
                      "largest batch, a few compiles more).")
  parser.add_argument("--bertjax_setting", action="append", default=[],
                      help="A config setting of bertjax's step (`mesh.fsdp=-1`); repeatable.")
  parser.add_argument("--sides", choices=("both", "bertjax", "peer"), default="both",
                      help="With --find_max_batch, the sides searched.")
  parser.add_argument("--top", type=int, default=0,
                      help="Also list each side's operations that read and write the most "
                      "(this many), the layers' copies of one counted together.")
  parser.add_argument("--peer_python", default="/tmp/hf4/bin/python",
                      help="The Python of the venv with transformers 4.57.6 and jax[tpu].")
  args = parser.parse_args()
  args.peer_python = os.path.abspath(args.peer_python)  # the compiles run in the checkout
  peer_needed = args.sides != "bertjax" or not args.find_max_batch
  if peer_needed and not os.path.exists(args.peer_python):
    sys.exit(f"--peer_python={args.peer_python} does not exist: make the peer's venv first "
             "(see this script's docstring)")
  for name in ("per_chip_batch", "batch_step"):
    if getattr(args, name) < 1:
      sys.exit(f"--{name}={getattr(args, name)}: give at least 1")
  from bertjax import topology
  try:
    tpu_slice = topology.parse(args.topology)
  except ValueError as e:
    sys.exit(str(e))
  sides = Sides(args, tpu_slice)
  if args.find_max_batch:
    print(f"{args.model} at {args.seq_len} tokens on {args.topology} "
          f"({tpu_slice.generation.hbm_bytes / 2**30:.2f} GiB a chip)"
          f"{', layers recomputed' if args.remat else ''}"
          f"{''.join(', ' + setting for setting in args.bertjax_setting)}: "
          "the largest batch a chip holds",
          flush=True)
    found = sides.search()
    best = {side: found[side]["max_per_chip_batch"] for side in found}
    print("largest per-chip batch: " + ", ".join(f"{side} {n}" for side, n in best.items())
          + (f" ({best['bertjax'] / best['peer']:.2f}x)" if best.get("peer") and
             "bertjax" in best else ""))
    print(json.dumps({"model": args.model, "topology": args.topology, "seq_len": args.seq_len,
                      "remat": args.remat, "bertjax_settings": args.bertjax_setting,
                      "hbm_bytes": tpu_slice.generation.hbm_bytes,
                      **found}))
    return
  chips = tpu_slice.chips

  with tempfile.TemporaryDirectory() as tmp:
    ours = sides.ours(args.per_chip_batch, os.path.join(tmp, "bertjax"))
    peer = sides.peer(args.per_chip_batch, os.path.join(tmp, "peer"))
    hlo = {side: train_step_hlo(os.path.join(tmp, side)) for side in ("bertjax", "peer")}
  parts = {side: breakdown(text) for side, text in hlo.items()}

  key = sides.key
  memory = {"bertjax": ours["per_chip_bytes"][key], "peer": peer["per_chip_bytes"]}
  flops = ours["flops_per_step"][key]
  figures = {
      "bertjax": {"arguments": memory["bertjax"]["arguments"],
                  "temporaries": memory["bertjax"]["temporaries"],
                  "total": memory["bertjax"]["total"],
                  "flops": (flops["cost_analysis"] + flops["attention_kernels"]) / chips,
                  "bytes_accessed": ours["bytes_accessed"][key]["per_chip"],
                  "compile_s": ours["compile_s"][key]},
      "peer": {"arguments": memory["peer"]["arguments"],
               "temporaries": memory["peer"]["temporaries"], "total": memory["peer"]["total"],
               "flops": peer["flops_per_chip"], "bytes_accessed": peer["bytes_accessed_per_chip"],
               "compile_s": peer["compile_s"]},
  }
  print(f"{args.model} at {args.seq_len} tokens, {args.per_chip_batch} sequences a chip, "
        f"{args.topology} ({chips} chips, {ours['device_kind']}); per chip:")
  print(f"{'':28s}{'bertjax':>12s}{'peer':>12s}{'ratio':>8s}")
  units = {"arguments": ("GiB", 2**30), "temporaries": ("GiB", 2**30), "total": ("GiB", 2**30),
           "flops": ("TFLOP", 1e12), "bytes_accessed": ("GB", 1e9), "compile_s": ("s", 1)}
  for name, (unit, scale) in units.items():
    a, b = figures["bertjax"][name], figures["peer"][name]
    print(f"{name + ' (' + unit + ')':28s}{a / scale:12.2f}{b / scale:12.2f}{a / b:7.2f}x")
  print("\nGB by part, forward / backward / outside the model (operands + results of each "
        "operation):")
  names = sorted({p for side in parts.values() for p in side})
  passes = ("forward", "backward", "outside the model")
  for part in names:
    if all(sum(parts[side].get(part, {}).values()) < 0.005 for side in parts):
      continue  # a part the compiler fused away in both programs
    cells = []
    for side in ("bertjax", "peer"):
      values = parts[side].get(part, {})
      cells.append(" / ".join(f"{values.get(p, 0.0):5.2f}" for p in passes))
    print(f"  {part:24s} bertjax {cells[0]}   peer {cells[1]}")
  totals = {side: sum(sum(v.values()) for v in parts[side].values()) for side in parts}
  print(f"  {'sum':24s} bertjax {totals['bertjax']:.2f}   peer {totals['peer']:.2f} "
        f"(XLA: {figures['bertjax']['bytes_accessed'] / 1e9:.2f} / "
        f"{figures['peer']['bytes_accessed'] / 1e9:.2f})")
  largest = {side: largest_operations(text, args.top) for side, text in hlo.items()}
  for side in ("bertjax", "peer") if args.top else ():
    print(f"\n{side}: the {args.top} operations that read and write the most (GB, copies):")
    for what, copies, gb in largest[side]:
      print(f"  {gb:6.2f} {copies:4d}  {what[:150]}")
  print(json.dumps({"model": args.model, "topology": args.topology, "seq_len": args.seq_len,
                    "per_chip_batch": args.per_chip_batch, "figures": figures,
                    **({"largest_operations": largest} if args.top else {}),
                    "gb_by_part": parts, "peer": peer["implementation"]}))


if __name__ == "__main__":
  # Ctrl-C, SIGTERM or SIGHUP: the running compile is killed (subprocess.run
  # kills its child on the way out), and the script ends in one line.
  usage.stop_as_ctrl_c()
  usage.run(main, "nothing was written, and the compile running was stopped")
