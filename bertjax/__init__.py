"""bertjax: BERT pre-training and fine-tuning in JAX/Flax."""

import os as _os

# gs:// paths go through one client stack, gcsfs (etils.epath's fsspec
# backend), whether or not TensorFlow is installed: epath would otherwise
# switch to TensorFlow's own GCS client whenever TensorFlow is importable
# (it is with the [tf] extra). See docs/storage.md.
_os.environ.setdefault("EPATH_USE_TF", "false")

# gcsfs keeps no directory listings. Other clients write under the directories
# it lists: tensorstore writes orbax's arrays into a step that orbax has just
# listed, other hosts their shards and checkpoint parts. A listing cached by
# this process would hide those objects for the rest of its life; orbax then
# fails a save with "Checkpoint directory does not exist: .../state". The cost
# is a listing request where a cache would have answered.
import fsspec.config as _fsspec_config

for _protocol in ("gs", "gcs"):
  _fsspec_config.conf.setdefault(_protocol, {}).setdefault("use_listings_cache", False)

from bertjax.inference import encode
from bertjax.models import BertConfig
from bertjax.pretrained import Pretrained, export_hf, load_pretrained, save_pretrained

__all__ = ["BertConfig", "Pretrained", "encode", "export_hf", "load_pretrained",
           "save_pretrained"]
