r"""ModernBERT pre-training (Warner et al., 2024), base by default.

  python -m bertjax.main --config=configs/modernbert_pretrain.py --workdir=gs://BUCKET/mb \
      --config.data.dir=gs://BUCKET/data/web

`--config=configs/modernbert_pretrain.py:large` for ModernBERT-large. The
recipe of ModernBERT's own training configs, in steps of the same tokens:
- masked LM alone, each token masked independently at 30% (80/10/10; [CLS]
  and [SEP] too: `data.masking="modernbert"`), evaluated at 15%; no
  next-sentence prediction and no token types;
- one sequence a document, its first tokens, the rest left out
  (`data.truncate_documents`), none made shorter at random
  (`data.short_seq_prob=0`; BERT's 10% is the paper's); rows packed with
  as many documents' sequences as fit, which do not attend to each other
  (`objective="mlm"`, `data.max_sequences_per_row=256`), as its unpadded
  packing;
- 1,024 tokens with a rotary base of 10,000 in every layer, then context
  extension to 8,192 tokens with the global layers' base raised to 160,000
  (`train.long_model`) and a lower plateau, then a 1-sqrt decay to 0.1% of
  it: warmup-stable-decay (`optimizer.schedule="wsd"`);
- StableAdamW (update clipping instead of gradient clipping), betas 0.9 and
  0.98, epsilon 1e-6, fully decoupled weight decay 1e-5 off biases and norms;
- a batch-size warmup, 768 to 3,840 sequences in steps of 768 over the
  first 50B tokens, then 4,608 (`train.batch_ramp_start`,
  `train.batch_ramp_steps`);
- dropout 0.1 on the attention output only; none on the embeddings, the
  attention probabilities (so "auto" runs the fused kernels) or the
  feed-forward;
- bfloat16 matmuls with the residual stream in float32
  (`model.residual_dtype`), as its autocast mixed precision.
Base: 4,608 sequences of 1,024 tokens a step (4.7M tokens), lr 8e-4 after a
3B-token warmup, 1.719T tokens; then 576 sequences of 8,192 (the same tokens
a step) at 3e-4 for 250B tokens and a 50B-token decay. Large: 4,928 / 616
sequences, lr 5e-4 for 900B tokens, then 5e-5 with weight decay 1e-6
(`optimizer.restarts`, its restart), 2B tokens of warmup. docs/modernbert.md
says where bertjax differs from ModernBERT's code.
"""

from bertjax.configs import common
from bertjax.phases import Phase


def _steps(tokens: float, sequences: int, length: int) -> int:
  return round(tokens / (sequences * length))


def _ramped_steps(tokens: float, start: int, batch: int, ramp_steps: int, length: int) -> int:
  """Steps to train `tokens` tokens when the batch grows from `start` in
  steps of it over `ramp_steps` steps, then is `batch` (as the trainer does)."""
  ramp = Phase(0, 0, ramp_steps, length, 0, batch, ramp_start=start, ramp_steps=ramp_steps)
  done = steps = 0
  while done < tokens and steps < ramp_steps:
    done += ramp.parts(steps) * start * length
    steps += 1
  return steps + max(0, -int((done - tokens) // (batch * length)))


def get_config(arg: str | None = None):
  size = common.choose(arg or "base", ("base", "large"), "configs/modernbert_pretrain.py",
                       "the model size")
  config = common.pretrain_config(f"modernbert_{size}")
  config.objective = "mlm"
  config.model.vocab_pad_multiple = 64  # 50,368 words = 787 x 64: whole tiles already
  config.model.global_rope_theta = 10_000.0   # 160,000 from the context extension on
  config.model.attention_output_dropout_prob = 0.1
  # bfloat16 matmuls, the residual stream in float32: PyTorch's autocast,
  # ModernBERT's mixed precision.
  config.model.residual_dtype = "float32"
  config.data.vocab_size = 50368
  config.data.masked_lm_prob = 0.3
  config.data.masking = "modernbert"  # each token at 30%, [CLS] and [SEP] too
  config.eval.masked_lm_prob = 0.15  # ModernBERT evaluates at 15%
  config.data.short_seq_prob = 0.0  # every sequence as long as its document allows
  config.data.truncate_documents = True  # one sequence a document, its first tokens
  # Packed rows (train.batch_size counts rows): ModernBERT trains on unpadded
  # micro-batches of whole documents that do not see each other, as many as
  # fit. A row of 8,192 tokens holds a dozen web pages on average, and a cap
  # of 8 would leave about half of it padding; 256 leaves well under 1% at
  # both lengths (docs/benchmarks.md). Masked LM keeps nothing per sequence.
  config.data.max_sequences_per_row = 256

  batch, long_batch = (4608, 576) if size == "base" else (4928, 616)
  extension_steps = _steps(250e9, long_batch, 8192)
  decay_steps = _steps(50e9, long_batch, 8192)
  config.train.batch_size = batch
  # Batch-size warmup, as ModernBERT's packer: 768, 1,536, ... 3,840
  # sequences over the first 50B tokens (large: 448 to 4,480 over 10B), each
  # size for an equal run of steps, then the whole batch. The sizes' mean is
  # half the batch, so those tokens take this many steps.
  ramp_start, ramp_tokens = (768, 50e9) if size == "base" else (448, 10e9)
  ramp_steps = _steps(ramp_tokens, batch // 2, 1024)
  config.train.batch_ramp_start = ramp_start
  config.train.batch_ramp_steps = ramp_steps
  # 1.719T tokens at 1,024, the warmup's steps carrying fewer.
  short_steps = _ramped_steps(1.719e12, ramp_start, batch, ramp_steps, 1024)
  config.train.max_seq_length = 1024
  config.train.max_predictions = 381      # 30% of 1,024 and five standard deviations
  config.train.long_from_step = short_steps
  config.train.long_seq_length = 8192
  config.train.long_max_predictions = 2665  # 30% of 8,192 and five standard deviations
  config.train.long_batch_size = long_batch
  config.train.long_model = {"global_rope_theta": 160_000.0}
  config.train.total_steps = short_steps + extension_steps + decay_steps

  config.optimizer.name = "stableadamw"
  config.optimizer.learning_rate = 8e-4 if size == "base" else 5e-4
  config.optimizer.long_learning_rate = 3e-4 if size == "base" else 5e-5
  config.optimizer.warmup_steps = _ramped_steps(3e9 if size == "base" else 2e9, ramp_start,
                                               batch, ramp_steps, 1024)
  if size == "large":
    # ModernBERT-large's restart: its loss stalled at 5e-4, so its run went
    # back to 900B tokens and went on at 5e-5 with a weight decay of 1e-6
    # (`restart_override`: the moments kept), which the later phases keep.
    restart = _ramped_steps(900e9, ramp_start, batch, ramp_steps, 1024)
    config.optimizer.restarts = ((restart, 5e-5, 1e-6),)
  config.optimizer.schedule = "wsd"
  config.optimizer.decay_steps = decay_steps
  config.optimizer.decay_shape = "1-sqrt"
  config.optimizer.final_fraction = 0.001
  config.optimizer.weight_decay = 1e-5
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.98
  config.optimizer.eps = 1e-6
  config.optimizer.max_grad_norm = 0.0    # StableAdamW clips its updates instead
  config.optimizer.bias_correction = False  # StableAdamW debiases its betas itself

  config.checkpoint.every_steps = 2_000
  config.eval.every_steps = 2_000
  return config
