"""One of two JAX processes reading a prepared directory (run by test_distributed.py).

  python -m tests.data.two_process_loader PROCESS_ID PORT DATA_DIR OUT_JSON
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bertjax.data import loader  # noqa: E402


def main():
  process_id, port, data_dir, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
  index, count = jax.process_index(), jax.process_count()

  config = loader.LoaderConfig(data_dir, objective="ltr", batch_size=4, shuffle_window=1,
                               num_epochs=1)
  # The documents the pipeline itself reads.
  source = loader.DocumentSource(data_dir)
  documents = [ref.index for ref in loader.document_stream(source, config, index, count)]
  masked = loader.LoaderConfig(data_dir, batch_size=4, shuffle_window=1)
  masks = next(iter(loader.make_dataset(masked, index, count)))["masked_positions"].tolist()

  mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = jax.NamedSharding(mesh, jax.P("data"))
  device = loader.DeviceIterator(iter(loader.make_dataset(config, index, count)), sharding)
  batch = next(device)
  local = next(iter(loader.make_dataset(config, index, count)))
  shards = sorted(batch["input_ids"].addressable_shards, key=lambda s: s.index[0].start)
  local_rows = np.concatenate([np.asarray(s.data) for s in shards])
  total = float(jax.jit(lambda w: w.sum())(batch["lm_weights"]))
  device.close()
  with open(out, "w") as f:
    json.dump({"documents": documents, "global_shape": list(batch["input_ids"].shape),
               "local_rows_match": bool(np.array_equal(local_rows, local["input_ids"])),
               "local_sum": float(local["lm_weights"].sum()), "global_sum": total,
               "masks": masks}, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
