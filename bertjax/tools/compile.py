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

Prints a line per compiled step, then, as the last line of stdout, one JSON
object, and last a one-line verdict on stderr: "Fits: BERT large (L24/H1024/A16,
336.3M parameters) on v4-32, at most train_512 uses 18.76 GiB a chip of its
32.00 GiB" (or "Does not fit: ..."). The JSON:
`topology`, `chips`, `hosts`, `mesh`, `hbm_bytes` (a chip's), `per_chip_bytes`
(arguments, outputs, aliased, temporaries, generated code and their total,
per step), `fits`, `flops_per_step` (for all chips: `matmuls`, the step's
matrix products traced, every loop iteration and the attention kernels'
blocks counted; `model`, `bertjax.flops`' count of full rows; with
`--padding` or `--data_dir`, `model_real`, that of the real tokens; XLA's
`cost_analysis` of the compiled step, which counts a loop's body once),
`bytes_accessed` (XLA's count of the bytes a chip's operations read and
write, per step and per token), `collectives` (count and bytes a chip of
each kind the compiled step runs, loops unrolled) and, with
`--find_max_batch`, the largest per-chip batch of each phase that fits and the fewest accumulation steps with which the
configured batch fits (checked by compiling them). docs/tpu.md defines
every field. It gives no step time: XLA's estimate of one is not usable
(docs/tpu.md#what-it-does-not-tell).
Exit status: 0 when every step fits, 1 when one does not, 2 for a setting to
change (said in one line). See docs/tpu.md.

The command line is here; `bertjax.tools.compiling` does the work: `report`
runs the compiles and writes the report, `compiler` compiles each step on the
slice's mesh, `program` reads a compiled step's memory and collectives, and
`jaxpr_flops` counts the matrix products it computes.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags
from ml_collections import config_flags

from bertjax import paths, platforms, usage

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


def main(argv):
  del argv
  if not platforms.tpu_chips_here():
    # libtpu describes "this host" before any topology; off a TPU VM, these
    # spare it a metadata server it cannot reach and the errors it prints.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", _TOPOLOGY.value)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  import jax  # here, not above: --help and a flag mistake answer without JAX's start

  # The chips are libtpu's description of the slice: never claim a local TPU
  # (a run may be using it) or wait for one, and let other processes load
  # libtpu meanwhile (it takes a lock for the chips otherwise).
  jax.config.update("jax_platforms", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from bertjax.tools.compiling import report as compile_report  # after the two settings above
  from bertjax.models import EncoderConfig
  from bertjax.tools.compiling.real_work import RealWork

  config = _CONFIG.value
  real_work = None
  if _PADDING.value is not None:
    real_work = lambda: RealWork.given(config, _PADDING.value)
  elif _DATA_DIR.value:
    real_work = lambda: RealWork.measured(config, _DATA_DIR.value, _DATA_BATCHES.value)
  report = compile_report.run(config, _TOPOLOGY.value, _NUM_SLICES.value, _FIND_MAX_BATCH.value,
                              _EVAL.value, real_work)
  print(json.dumps(report), flush=True)
  # The verdict last, for the eye (stdout's last line stays the JSON, for scripts).
  model = EncoderConfig.from_run_config(config).describe(report["model"]["parameters"])
  print(compile_report.verdict(report, model), file=sys.stderr, flush=True)
  sys.exit(0 if report["fits"] else 1)


if __name__ == "__main__":
  usage.run_main(main)
