r"""The same pre-training step with transformers' Flax BERT, as a baseline.

transformers 4.57.6 is the last release with Flax models; keep it in its own
virtual environment (bertjax's tests use transformers 5):

  python -m venv /tmp/hf4 && /tmp/hf4/bin/pip install jax flax optax 'transformers==4.57.6'
  /tmp/hf4/bin/python benchmarks/hf_flax_bert.py --layers 4 --hidden 512 --heads 8 \
      --seq_len 128 --batch 32 --steps 20

The step matches `python -m bertjax.tools.benchmark`: random data of the same shapes,
MLM (at the masked positions) + NSP loss, global-norm clipping and AdamW. As in
transformers' `run_mlm_flax.py`, `FlaxBertForPreTraining` scores every position
against the vocabulary and the loss keeps the masked ones. Prints one JSON line.
"""

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import transformers

import peer_flags


def main():
  args = peer_flags.parse(__doc__.split("\n")[0])
  intermediate, max_predictions = args.intermediate, args.max_predictions

  config = transformers.BertConfig(
      vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
      num_attention_heads=args.heads, intermediate_size=intermediate,
      max_position_embeddings=max(512, args.seq_len))
  model = transformers.FlaxBertForPreTraining(config, seed=0, dtype=jnp.float32)
  decay = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: path[-1].key not in ("bias", "scale"), params)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                                      mask=decay))
  state = {"params": model.params, "opt_state": optimizer.init(model.params)}

  def step(state, batch, rng):
    def loss_fn(params):
      out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                  params=params, dropout_rng=rng, train=True)
      # Labels everywhere, weight 1 at the masked positions only.
      log_probs = jax.nn.log_softmax(out.prediction_logits, axis=-1)
      token_losses = -jnp.take_along_axis(log_probs, batch["labels"][..., None], -1)[..., 0]
      mlm = (token_losses * batch["label_weights"]).sum() / batch["label_weights"].sum()
      nsp = optax.softmax_cross_entropy_with_integer_labels(
          out.seq_relationship_logits, batch["next_sentence_labels"]).mean()
      return mlm + nsp
    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state}, loss

  rng = np.random.default_rng(0)
  batches = []
  for _ in range(2):
    weights = np.zeros((args.batch, args.seq_len), np.float32)
    for row in weights:
      row[rng.choice(np.arange(1, args.seq_len), max_predictions, replace=False)] = 1
    batches.append({
        "input_ids": rng.integers(0, args.vocab, (args.batch, args.seq_len), dtype=np.int32),
        "attention_mask": np.ones((args.batch, args.seq_len), np.int32),
        "token_type_ids": np.repeat(
            (np.arange(args.seq_len)[None] >= args.seq_len // 2).astype(np.int32),
            args.batch, axis=0),
        "labels": rng.integers(0, args.vocab, (args.batch, args.seq_len), dtype=np.int32),
        "label_weights": weights,
        "next_sentence_labels": rng.integers(0, 2, (args.batch,), dtype=np.int32),
    })

  jitted = jax.jit(step, donate_argnums=0)
  start = time.perf_counter()
  compiled = jitted.lower(state, batches[0], jax.random.key(1)).compile()
  compile_s = time.perf_counter() - start
  times = []
  for i in range(args.warmup + args.steps):
    start = time.perf_counter()
    state, loss = compiled(state, batches[i % 2], jax.random.key(i))
    loss.block_until_ready()
    if i >= args.warmup:
      times.append(time.perf_counter() - start)
  step_s = statistics.median(times)
  print(json.dumps({
      "implementation": f"transformers {transformers.__version__} FlaxBertForPreTraining",
      "tokens_per_s": round(args.batch * args.seq_len / step_s, 1),
      "step_s_median": round(step_s, 5), "compile_s": round(compile_s, 2),
      "final_loss": float(loss), "device_kind": jax.devices()[0].device_kind,
      "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
      "intermediate": intermediate, "vocab": args.vocab, "seq_len": args.seq_len,
      "batch": args.batch, "max_predictions": max_predictions, "steps": args.steps}))


if __name__ == "__main__":
  main()
