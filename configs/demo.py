r"""The demo: a tiny BERT pre-trained on an offline corpus, in minutes on a CPU.

  python -m bertjax.main --config=configs/demo.py --workdir=/tmp/demo

The corpus is the standard library's docstrings (`demo:stdlib`); the first run
trains an 8k WordPiece vocabulary and prepares the shards in the workdir. The
model is L2/H128/A2 at length 128 (segments long enough for next-sentence
prediction to have something to go on), without dropout (a model this small
underfits; the paper's 0.1 is for BERT-base and -large). MLM and NSP accuracy
on held-out documents are logged every 500 steps; a quiet 2-core CPU runs
270-300 sequences/s (about 6 minutes in all); measured figures are in
docs/benchmarks.md. configs/demo_finetune.py fine-tunes the result offline.
`--config=configs/demo.py:no_nsp` and `:ltr` run the ablations;
`--config.train.total_steps=N` shortens the run (above its 300 warmup steps,
or with `--config.optimizer.warmup_steps` lowered too: a run too short for
its warmup is refused with a value that fits).
"""

from bertjax.configs import common


def get_config(arg: str | None = None):
  config = common.pretrain_config("bert_tiny")
  config.model.vocab_size = 8000
  config.model.max_position_embeddings = 128
  config.model.dtype = "float32"      # CPUs are slow in bfloat16
  config.model.scan_layers = False
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_dropout_prob = 0.0
  config.data.build_from = "demo:stdlib"
  config.data.vocab_size = 8000
  config.data.eval_percent = 5.0
  # Shuffled in windows of 1,000 instances, not the paper configs' 50,000: a
  # start or a restore fills its window first, in time proportional to its
  # size (docs/benchmarks.md#shuffle-window-and-batch-independence), and the
  # demo's short documents mix well enough.
  config.data.shuffle_window = 1000
  config.train.batch_size = 32
  config.train.total_steps = 3000
  config.train.max_seq_length = 128
  config.train.max_predictions = 20
  config.train.long_from_step = -1    # one phase
  config.optimizer.learning_rate = 1e-3
  config.optimizer.warmup_steps = 300
  config.checkpoint.every_steps = 500
  config.eval.every_steps = 500
  config.eval.batches = 20
  config.eval.batch_size = 64
  config.log_every_steps = 100
  common.apply_options(config, common.parse_arg(arg))
  return config
