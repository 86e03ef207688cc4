"""Statically masked instances, as the original code wrote them: `dupe_factor`
differently masked copies of the training documents, written once from
finished document shards (`bertjax.data.builder`) into instance shards of
their own, one set per sequence length."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any


from bertjax import errors, files
from bertjax.data import build_pool, shards
from bertjax.data.progress import Progress


def build_static_shard(task: dict[str, Any], progress=None) -> dict[str, Any]:
  """Writes instance shard `task["shard"]`: the masked examples of `dupe_factor`
  epochs of the dynamic pipeline over that shard's share of the documents."""
  from bertjax.data import loader
  from bertjax.data.masking import MaskingConfig

  config = loader.LoaderConfig(
      task["data_dir"], objective=task["objective"], max_seq_length=task["max_seq_length"],
      batch_size=256, masking=MaskingConfig(**task["masking"]),
      short_seq_prob=task["short_seq_prob"], seed=task["seed"],
      num_epochs=task["dupe_factor"], shuffle_window=1, drop_remainder=False,
      split="train", eval_percent=task["eval_percent"])
  path = os.path.join(task["data_dir"], shards.shard_name(
      task["shard"], task["num_shards"], shards.static_kind(task["max_seq_length"])))
  count = 0
  num_documents = len(loader.DocumentSource(task["data_dir"]))
  batches = []  # a shard beyond the number of documents stays empty
  if len(range(task["shard"], num_documents, task["num_shards"])):
    batches = loader.make_dataset(config, task["shard"], task["num_shards"])
  with shards.shard_writer(path) as writer:
    for batch in batches:
      rows = len(batch["input_ids"])
      for row in range(rows):
        writer.write(shards.encode_instance({k: v[row] for k, v in batch.items()}))
      count += rows
      if progress is not None:
        progress.put((rows, {}))
  shards.mark_finished(path, {"instances": count})
  shards.publish(path, task.get("publish_to"))
  return {"instances": count}


def prepare_static(data_dir: str, *, objective: str, max_seq_length: int, masking,
                   dupe_factor: int, short_seq_prob: float = 0.1, seed: int = 0,
                   eval_percent: float = 1.0, num_workers: int = 1, num_hosts: int = 1,
                   host_index: int = 0, show_progress: bool = True,
                   keep_local_copy: bool = False) -> int:
  """Writes statically masked instances, as the original code did (`dupe_factor`
  differently masked copies of the data), from finished document shards.

  The instances of each length have their own files (`shards.static_kind`), so
  one directory holds both phases'. They come from the training split: the
  `eval_percent` of documents held out for evaluation (`loader.split_documents`)
  stay out, and evaluation masks them on the fly. Instances already written
  with the same settings are kept (a rerun finishes what is missing); with other
  settings they are replaced.

  On `gs://` they are built from this host's copy of the documents (array_record
  reads local files), each instance shard uploaded, checked and removed here
  when done; the copy of the documents is removed at the end unless
  `keep_local_copy` (a run's: its other phase builds from it, and
  `data.read_mode="copy"` reads it).

  Returns the number of instances this host wrote.
  """
  with errors.writing(data_dir, "the instance shards finished before are kept"):
    count, copied = _prepare_static(
        data_dir, objective=objective, max_seq_length=max_seq_length, masking=masking,
        dupe_factor=dupe_factor, short_seq_prob=short_seq_prob, seed=seed,
        eval_percent=eval_percent, num_workers=num_workers, num_hosts=num_hosts,
        host_index=host_index, show_progress=show_progress)
  if copied and not keep_local_copy:  # all of it is on gs:// now
    shards.remove_this_hosts_copy(copied, data_dir, shards.static_kind(max_seq_length),
                                  num_hosts, host_index)
  return count


