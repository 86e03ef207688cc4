"""Blocks shared by the configs: model sizes and the logical-axis rules.

Model code names only logical axes; this table maps them onto the mesh axes
`data` (batch replicas), `fsdp` (batch and parameter shards) and `tensor`
(heads and feed-forward shards). An axis mapped to None is replicated.
"""

import ml_collections

from bertjax.models.config import PRESETS

LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    # BERT's 30522-token vocabulary divides by no mesh axis larger than 2: the
    # word embeddings shard over `embed` only. Map it to "tensor" after padding
    # `vocab_size` to a multiple of the tensor axis.
    ("vocab", None),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
)


def model_config(size: str, **overrides) -> ml_collections.ConfigDict:
  """The `BertConfig` fields of a named size (`bertjax.models.PRESETS`) as a ConfigDict.

  Sizes: bert_base, bert_large, bert_L{2..12}_H{128,256,512,768} (and bert_tiny,
  bert_mini, bert_small, bert_medium), table6_L*_H*_A* (the paper's Table 6).
  """
  if size not in PRESETS:
    raise ValueError(f"Unknown model size {size!r}; known: {', '.join(sorted(PRESETS))}")
  return ml_collections.ConfigDict({**PRESETS[size], **overrides})
