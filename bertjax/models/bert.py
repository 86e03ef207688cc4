"""Task models: the encoder (`bert` subtree) plus one output layer each.

Parameter trees mirror the reference: `{"bert": encoder, <head name>: head}`, so a
fine-tuning model takes the `bert` subtree of any pre-training checkpoint as is.
Every model takes `(input_ids, attention_mask, token_type_ids, deterministic)`
(multiple choice adds a choices axis) and returns a dict of float32 logits;
the fine-tuning heads also take packed rows (`bertjax.data.example_packing`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import errors
from bertjax.models.config import EncoderConfig
from bertjax.models import family
from bertjax.models.heads import MaskedLMHead, OutputLayer, gather_positions

Array = jax.Array


def encoder(config: EncoderConfig, add_summary: bool = True) -> nn.Module:
  """The encoder of `config.family` (`bertjax.models.family`): `BertEncoder`
  or `ModernBertEncoder`, with its summary module where `add_summary` (BERT's
  [CLS] pooler; ModernBERT's prediction head, which every ModernBERT task
  model but the bare encoder has)."""
  return family.of(config).encoder_class()(config, add_summary=add_summary)


def summary_name(config: EncoderConfig) -> str:
  """The name of the encoder's summary module: BERT's `pooler`, ModernBERT's
  `head`."""
  return family.of(config).summary


def token_features(bert: nn.Module, sequence_output: Array) -> Array:
  """What heads over every position read: the sequence output itself, or a
  prediction head on it where the family's summary is one (ModernBERT's)."""
  if family.of(bert.config).summary == "head":
    return bert.token_features(sequence_output)
  return sequence_output


def _reads_summary(config: EncoderConfig) -> bool:
  """Whether every task model reads the family's summary module (a
  prediction head, ModernBERT's), not only those that pool."""
  return family.of(config).summary == "head"


class BertForPreTraining(nn.Module):
  """Masked LM + next-sentence prediction (the paper's pre-training)."""

  config: EncoderConfig

  def setup(self):
    self.bert = encoder(self.config)
    self.mlm = MaskedLMHead(self.config)
    self.nsp = OutputLayer(self.config, 2)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None, masked_positions: Array | None = None,
               deterministic: bool = True, *, position_ids: Array | None = None,
               segment_ids: Array | None = None,
               nsp_positions: Array | None = None) -> dict[str, Array]:
    """Returns `mlm_logits` [batch, predictions|length, vocab], `nsp_logits`
    [batch, 2] ([batch, pairs, 2] for packed rows).

    Args:
      masked_positions: [batch, max_predictions] positions to predict; None
        predicts every position.
      position_ids, segment_ids: Packed rows (see `BertEncoder`).
      nsp_positions: [batch, pairs] the [CLS] of each packed pair, where its
        next-sentence prediction is made.
    """
    encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                        deterministic=deterministic, segment_ids=segment_ids,
                        pool_positions=nsp_positions)
    hidden = encoded.sequence_output
    if masked_positions is not None:
      hidden = gather_positions(hidden, masked_positions)
    return {"mlm_logits": self.mlm(hidden, self.bert.attend),
            "nsp_logits": self.nsp(encoded.pooled_output)}


class BertForMaskedLM(nn.Module):
  """Masked LM only (the paper's "No NSP" ablation; ModernBERT's objective); no
  pooler by default (ModernBERT: its prediction head, always)."""

  config: EncoderConfig
  add_summary: bool = False  # Kept when a checkpoint has one, for `encode`.

  def setup(self):
    self.bert = encoder(self.config, add_summary=self.add_summary or _reads_summary(self.config))
    self.mlm = MaskedLMHead(self.config)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None, masked_positions: Array | None = None,
               deterministic: bool = True, *, position_ids: Array | None = None,
               segment_ids: Array | None = None) -> dict[str, Array]:
    """Returns `mlm_logits` [batch, predictions|length, vocab].

    Args:
      position_ids, segment_ids: Packed rows (see `BertEncoder`).
    """
    encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids,
                        deterministic=deterministic, segment_ids=segment_ids)
    hidden = encoded.sequence_output
    if masked_positions is not None:
      hidden = gather_positions(hidden, masked_positions)
    return {"mlm_logits": self.mlm(token_features(self.bert, hidden), self.bert.attend)}


class BertForNextSentencePrediction(nn.Module):
  """Next-sentence prediction only."""

  config: EncoderConfig

  def setup(self):
    self.bert = encoder(self.config)
    self.nsp = OutputLayer(self.config, 2)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               deterministic: bool = True) -> dict[str, Array]:
    """Returns `nsp_logits` [batch, 2] (0: B follows A, 1: B is random)."""
    encoded = self.bert(input_ids, attention_mask, token_type_ids,
                        deterministic=deterministic)
    return {"nsp_logits": self.nsp(encoded.pooled_output)}


