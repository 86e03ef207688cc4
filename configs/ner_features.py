r"""The feature-based approach on CoNLL-2003 NER: the paper's Table 7.

  python -m bertjax.main --config=configs/ner_features.py:concat_last_four \
      --workdir=/tmp/ner_concat --config.init_checkpoint=cased_L-12_H-768_A-12 \
      --config.data.dir=conll2003

The argument is Table 7's row: embeddings, second_to_last, last,
weighted_sum_last_four, concat_last_four (the paper's best), weighted_sum_all.
BERT stays frozen; its activations feed a two-layer 768-unit BiLSTM and a
classifier. The BiLSTM's optimiser settings are not in the paper; these
defaults (Adam 1e-3 decaying linearly, batch 32 sentences, 5 epochs, dropout
0.1) are a starting point.
"""

from bertjax.tasks.features import VARIANTS
from bertjax.configs import common


def get_config(arg: str | None = None):
  config = common.finetune_config("ner_features")
  # Table 7's row: the config's argument.
  config.variant = common.choose(arg, VARIANTS, "configs/ner_features.py", "a Table 7 variant")
  config.data.source = "files"     # or "tfds": the *_file fields are then TFDS splits
  config.data.tfds_name = "conll2003"  # with data.source="tfds"
  config.data.train_file = "eng.train"  # CoNLL-2003's files in data.dir
  config.data.dev_file = "eng.testa"   # evaluated during and after training
  config.data.test_file = "eng.testb"  # predicted and scored at the end
  config.document_context = True  # the neighbouring sentences of the document as context
  config.extract_batch_size = 64  # sentences a batch while the activations are taken
  config.model.dtype = "float32"   # the stored activations are float16 either way
  # The BiLSTM over the frozen activations: its units each way, layers and dropout.
  config.lstm = dict(hidden_size=768, num_layers=2, dropout_rate=0.1)
  config.train.learning_rate = 1e-3
  config.train.epochs = 5
  config.log_every_steps = 100
  # Fine-tuning settings that do not apply to a frozen encoder and an LSTM.
  for name in ("warmup_proportion", "weight_decay", "eps", "bias_correction",
               "eval_batch_size"):
    del config.train[name]
  del config.model.hidden_dropout_prob, config.model.attention_dropout_prob
  return common.locked(config)
