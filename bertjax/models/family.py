"""Model families: what shared code asks of an encoder family.

A family is one `Family` in `FAMILIES`, keyed by `EncoderConfig.family`. The
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
  from bertjax.models.config import EncoderConfig


@dataclasses.dataclass(frozen=True)
class Family:
  """What a model family is, as shared code needs to know it.

  Attributes:
    name: `EncoderConfig.family`.
    title: How the docs and messages name it.
    objectives: The pre-training objectives it trains (`bertjax.train.OBJECTIVES`).
    objectives_said: Those objectives in words, for a message.
    pretrain_config: The config file of its own pre-training recipe.
    token_types: Whether it takes token types (segment A and B embeddings).
    rotary: Whether its positions are rotary (no position embedding table).
    norm_bias: Whether its LayerNorms have a bias.
    next_sentence: Whether it has a next-sentence head.
    mlm_transform: Whether its masked-LM head transforms the encoder's
      output (dense, activation, LayerNorm) before the decoder; without, the
      decoder reads the summary module's output ("head").
    gated_mlp: Whether the feed-forward's input projection is gated (a GLU:
      two input matrices).
    windowed: Whether its local layers attend a window (`local_attention`).
    classifier_fan_in: Whether its task output layers are initialised at
      1 / sqrt(width) (else at `initializer_range`).
    span_dropout: Whether its span (SQuAD) output layer has dropout before it.
    modes: The optional modes of `EncoderConfig` it has ("causal": left to
      right; "span_bilstm").
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
  rotary: bool
  norm_bias: bool
  next_sentence: bool
  mlm_transform: bool
  gated_mlp: bool
  windowed: bool
  classifier_fan_in: bool
  span_dropout: bool
  modes: tuple[str, ...]
  summary: str
  summary_weight: str
  encoder: str

  def encoder_class(self) -> type:
    """The family's encoder module (a `flax.linen.Module` taking `(config,
    add_summary)` that returns what `BertEncoder` returns)."""
    import importlib

    module, name = self.encoder.split(":")
    return getattr(importlib.import_module(module), name)

  def local_window(self, config: EncoderConfig) -> int | None:
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
        pretrain_config="configs/base_pretrain.py", token_types=True, rotary=False,
        norm_bias=True, next_sentence=True, mlm_transform=True, gated_mlp=False,
        windowed=False, classifier_fan_in=False, span_dropout=False,
        modes=("causal", "span_bilstm"), summary="pooler",
        summary_weight="bert.pooler.dense.weight",
        encoder="bertjax.models.encoder:BertEncoder"),
    "modernbert": Family(
        "modernbert", "ModernBERT", objectives=("mlm", "mlm_pairs"),
        objectives_said="masked LM only", pretrain_config="configs/modernbert_pretrain.py",
        token_types=False, rotary=True, norm_bias=False, next_sentence=False,
        mlm_transform=False, gated_mlp=True, windowed=True, classifier_fan_in=True,
        span_dropout=True, modes=(), summary="head",
        summary_weight="head.dense.weight",
        encoder="bertjax.models.modernbert:ModernBertEncoder"),
}


def of(config: EncoderConfig) -> Family:
  """The family of `config`."""
  return FAMILIES[config.family]