class BertForSequenceClassification(nn.Module):
  """[CLS] -> dropout -> linear: classification, or regression with one label."""

  config: EncoderConfig
  num_labels: int = 2

  def setup(self):
    self.bert = encoder(self.config)
    self.classifier = OutputLayer(self.config, self.num_labels, self.config.head_dropout)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               deterministic: bool = True, *, segment_ids: Array | None = None,
               pool_positions: Array | None = None) -> dict[str, Array]:
    """Returns `logits` [batch, num_labels] ([batch, examples, num_labels] for
    packed rows).

    Args:
      segment_ids, pool_positions: Packed rows, several examples each
        (`bertjax.data.example_packing`): each example's [CLS] is classified.
    """
    encoded = self.bert(input_ids, attention_mask, token_type_ids,
                        deterministic=deterministic, segment_ids=segment_ids,
                        pool_positions=pool_positions)
    return {"logits": self.classifier(encoded.pooled_output, deterministic)}


class BertForQuestionAnswering(nn.Module):
  """Start and end vectors over every position (SQuAD); no pooler by default."""

  config: EncoderConfig
  add_summary: bool = False

  def setup(self):
    self.bert = encoder(self.config, add_summary=self.add_summary or _reads_summary(self.config))
    if self.config.span_bilstm:
      units = self.config.hidden_size // 2
      self.span_bilstm = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(units)),
                                          nn.RNN(nn.OptimizedLSTMCell(units)))
    # The paper's span layer has no dropout; ModernBERT's classifier has its own.
    self.span = OutputLayer(self.config, 2, self.config.head_dropout
                            if family.of(self.config).span_dropout else 0.0)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               deterministic: bool = True) -> dict[str, Array]:
    """Returns `start_logits` and `end_logits`, each [batch, length]."""
    encoded = self.bert(input_ids, attention_mask, token_type_ids,
                        deterministic=deterministic)
    x = token_features(self.bert, encoded.sequence_output)  # [batch, length, embed]
    if self.config.span_bilstm:
      lengths = (jnp.sum(attention_mask, axis=-1) if attention_mask is not None
                 else jnp.full(x.shape[:1], x.shape[1]))
      x = self.span_bilstm(x.astype(jnp.float32), seq_lengths=lengths.astype(jnp.int32))
      x = x.astype(encoded.sequence_output.dtype)  # [batch, length, 2 * (embed // 2)]
    logits = self.span(x, deterministic)  # [batch, length, 2]
    return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}


class BertForMultipleChoice(nn.Module):
  """One score per [CLS] of each choice, softmaxed over choices (SWAG)."""

  config: EncoderConfig

  def setup(self):
    self.bert = encoder(self.config)
    self.classifier = OutputLayer(self.config, 1, self.config.head_dropout)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               deterministic: bool = True, *, segment_ids: Array | None = None,
               pool_positions: Array | None = None,
               choice_slots: Array | None = None) -> dict[str, Array]:
    """Takes [batch, choices, length] inputs (packed: [rows, length]); returns
    `logits` [batch, choices].

    Args:
      segment_ids, pool_positions, choice_slots: Packed rows [rows, length] of
        the choices' sequences (`bertjax.data.example_packing`): each choice's
        [CLS] is scored, and `choice_slots` [batch, choices] says where each
        choice's score lies among the rows' [rows * slots] pooled positions.
    """
    if segment_ids is not None:
      encoded = self.bert(input_ids, None, token_type_ids, deterministic=deterministic,
                          segment_ids=segment_ids, pool_positions=pool_positions)
      scores = self.classifier(encoded.pooled_output, deterministic)  # [rows, slots, 1]
      return {"logits": scores.reshape(-1)[choice_slots]}  # [batch, choices]
    batch, choices, length = input_ids.shape
    flat = lambda x: None if x is None else x.reshape(batch * choices, length)
    encoded = self.bert(flat(input_ids), flat(attention_mask), flat(token_type_ids),
                        deterministic=deterministic)
    scores = self.classifier(encoded.pooled_output, deterministic)  # [b * c, 1]
    return {"logits": scores.reshape(batch, choices)}


class BertForTokenClassification(nn.Module):
  """Dropout -> linear on every position (NER); no pooler by default."""

  config: EncoderConfig
  num_labels: int = 2
  add_summary: bool = False

  def setup(self):
    self.bert = encoder(self.config, add_summary=self.add_summary or _reads_summary(self.config))
    self.classifier = OutputLayer(self.config, self.num_labels, self.config.head_dropout)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               deterministic: bool = True, *,
               segment_ids: Array | None = None) -> dict[str, Array]:
    """Returns `logits` [batch, length, num_labels].

    Args:
      segment_ids: Packed rows, several examples each (`bertjax.data.example_packing`).
    """
    encoded = self.bert(input_ids, attention_mask, token_type_ids,
                        deterministic=deterministic, segment_ids=segment_ids)
    features = token_features(self.bert, encoded.sequence_output)
    return {"logits": self.classifier(features, deterministic)}


