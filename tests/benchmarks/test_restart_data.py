"""benchmarks/restart_data.py: its restarts are the demo config with overrides
that config takes, and its dataset is a prepared directory of the demo's
documents, repeated."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import restart_data  # noqa: E402  (a script, not a package)
from tests.benchmarks.commands import config_of  # noqa: E402


def test_each_restart_is_the_demo_config_with_valid_overrides(tmp_path):
  from bertjax.tasks import pretrain

  for mode in ("copy", "stream"):
    args = restart_data.command(str(tmp_path), "gs://bucket/data", mode)
    config = config_of(args)
    pretrain.validate(config, 1)
    assert config.data.read_mode == mode and config.model.num_layers == 2


def test_the_dataset_repeats_the_demo_documents(prepared_dir, tmp_path):
  from bertjax.data import loader, shards

  out = restart_data.repeated_data(prepared_dir, str(tmp_path / "data"), size_mb=1)
  original, repeated = loader.DocumentSource(prepared_dir), loader.DocumentSource(out)
  assert len(repeated) > 2 * len(original)
  assert len(shards.complete_shards(out)) == restart_data.NUM_SHARDS
  # Document j of the stream is shard j % 16's; it repeats document j % n.
  paths = shards.complete_shards(out)
  per_shard = [len(shards.Records(out, [p])) for p in paths]
  for j in (0, 1, 17, len(repeated) - 1):
    shard, within = j % len(paths), j // len(paths)
    index = sum(per_shard[:shard]) + within
    assert all((a == b).all() for a, b in zip(repeated[index], original[j % len(original)]))
  assert shards.read_stats(out).documents_used == len(repeated)
