"""Model families: what shared code asks of an encoder family.

A family is one `Family` in `FAMILIES`, keyed by `BertConfig.family`. The
trainer, the FLOP count, the loaders and the converters ask it (which
pre-training objectives it trains, whether it takes token types, the local
attention window of a layer, its summary module) instead of testing for a
family by name. A new family is its model file (`models/<family>.py`, its
encoder), its interop file (`interop/<family>.py`, its Hugging Face
translation), one line here and one in `interop/hf.py`, and a preset
(`models/config.py`): docs/architecture.md walks through it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from bertjax.models.config import BertConfig


@dataclasses.dataclass(frozen=True)
class Family:
  """What a model family is, as shared code needs to know it.

  Attributes:
    name: `BertConfig.family`.
    title: How the docs and messages name it.
    objectives: The pre-training objectives it trains (`bertjax.train.OBJECTIVES`).
    objectives_said: Those objectives in words, for a message.
    pretrain_config: The config file of its own pre-training recipe.
    token_types: Whether it takes token types (segment A and B embeddings).
    next_sentence: Whether it has a next-sentence head.
    gated_mlp: Whether the feed-forward's input projection is gated (a GLU:
      two input matrices).
    windowed: Whether its local layers attend a window (`local_attention`).
    summary: The name of the module that summarises a sequence for the task
      heads ("pooler": BERT's [CLS] dense layer; "head": ModernBERT's
      prediction head, which every task model reads).
    summary_weight: The reference (transformers) weight that says the
      summary module is in a checkpoint.
    encoder: Its encoder module, "package.module:Class" (imported when a
      model is built: this registry loads without Flax).
  """

  name: str
  title: str
  objectives: tuple[str, ...]
  objectives_said: str
  pretrain_config: str
  token_types: bool
  next_sentence: bool
  gated_mlp: bool
  windowed: bool
  summary: str
  summary_weight: str
  encoder: str

  def encoder_class(self) -> type:
    """The family's encoder module (a `flax.linen.Module` taking `(config,
    add_pooler)` that returns what `BertEncoder` returns)."""
    import importlib

    module, name = self.encoder.split(":")
    return getattr(importlib.import_module(module), name)

  def local_window(self, config: BertConfig) -> int | None:
    """The half-width of the window its local layers attend (None: every
    layer attends the whole sequence)."""
    return config.local_attention // 2 if self.windowed else None

  def check_objective(self, objective: str) -> None:
    """Refuses a pre-training objective the family does not train."""
    if objective not in self.objectives:
      from bertjax import errors

      raise errors.UsageError(
          f"objective={objective!r} is not {self.title}'s: {self.title} pre-trains with "
          f"{self.objectives_said}; set --config.objective={self.objectives[0]} (or use "
          f"{self.pretrain_config})")


FAMILIES = {
    "bert": Family(
        "bert", "BERT", objectives=("mlm_nsp", "mlm_pairs", "mlm", "ltr"),
        objectives_said="masked LM, with or without next-sentence prediction, or left to right",
        pretrain_config="configs/base_pretrain.py", token_types=True, next_sentence=True,
        gated_mlp=False, windowed=False, summary="pooler",
        summary_weight="bert.pooler.dense.weight",
        encoder="bertjax.models.encoder:BertEncoder"),
    "modernbert": Family(
        "modernbert", "ModernBERT", objectives=("mlm", "mlm_pairs"),
        objectives_said="masked LM only", pretrain_config="configs/modernbert_pretrain.py",
        token_types=False, next_sentence=False, gated_mlp=True, windowed=True, summary="head",
        summary_weight="head.dense.weight",
        encoder="bertjax.models.modernbert:ModernBertEncoder"),
}


def of(config: BertConfig) -> Family:
  """The family of `config`."""
  return FAMILIES[config.family]