def _static_written(data_dir: str, settings: dict[str, Any], host_index: int,
                    num_hosts: int) -> int | None:
  """The instances this host wrote, when every one of its static shards is
  finished in `data_dir` (on gs://) with these settings; else None."""
  import concurrent.futures

  kind = shards.static_kind(settings["max_seq_length"])
  info_file = files.join(data_dir, shards.static_info_file(settings["max_seq_length"]))
  present = set(files.listdir(data_dir))
  if os.path.basename(info_file) not in present:
    return None
  written = {k: v for k, v in files.read_json(info_file).items()
             if k not in ("format", "format_version")}
  if written != json.loads(json.dumps(settings)):
    return None
  stats = [shards.stats_path(files.join(data_dir, shards.shard_name(
      index, settings["num_shards"], kind)))
      for index in range(host_index, settings["num_shards"], num_hosts)]
  if any(os.path.basename(path) not in present for path in stats):
    return None
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    return sum(record["instances"] for record in pool.map(files.read_json, stats))


def _prepare_static(data_dir: str, *, objective: str, max_seq_length: int, masking,
                    dupe_factor: int, short_seq_prob: float, seed: int, eval_percent: float,
                    num_workers: int, num_hosts: int, host_index: int,
                    show_progress: bool) -> tuple[int, str | None]:
  """`prepare_static`: (instances this host wrote, this host's copy of a
  `gs://` data_dir where the instances were built from one, else None)."""
  if dupe_factor < 1:
    raise errors.UsageError(f"dupe_factor must be >= 1, got {dupe_factor}")
  num_shards = shards.read_info(data_dir)["num_shards"]
  settings = {"objective": objective, "max_seq_length": max_seq_length,
              "masking": dataclasses.asdict(masking), "short_seq_prob": short_seq_prob,
              "seed": seed, "dupe_factor": dupe_factor, "eval_percent": eval_percent,
              "num_shards": num_shards}
  kind, info_file = shards.static_kind(max_seq_length), shards.static_info_file(max_seq_length)
  publish_to = None
  if files.is_remote(data_dir):  # built from a local copy, each shard uploaded when done
    shards.complete_shards(data_dir)
    written = _static_written(data_dir, settings, host_index, num_hosts)
    if written is not None:  # nothing to build: nothing to copy (the builder's, removed)
      return written, files.cache_path(data_dir) if os.path.isdir(
          files.cache_path(data_dir)) else None
    publish_to, data_dir = data_dir, shards.local_directory(data_dir)
  shards.complete_shards(data_dir)  # all documents first: random B segments read any
  from bertjax.data import instances, loader

  training = loader.split_documents(len(loader.DocumentSource(data_dir)), "train", eval_percent)
  instances.check_pair_documents(publish_to or data_dir, objective, len(training), "train")
  files.remove_stale_staging(data_dir)  # of an earlier build that was killed
  existing = os.path.join(data_dir, info_file)
  if os.path.isfile(existing):
    written = {k: v for k, v in files.read_json(existing).items()
               if k not in ("format", "format_version")}
    if written != json.loads(json.dumps(settings)):
      if num_hosts > 1:
        raise errors.UsageError(f"{existing} describes other static instances; with several hosts, "
                                f"delete them ({kind}-* and this file) first")
      # On gs:// the old settings file goes first, then the old instances: a
      # reader never pairs the new settings with old shards.
      for directory in (publish_to, data_dir) if publish_to else (data_dir,):
        if publish_to and directory == publish_to:
          files.remove(files.join(publish_to, info_file))
        for name in files.listdir(directory):
          if name.startswith(f"{kind}-"):
            files.remove(files.join(directory, name))
  shards.write_info(data_dir, settings, info_file)
  shards.publish_files(data_dir, publish_to, [info_file])
  tasks = []
  for index in range(host_index, num_shards, num_hosts):
    done = shards.stats_path(os.path.join(data_dir, shards.shard_name(index, num_shards,
                                                                      kind)))
    if not os.path.isfile(done):
      tasks.append({"shard": index, "num_shards": num_shards, "data_dir": data_dir,
                    "publish_to": publish_to, **settings})
  with Progress(f"masking {kind}", show_progress, unit="instances") as bar:
    build_pool.run_tasks(tasks, num_workers, bar, data_dir, build_static_shard)
  total = 0
  for index in range(host_index, num_shards, num_hosts):
    path = shards.stats_path(os.path.join(data_dir, shards.shard_name(index, num_shards,
                                                                      kind)))
    with open(path, encoding="utf-8") as f:
      total += json.load(f)["instances"]
  return total, data_dir if publish_to else None
