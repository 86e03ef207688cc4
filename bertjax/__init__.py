"""bertjax: BERT pre-training and fine-tuning in JAX/Flax."""

from bertjax.inference import encode
from bertjax.models import BertConfig
from bertjax.pretrained import Pretrained, export_hf, load_pretrained, save_pretrained

__all__ = ["BertConfig", "Pretrained", "encode", "export_hf", "load_pretrained",
           "save_pretrained"]
