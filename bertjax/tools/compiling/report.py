"""The compile tool's report: every step of a config compiled for a slice.

`run` compiles each phase's training and evaluation steps (`compiler`),
prints a line for each (`summary_line`) and gathers the JSON report
docs/tpu.md defines; with `find_max_batch`, it searches the largest batch a
chip holds in each phase and the fewest accumulation steps with which the
configured batch fits, checking them by compiling.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from absl import logging

from bertjax import errors
from bertjax import phases as phase_lib
from bertjax.tasks import pretrain_checks
from bertjax.tools.compiling.real_work import RealWork
from bertjax.tools.compiling.compiler import Compiler, make_target


def _phase_programs(config) -> list[tuple[str, Any]]:
  """(name, phase) of each distinct program: `128`, `512` (`512_80` where two
  phases share a length)."""
  phases = phase_lib.phases(config)
  lengths = [phase.max_seq_length for phase in phases]
  programs = {(f"{phase.max_seq_length}" if lengths.count(phase.max_seq_length) == 1 else
               f"{phase.max_seq_length}_{phase.max_predictions}"): phase for phase in phases}
  return list(programs.items())


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
  if min(max_per_chip) < 1:
    return None

  def warmup_divides(steps: int) -> bool:
    try:
      for phase in phases:
        if phase.ramp_steps:
          pretrain_checks.check_ramp(phase, steps, data_shards, processes)
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
        report.setdefault("bytes_accessed", {})[key] = result["bytes_accessed"]
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


def verdict(report: dict[str, Any], model: str) -> str:
  """The tool's last word: whether `model` (`EncoderConfig.describe`) fits the
  slice, by its largest step's memory a chip against a chip's HBM."""
  gib = lambda n: f"{n / 2**30:.2f} GiB"
  totals = {key: memory.get("total") for key, memory in report["per_chip_bytes"].items()}
  largest = max((key for key in totals if totals[key] is not None),
                key=lambda key: totals[key], default=None)
  used = "no step's memory is known" if largest is None else (
      f"{largest} uses {gib(totals[largest])} a chip of its {gib(report['hbm_bytes'])}")
  if report["fits"]:
    return f"Fits: {model} on {report['topology']}, at most {used}"
  limit = report.get("xla_hbm_limit_bytes")
  return (f"Does not fit: {model} on {report['topology']}: {used}"
          + (f" (XLA can use {gib(limit)})" if limit else "")
          + ("" if "accumulation_to_fit" in report
             else "; --find_max_batch finds the accumulation that fits"))


def summary_line(key: str, result: dict[str, Any], report: dict[str, Any]) -> str:
  """The line printed for a compiled step: its memory, FLOPs and collectives."""
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
  if "bytes_accessed" in result:
    accessed = result["bytes_accessed"]
    line += (f"; {accessed['per_chip'] / 1e9:.2f} GB accessed a chip"
             + (" (a loop's body once)" if accessed["loop_bodies_counted_once"] else ""))
  if "collectives" in result:
    line += "".join(f"; {kind} {c['count']}x {c['bytes'] / 2**20:.1f} MiB"
                    for kind, c in result["collectives"].items() if c["count"])
  return line
