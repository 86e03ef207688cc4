r"""A config of your own, kept beside your data: BERT-base on your prepared
Wikipedia, starting from the shipped recipe (docs/configs.md).

  python -m bertjax.main --config=docs/examples/wiki_base.py --workdir=runs/wiki_base
  python -m bertjax.main --config=docs/examples/wiki_base.py:no_nsp --workdir=runs/no_nsp

Copy it anywhere: it imports the shipped configs from the installed package,
so it loads from any directory. Relative paths in it, like those on the
command line, are taken from the directory you run the command in.
"""

from bertjax.configs import base_pretrain


def get_config(arg: str | None = None):
  config = base_pretrain.get_config(arg)  # the paper's recipe and its options (:no_nsp, ...)
  config.data.dir = "data/wiki"           # made by bertjax.tools.prepare_pretraining_data
  config.train.batch_size = 512
  config.checkpoint.every_steps = 5_000
  return config
