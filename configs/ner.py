r"""Fine-tuning on CoNLL-2003 NER: the paper's section 5.3.

  python -m bertjax.main --config=configs/ner.py --workdir=/tmp/ner \
      --config.init_checkpoint=cased_L-12_H-768_A-12 --config.data.dir=conll2003

`data.dir` holds the shared task's files (`eng.train`, `eng.testa`,
`eng.testb`; set `data.train_file` and friends for `train.txt`, `valid.txt`,
`test.txt` copies). Use a cased checkpoint, as the paper does. The paper's
Appendix A.3 search space applies (batch 16 or 32, learning rate 5e-5 to 2e-5,
2-4 epochs); the defaults are batch 32, 3 epochs, 5e-5.
"""

from bertjax.configs import common


def get_config(arg: str | None = None):
  del arg  # no variants
  config = common.finetune_config("ner")
  config.data.source = "files"     # or "tfds": the *_file fields are then TFDS splits
  config.data.tfds_name = "conll2003"  # with data.source="tfds"
  config.data.train_file = "eng.train"  # CoNLL-2003's files in data.dir
  config.data.dev_file = "eng.testa"   # evaluated during and after training
  config.data.test_file = "eng.testb"  # predicted and scored at the end
  config.document_context = True  # the neighbouring sentences of the document as context
  # Several sentences a row where they leave room (without document context):
  # the same function of each, with less padding (bertjax.data.example_packing).
  config.data.pack_examples = True
  config.train.learning_rate = 5e-5
  return common.locked(config)
