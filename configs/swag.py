r"""Fine-tuning on SWAG: the paper's section 4.4 (3 epochs, learning rate 2e-5, batch 16).

  python -m bertjax.main --config=configs/swag.py --workdir=/tmp/swag \
      --config.init_checkpoint=uncased_L-24_H-1024_A-16 --config.data.dir=swagaf/data

`data.dir` holds SWAG's `train.csv`, `val.csv` and optionally `test.csv`.
"""

from bertjax.configs import common


def get_config(arg: str | None = None):
  del arg  # no variants
  config = common.finetune_config("swag")
  config.train.learning_rate = 2e-5
  config.train.batch_size = 16
  config.train.eval_batch_size = 16
  # Each ending's sequence packed with others, a row holding several (the batch
  # stays 16 examples): the same scores (bertjax.data.example_packing).
  config.data.pack_examples = True
  return common.locked(config)
