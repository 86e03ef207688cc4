r"""Fine-tuning on a GLUE task: the paper's section 4.1.

  python -m bertjax.main --config=configs/glue.py:mrpc --workdir=/tmp/mrpc \
      --config.init_checkpoint=uncased_L-12_H-768_A-12 --config.data.dir=glue_data/MRPC

The argument is the task: cola, sst2, mrpc, stsb, qqp, mnli (also predicts the
AX diagnostic set), qnli, rte, wnli. `data.dir` holds the task's TSV files as
GLUE's download script writes them; `--config.data.source=tfds` reads TFDS
`glue/<task>` instead (`data.dir` is then the TFDS data_dir, or empty for the
default). `init_checkpoint` is a bertjax pre-training workdir, a bertjax model
directory, a Hugging Face or a Google TF BERT directory.
"""

from bertjax.data.glue import TASKS
from bertjax.configs import common


def get_config(arg: str | None = None):
  config = common.finetune_config("glue")
  # The GLUE task: the config's argument.
  config.data.task = common.choose(arg, TASKS, "configs/glue.py", "a GLUE task")
  config.data.tfds_name = ""  # with data.source="tfds": default glue/<task>
  # Several examples a row (the batch stays 32 examples): the same function of
  # each example, with less padding computed (bertjax.data.example_packing).
  config.data.pack_examples = True
  return common.locked(config)
