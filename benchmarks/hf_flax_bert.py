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

`--compile_for` compiles the step for a Cloud TPU slice instead of timing it
(libtpu's description of the chips, data parallel over them; the venv needs
`jax[tpu]`): the line then holds the compiled step's memory, FLOPs and bytes
accessed a chip. `benchmarks/tpu_compile_vs_peer.py` runs it beside bertjax's.
"""

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import transformers

import peer_flags

EXTRA = [
    ("dtype", str, "float32", "Computation dtype; the parameters stay float32."),
    ("attention_dropout", float, 0.1, "Dropout on the attention probabilities (BERT's 0.1)."),
    ("remat", int, 0, "1: recompute each layer in the backward pass (transformers' "
     "gradient_checkpointing)."),
    ("compile_for", str, "", "Compile only, for a TPU slice: a JSON object of "
     "jax.experimental.topologies.get_topology_desc's arguments, 'accelerator_type' and "
     "'hbm_bytes' (a chip's)."),
]
# Words of XLA's refusal of a program too large for the chip.
_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory")


def build(args):
  """(step(state, batch, rng) -> (state, loss), the initial state)."""
  config = transformers.BertConfig(
      vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
      num_attention_heads=args.heads, intermediate_size=args.intermediate,
      max_position_embeddings=max(512, args.seq_len),
      attention_probs_dropout_prob=args.attention_dropout)
  model = transformers.FlaxBertForPreTraining(config, seed=0, dtype=jnp.dtype(args.dtype),
                                              gradient_checkpointing=bool(args.remat))
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

  return step, state


def make_batches(args, count: int) -> list[dict[str, np.ndarray]]:
  rng = np.random.default_rng(0)
  batches = []
  for _ in range(count):
    weights = np.zeros((args.batch, args.seq_len), np.float32)
    for row in weights:
      row[rng.choice(np.arange(1, args.seq_len), args.max_predictions, replace=False)] = 1
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
  return batches


def sizes(args) -> dict:
  return {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
          "intermediate": args.intermediate, "vocab": args.vocab, "seq_len": args.seq_len,
          "batch": args.batch, "max_predictions": args.max_predictions, "dtype": args.dtype,
          "remat": bool(args.remat)}


def time_steps(args, step, state) -> dict:
  batches = make_batches(args, 2)
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
  return {"tokens_per_s": round(args.batch * args.seq_len / step_s, 1),
          "step_s_median": round(step_s, 5), "compile_s": round(compile_s, 2),
          "final_loss": float(loss), "device_kind": jax.devices()[0].device_kind,
          "steps": args.steps}


def compile_for(args, step, state, slice_spec: dict) -> dict:
  """The step compiled for the slice's chips, data parallel: a chip's memory,
  FLOPs and bytes accessed, as XLA reports them, and whether it fits the chip
  (with XLA's message where it refused the step as too large)."""
  from jax.experimental import topologies
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  devices = topologies.get_topology_desc(
      platform="tpu", topology_name=slice_spec["topology_name"],
      chip_config_name=slice_spec["chip_config_name"],
      chips_per_host_bounds=tuple(slice_spec["chips_per_host_bounds"]),
      num_slices=1, wrap=tuple(slice_spec["wrap"])).devices
  mesh = Mesh(np.array(devices), ("data",))
  replicated = NamedSharding(mesh, PartitionSpec())
  split = NamedSharding(mesh, PartitionSpec("data"))
  abstract = lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  state_spec = jax.tree.map(lambda x: abstract(x, replicated), state)
  batch_spec = {k: abstract(v, split) for k, v in make_batches(args, 1)[0].items()}
  key = jax.random.key(0)
  key_spec = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)
  jitted = jax.jit(step, donate_argnums=0,
                   out_shardings=(jax.tree.map(lambda x: replicated, state), replicated))
  start = time.perf_counter()
  try:
    compiled = jitted.lower(state_spec, batch_spec, key_spec).compile()
  except Exception as e:  # jax's JaxRuntimeError
    if not any(marker in str(e) for marker in _OUT_OF_MEMORY):
      raise
    return {"chips": len(devices), "device_kind": devices[0].device_kind, "fits": False,
            "per_chip_bytes": {"total": None}, "error": str(e)[:4000],
            "compile_s": round(time.perf_counter() - start, 1)}
  compile_s = time.perf_counter() - start
  memory = compiled.memory_analysis()
  held = {"arguments": memory.argument_size_in_bytes, "outputs": memory.output_size_in_bytes,
           "aliased": memory.alias_size_in_bytes, "temporaries": memory.temp_size_in_bytes,
           "generated_code": memory.generated_code_size_in_bytes}
  held["total"] = (held["arguments"] + held["outputs"] - held["aliased"]
                   + held["temporaries"] + held["generated_code"])
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {"chips": len(devices), "device_kind": devices[0].device_kind,
          "fits": held["total"] <= slice_spec["hbm_bytes"], "per_chip_bytes": held,
          "flops_per_chip": float(cost.get("flops", 0.0)),
          "bytes_accessed_per_chip": float(cost.get("bytes accessed", 0.0)),
          "compile_s": round(compile_s, 1)}


def main():
  args = peer_flags.parse(__doc__.split("\n")[0], EXTRA)
  slice_spec = json.loads(args.compile_for) if args.compile_for else None
  if slice_spec:
    # libtpu describes "this host" first: off a TPU VM, spare it the metadata
    # server; the chips are only described, so the step's arrays stay on the CPU.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", slice_spec["accelerator_type"])
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    jax.config.update("jax_platforms", "cpu")
  step, state = build(args)
  figures = (compile_for(args, step, state, slice_spec) if slice_spec
             else time_steps(args, step, state))
  print(json.dumps({
      "implementation": f"transformers {transformers.__version__} FlaxBertForPreTraining",
      **figures, **sizes(args)}))


if __name__ == "__main__":
  main()
