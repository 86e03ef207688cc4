r"""Runs a bertjax job: `python -m bertjax.main --config=CONFIG --workdir=DIR`.

  python -m bertjax.main --config=configs/demo.py --workdir=/tmp/demo
  python -m bertjax.main --config=configs/large_pretrain.py --workdir=gs://bucket/run \
      --config.data.dir=gs://bucket/data/wiki --config.train.batch_size=512
  python -m bertjax.main --config=configs/glue.py:mrpc --workdir=/tmp/mrpc \
      --config.init_checkpoint=uncased_L-12_H-768_A-12 --config.data.dir=glue_data/MRPC

Configs (each file's docstring is its command; docs/configs.md lists them all):
  configs/demo.py                  a tiny BERT pre-trained on an offline corpus, on a CPU
  configs/demo_finetune.py         the demo's model fine-tuned on an offline task
  configs/base_pretrain.py         BERT-base, the paper's recipe; :no_nsp :ltr :static :lamb
  configs/large_pretrain.py        BERT-large; :size=<preset> for the other sizes
  configs/glue.py:<task>           cola sst2 mrpc stsb qqp mnli qnli rte wnli
  configs/squad.py:<version>       v1.1 or v2.0
  configs/swag.py, configs/ner.py  SWAG, CoNLL-2003 NER
  configs/ner_features.py:<row>    the feature-based approach (Table 7)
  configs/modernbert_demo.py       a tiny ModernBERT with its own BPE, on a CPU
  configs/modernbert_pretrain.py   ModernBERT's recipe; :large for ModernBERT-large
Any config field is a flag: --config.train.batch_size=512, --config.mesh.fsdp=4.

Run the same command on every host of a TPU pod slice; `jax.distributed` finds
the others itself there (elsewhere pass --coordinator_address, --num_processes
and --process_id). Rerunning a pre-training command resumes from the last
checkpoint in its workdir (docs/checkpoints.md).
"""

from absl import flags, logging
from ml_collections import config_flags

from bertjax import outage, paths, platforms, preemption, signals, tasks, usage

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's config file, e.g. "
                                          "configs/demo.py (--help lists the shipped ones); "
                                          "`path.py:arg` passes an argument to its "
                                          "get_config(arg).", lock_config=True)
_WORKDIR = paths.DEFINE_path("workdir", None, "Checkpoints, metrics and the resolved config "
                             "go here (local or gs://; one run at a time).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 (not needed on TPU pods).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() "
                                 "with its cluster auto-detection (automatic on Cloud TPU VMs).")
_INITIALIZATION_TIMEOUT_S = flags.DEFINE_integer(
    "initialization_timeout_s", 300, "Seconds jax.distributed waits for every process to "
    "join (launch/worker.sh gives a resumed run longer: a host restarting takes minutes).")
_GRACE_SECONDS = flags.DEFINE_float(
    "grace_seconds", 30.0, "Seconds this machine gives after SIGTERM before it kills the run "
    "(Compute Engine: 30; GKE spot pods: 15, see docs/tpu.md): a preempted run saves only "
    "when its measured saves fit in what is left, else it exits at once.", lower_bound=0)
_STORAGE_WAIT_S = flags.DEFINE_float(
    "storage_wait_s", 900.0, "Seconds a run waits for storage that does not answer (taking "
    "the workdir's lock, saving a checkpoint) before it exits 42, which supervisors restart "
    "on; counted after the storage client's own retries (about 30 s a request).",
    lower_bound=0)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv  # settings go in --config.<field>=<value>
  preemption.GRACE_S, outage.WAIT_S = _GRACE_SECONDS.value, _STORAGE_WAIT_S.value
  # Here, not above: --help and a flag mistake answer without JAX's start. (A
  # signal inside its extensions' start can crash Python: held until it is done.)
  jax = usage.import_held("jax")

  # (JAX's preemption notifier installs a SIGTERM handler that training calls.)
  with signals.installing_jax_sigterm():
    if _COORDINATOR.value or _NUM_PROCESSES.value:
      jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                 initialization_timeout=_INITIALIZATION_TIMEOUT_S.value)
    elif _DISTRIBUTED.value or platforms.tpu_chips_here():
      # Finds the other hosts of a pod slice (or cluster) itself.
      jax.distributed.initialize(initialization_timeout=_INITIALIZATION_TIMEOUT_S.value)
  logging.info("Process %d of %d, %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())

  tasks.run(_CONFIG.value, _WORKDIR.value)


def run() -> None:
  """The command line (as every bertjax command: `bertjax.usage`)."""
  usage.run_main(main, interrupted=lambda: tasks.interrupted(_CONFIG.value.task))


if __name__ == "__main__":
  run()
