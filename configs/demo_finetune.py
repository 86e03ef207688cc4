r"""Fine-tuning the demo's model on an offline task, in under a minute on a CPU.

  python -m bertjax.main --config=configs/demo_finetune.py \
      --config.init_checkpoint=/tmp/demo --workdir=/tmp/demo_topics

The task (`bertjax.data.stdlib_topics`) is sentence classification on the
demo corpus's own text: which of seven areas of the standard library
(internet, concurrency, text, files, numbers, development, gui) a docstring
sentence documents, about 9,800 training and 1,400 dev sentences; always
guessing the commonest area scores 29.0% on dev. The run is GLUE's
(configs/glue.py) with a recipe for a model of the demo's size: the paper's
2e-5 suits BERT-base and -large, while a 2-layer, 128-wide model learns far
less at it. The learning rate and epochs below were chosen with the
paper's sweep (docs/finetuning.md shows it); its figures are in
docs/benchmarks.md.
"""

from bertjax import errors
from bertjax.configs import common


def get_config(arg: str | None = None):
  if arg:
    raise errors.UsageError(f"configs/demo_finetune.py takes no argument, got {arg!r}; "
                            "change its settings with --config.FIELD=VALUE")
  config = common.finetune_config("glue")
  config.data.source = "demo"          # the task built from the standard library, offline
  config.data.task = "stdlib_topics"   # the demo's only task
  config.data.tfds_name = ""           # unused: the task is not read from TFDS
  config.data.pack_examples = True     # several sentences a row, less padding computed
  config.max_seq_length = 128          # the demo model's positions; longer sentences are cut
  config.model.dtype = "float32"       # CPUs are slow in bfloat16
  config.train.learning_rate = 3e-4    # chosen by the sweep (docs/finetuning.md)
  config.train.epochs = 3.0
  config.log_every_steps = 100
  return common.locked(config)
