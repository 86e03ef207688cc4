r"""The ModernBERT demo: a tiny ModernBERT pre-trained on an offline corpus,
with its own byte-level BPE, in minutes on a CPU.

  python -m bertjax.main --config=configs/modernbert_demo.py --workdir=/tmp/mbdemo

The recipe of configs/modernbert_pretrain.py at demo size: the first run
trains an 8k byte-level BPE (cased, as ModernBERT's tokenizer) on the
standard library's docstrings (`demo:stdlib`) and prepares the shards in the
workdir; then L4/H128/A2 (a global layer, two local ones attending 32 tokens
either side, a global one) at length 128 learns masked LM alone, each token
masked at 30% (held-out documents at 15%), in rows of up to 4 sequences
(all of each document's text, not its first 128 tokens alone as the recipe
takes from a web-scale corpus), with StableAdamW, a batch-size warmup (8, 16,
24 rows, then 32) and a warmup-stable-decay schedule. No dropout (a model this small underfits).
Held-out masked-LM accuracy is logged every 500 steps; measured figures are in
docs/benchmarks.md. `--config.train.total_steps=N` shortens the run (with
`--config.train.batch_ramp_steps` at most N and `--config.optimizer.decay_steps`
at most N minus the warmup: a run too short for them is refused in one line
with values that fit).
"""

from bertjax import errors
from bertjax.configs import modernbert_pretrain


def get_config(arg: str | None = None):
  if arg:
    raise errors.UsageError(f"configs/modernbert_demo.py takes no argument, got {arg!r}; "
                            "change its settings with --config.FIELD=VALUE")
  config = modernbert_pretrain.get_config()
  model = dict(vocab_size=8000, vocab_pad_multiple=64, num_layers=4, hidden_size=128,
               num_heads=2, intermediate_size=192, max_position_embeddings=128,
               local_attention=64, global_rope_theta=10_000.0, dtype="float32",
               scan_layers=False, attention_output_dropout_prob=0.0)
  config.model.update(model)
  config.data.build_from = "demo:stdlib"
  config.data.tokenizer = "bpe"
  config.data.vocab_size = 8000
  config.data.eval_percent = 5.0
  config.data.shuffle_window = 1000
  config.data.max_sequences_per_row = 4
  # The demo corpus is 631 documents: one sequence each would leave out four
  # fifths of its text, so long documents go on in further sequences here.
  config.data.truncate_documents = False
  config.train.batch_size = 32
  config.train.batch_ramp_start = 8
  config.train.batch_ramp_steps = 300
  config.train.total_steps = 2000
  config.train.max_seq_length = 128
  config.train.max_predictions = 65   # 30% of 128 and five standard deviations
  config.train.long_from_step = -1    # one phase
  config.optimizer.learning_rate = 2e-3
  config.optimizer.long_learning_rate = -1.0
  config.optimizer.warmup_steps = 300
  config.optimizer.decay_steps = 400
  config.checkpoint.every_steps = 500
  config.eval.every_steps = 500
  config.eval.batches = 20
  config.eval.batch_size = 64
  config.log_every_steps = 100
  return config
