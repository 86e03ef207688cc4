r"""BERT-base pre-training, the paper's recipe.

  python -m bertjax.main --config=configs/base_pretrain.py --workdir=gs://BUCKET/base \
      --config.data.dir=gs://BUCKET/data/wiki

Arguments after a colon (comma-separated): `no_nsp`, `ltr` (the paper's
ablations; `no_nsp_packed`: No NSP on packed text), `static` (masked once, as
the original), `lamb` (large batch), `size=<preset>` (another size, e.g.
`size=table6_L6_H768_A12`): `--config=configs/base_pretrain.py:no_nsp`.
Batch 256, 1M steps (128 tokens for 90%, then 512), AdamW lr 1e-4 with 10k
warmup steps and linear decay (Adam without bias correction, as the original),
weight decay 0.01, dropout 0.1, GELU (the original's tanh form).
"""

from bertjax.configs import common


def get_config(arg: str | None = None):
  config = common.pretrain_config("bert_base")
  common.apply_options(config, common.parse_arg(arg))
  return config
