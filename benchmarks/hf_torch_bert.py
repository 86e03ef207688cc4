r"""The same pre-training step with transformers' PyTorch BERT, as a baseline.

transformers dropped its Flax models in v5; its PyTorch `BertForPreTraining`
is what people compare with now. On a CPU, take torch's CPU build (the test
extra's `torch==2.13.0`), then:

  python benchmarks/hf_torch_bert.py --layers 4 --hidden 512 --heads 8 \
      --seq_len 128 --batch 32 --steps 20

The step matches `python -m bertjax.tools.benchmark` (and `hf_flax_bert.py`): random
data of the same shapes, MLM at the masked positions + NSP loss, dropout 0.1,
global-norm clipping at 1 and AdamW (weight decay 0.01 but on biases and
LayerNorm), float32, PyTorch's scaled-dot-product attention (SDPA). As in
transformers' own training, `BertForPreTraining` scores every position
against the vocabulary and the loss keeps the masked ones (label -100
elsewhere). Prints one JSON line.
"""

import json
import statistics
import time

import numpy as np
import torch
import transformers

import peer_flags


def main():
  args = peer_flags.parse(__doc__.split("\n")[0])
  intermediate, max_predictions = args.intermediate, args.max_predictions

  torch.manual_seed(0)
  config = transformers.BertConfig(
      vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
      num_attention_heads=args.heads, intermediate_size=intermediate,
      max_position_embeddings=max(512, args.seq_len), attn_implementation="sdpa")
  model = transformers.BertForPreTraining(config).train()
  exempt = lambda name: name.endswith("bias") or "LayerNorm" in name
  decay = [p for n, p in model.named_parameters() if not exempt(n)]
  no_decay = [p for n, p in model.named_parameters() if exempt(n)]
  optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=1e-4, betas=(0.9, 0.999), eps=1e-6)

  rng = np.random.default_rng(0)
  batches = []
  for _ in range(2):
    labels = np.full((args.batch, args.seq_len), -100, np.int64)
    for row in labels:
      positions = rng.choice(np.arange(1, args.seq_len), max_predictions, replace=False)
      row[positions] = rng.integers(0, args.vocab, max_predictions)
    batches.append({
        "input_ids": torch.from_numpy(rng.integers(0, args.vocab, (args.batch, args.seq_len))),
        "attention_mask": torch.ones(args.batch, args.seq_len, dtype=torch.long),
        "token_type_ids": torch.from_numpy(np.repeat(
            (np.arange(args.seq_len)[None] >= args.seq_len // 2).astype(np.int64),
            args.batch, axis=0)),
        "labels": torch.from_numpy(labels),
        "next_sentence_label": torch.from_numpy(rng.integers(0, 2, (args.batch,))),
    })

  def step(batch):
    optimizer.zero_grad(set_to_none=True)
    loss = model(**batch).loss  # MLM (masked positions) + NSP
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss

  times = []
  for i in range(args.warmup + args.steps):
    start = time.perf_counter()
    loss = step(batches[i % 2])
    if i >= args.warmup:
      times.append(time.perf_counter() - start)
  step_s = statistics.median(times)
  print(json.dumps({
      "implementation": f"transformers {transformers.__version__} BertForPreTraining "
                        f"(torch {torch.__version__}, SDPA)",
      "tokens_per_s": round(args.batch * args.seq_len / step_s, 1),
      "step_s_median": round(step_s, 5), "final_loss": float(loss),
      "attention": model.config._attn_implementation,  # pylint: disable=protected-access
      "threads": torch.get_num_threads(), "layers": args.layers, "hidden": args.hidden,
      "heads": args.heads, "intermediate": intermediate, "vocab": args.vocab,
      "seq_len": args.seq_len, "batch": args.batch, "max_predictions": max_predictions,
      "steps": args.steps}))


if __name__ == "__main__":
  main()
