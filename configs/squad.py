r"""Fine-tuning on SQuAD v1.1 or v2.0: the paper's sections 4.2 and 4.3.

  python -m bertjax.main --config=configs/squad.py:v1.1 --workdir=/tmp/squad11 \
      --config.init_checkpoint=uncased_L-12_H-768_A-12 \
      --config.data.train_file=train-v1.1.json --config.data.predict_file=dev-v1.1.json
  python -m bertjax.main --config=configs/squad.py:v2.0 --workdir=/tmp/squad20 \
      --config.init_checkpoint=uncased_L-24_H-1024_A-16 \
      --config.data.train_file=train-v2.0.json --config.data.predict_file=dev-v2.0.json

v1.1: 3 epochs, learning rate 5e-5, batch 32 (the paper's). v2.0: 2 epochs,
5e-5, batch 48; the null threshold is tuned on the dev file. Score the written
predictions with `python -m bertjax.tools.evaluate_squad`. Without a
`train_file` the model in `init_checkpoint` only predicts (a fine-tuned v2.0
model brings its threshold).
"""

from ml_collections import config_dict

from bertjax.configs import common

VERSIONS = ("v1.1", "v2.0")


def get_config(arg: str | None = None):
  config = common.finetune_config("squad")
  # The SQuAD version: the config's argument.
  config.data.version = common.choose(arg, VERSIONS, "configs/squad.py", "the SQuAD version")
  config.data.source = "json"    # or "tfds": the *_file fields are then TFDS splits
  config.data.tfds_name = ""     # default squad/<version>; data.dir is the TFDS data_dir
  config.data.train_file = ""    # the training file (SQuAD JSON)
  config.data.predict_file = ""  # the dev file: predicted and scored
  config.data.test_file = ""     # predicted only
  config.max_seq_length = 384
  config.doc_stride = 128        # tokens between the starts of a context's windows
  config.max_query_length = 64   # question tokens kept
  config.n_best_size = 20        # start and end candidates a window
  config.max_answer_length = 30  # tokens an answer may span
  # v2.0: answer null when s_null - best span score > this. Unset: tuned on the
  # dev file after training (or with tune_null_threshold), else the model's
  # stored value, else 0. A value given here is used as it is.
  config.null_score_diff_threshold = config_dict.placeholder(float)
  config.tune_null_threshold = False  # v2.0: tune it on the dev file even when the model has one
  # Table 5's "+ BiLSTM": a randomly initialised BiLSTM between the encoder and
  # the span layer (the paper adds it to the LTR model).
  config.model.span_bilstm = False
  config.train.learning_rate = 5e-5
  if arg == "v2.0":
    config.train.batch_size = 48
    config.train.epochs = 2.0
  return common.locked(config)
