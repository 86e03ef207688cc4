"""bertjax: BERT pre-training and fine-tuning in JAX/Flax."""

import os as _os

# gs:// paths go through one client stack, gcsfs (etils.epath's fsspec
# backend), whether or not TensorFlow is installed: epath would otherwise
# switch to TensorFlow's own GCS client whenever TensorFlow is importable
# (it is with the [tf] extra). See docs/storage.md.
_os.environ.setdefault("EPATH_USE_TF", "false")

from bertjax.inference import encode
from bertjax.models import BertConfig
from bertjax.pretrained import Pretrained, export_hf, load_pretrained, save_pretrained

__all__ = ["BertConfig", "Pretrained", "encode", "export_hf", "load_pretrained",
           "save_pretrained"]