class BertModel(nn.Module):
  """The bare encoder under a `bert` subtree, like every task model."""

  config: EncoderConfig
  add_summary: bool = True

  def setup(self):
    self.bert = encoder(self.config, add_summary=self.add_summary)

  def __call__(self, input_ids: Array, attention_mask: Array | None = None,
               token_type_ids: Array | None = None,
               deterministic: bool = True) -> dict[str, Array]:
    """Returns `sequence_output`, `pooled_output` (with a pooler) and (if
    configured) `hidden_states`."""
    encoded = self.bert(input_ids, attention_mask, token_type_ids,
                        deterministic=deterministic)
    outputs = {"sequence_output": encoded.sequence_output}
    if encoded.pooled_output is not None:
      outputs["pooled_output"] = encoded.pooled_output
    if encoded.hidden_states is not None:
      outputs["hidden_states"] = encoded.hidden_states
    return outputs


# Task name -> model class. The names are bertjax's; `bertjax.interop.hf` maps
# them to the reference's class names.
TASK_MODELS: dict[str, type[nn.Module]] = {
    "encoder": BertModel,
    "pretraining": BertForPreTraining,
    "masked_lm": BertForMaskedLM,
    "next_sentence": BertForNextSentencePrediction,
    "sequence_classification": BertForSequenceClassification,
    "question_answering": BertForQuestionAnswering,
    "multiple_choice": BertForMultipleChoice,
    "token_classification": BertForTokenClassification,
}
LABELLED_TASKS = ("sequence_classification", "token_classification")
# Tasks whose pooler is optional (their heads read the sequence output).
OPTIONAL_POOLER_TASKS = ("encoder", "masked_lm", "question_answering", "token_classification")


def build_model(config: EncoderConfig, task: str = "encoder", num_labels: int = 2,
                add_summary: bool | None = None) -> nn.Module:
  """The task model for `task` (a key of `TASK_MODELS`).

  Args:
    config: The architecture.
    task: Which head.
    num_labels: Outputs of a classification head.
    add_summary: Build the summary module (BERT's [CLS] pooler) in a task
      that does not need it (None: the reference class's default). Tasks
      that need it always have one.
  """
  if task not in TASK_MODELS:
    raise errors.UsageError(f"Unknown task {task!r}; known tasks: {', '.join(TASK_MODELS)}")
  spec = family.of(config)
  if not spec.next_sentence and task in ("pretraining", "next_sentence"):
    raise errors.UsageError(f"The {task} model has a next-sentence head, which {spec.title} "
                            f"does not have: it pre-trains with {spec.objectives_said} (task "
                            "masked_lm)")
  if _reads_summary(config) and task != "encoder" and add_summary is False:
    raise errors.UsageError(f"The {spec.title} {task} model needs its prediction head")
  kwargs = {}
  if task in LABELLED_TASKS:
    if num_labels < 1:
      raise errors.UsageError(f"num_labels must be >= 1 for {task}, got {num_labels}")
    kwargs["num_labels"] = num_labels
  if add_summary is not None:
    if task in OPTIONAL_POOLER_TASKS:
      kwargs["add_summary"] = add_summary
    elif not add_summary:
      raise errors.UsageError(f"The {task} model needs the pooler")
  return TASK_MODELS[task](config, **kwargs)


def example_inputs(model: nn.Module, batch: int = 1, length: int = 8) -> dict[str, Array]:
  """Zero inputs of the rank `model` expects, for `init` and `eval_shape`."""
  shape = (batch, 2, length) if isinstance(model, BertForMultipleChoice) else (batch, length)
  ones = jnp.ones(shape, jnp.int32)
  return {"input_ids": ones, "attention_mask": ones, "token_type_ids": ones * 0}


def init_params(model: nn.Module, rng: jax.Array, length: int = 8):
  """Randomly initialised parameters (with logical partitioning metadata boxes).

  `flax.linen.meta.unbox` strips the boxes; `nn.get_partition_spec` reads them.
  The example batch runs through XLA's attention, whatever the config's: the
  parameters do not depend on the kernel, and a fused one may not take one
  row on a mesh.
  """
  model = model.clone(config=model.config.replace(attention_impl="xla"))
  return model.init({"params": rng}, **example_inputs(model, length=length))["params"]


def abstract_params(model: nn.Module):
  """Shapes, dtypes and logical axes of `model`'s parameters, computed without FLOPs."""
  return jax.eval_shape(lambda rng: init_params(model, rng), jax.random.key(0))
