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

from bertjax import lazy, platforms

# A script on a CPU machine with the [tpu] extra installed runs JAX on the CPU
# without the TPU runtime's errors about the TPU it does not find (as the
# commands do): see bertjax.platforms.
platforms.keep_library_jax_off_absent_tpus()

# The public API, imported when first used: `import bertjax.data...` (the data
# tools) then starts without JAX and Flax, which take seconds to import.
_API = {"BertConfig": "bertjax.models", "EncoderConfig": "bertjax.models",
        "Pretrained": "bertjax.pretrained",
        "encode": "bertjax.inference", "export_hf": "bertjax.pretrained",
        "load_pretrained": "bertjax.pretrained", "save_pretrained": "bertjax.pretrained"}
__all__ = sorted(_API)


__getattr__, __dir__ = lazy.api(__name__, _API)
