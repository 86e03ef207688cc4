"""The encoder architecture as one frozen dataclass, and the named model sizes.

An `EncoderConfig` describes the network (family, sizes, activation, dropout) and how
it is computed (dtype, layer scan, rematerialisation, attention kernel). It is
hashable, so jitted functions can be cached per configuration.

Two families share it (`family`): "bert", the paper's post-LayerNorm encoder
with learned positions and token types, and "modernbert", its descendant
(Warner et al., 2024): rotary positions, GeGLU, pre-normalisation without
biases, and local (sliding-window) attention in all but every n-th layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bertjax import errors
from bertjax.models.family import FAMILIES

# The attention kernels by name (`bertjax.models.attention` runs them): "auto"
# picks the fastest the call allows, "xla" is XLA's attention, the fused ones
# are kernels of their own.
ATTENTION_FUSED = ("dot_product", "cudnn", "splash")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", *ATTENTION_FUSED)

ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
POOLINGS = ("cls", "mean")
# Names of `jax.checkpoint_policies` members, plus "none" (no remat) and "full"
# (save nothing).
REMAT_POLICIES = (
    "none",
    "full",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "nothing_saveable",
    "everything_saveable",
)
DTYPES = ("float32", "bfloat16", "float16")


# `EncoderConfig` fields that change how the weights are computed, not which
# weights there are: the ones a model loaded for use takes from its user
# (`bertjax.load_pretrained`'s overrides), not from the run that trained it.
COMPUTATION_FIELDS = ("dtype", "residual_dtype", "scan_layers", "remat_policy", "attention_impl",
                      "return_hidden_states", "hidden_dropout_prob",
                      "attention_dropout_prob", "classifier_dropout")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Architecture and computation options of an encoder of any family
  (`family`; `BertConfig` is the same class, by its earlier name).

  Attributes:
    family: "bert" (the paper's layer) or "modernbert" (`bertjax.models.modernbert`;
      the fields after `span_bilstm` are its own, and it has no token types,
      learned positions, pooler or causal mode).
    vocab_size: Words of the vocabulary the model predicts and exports (may
      exceed the vocabulary file).
    vocab_pad_multiple: The word embedding table has `embedding_rows` rows,
      `vocab_size` rounded up to a multiple of this (128 in the pre-training
      configs: whole tiles for TPUs' and tensor cores' matmuls, and a table
      that divides over a mesh axis); the rows past `vocab_size` are never
      predicted and not exported.
    hidden_size: Width of the residual stream (H in the paper).
    num_layers: Transformer layers (L).
    num_heads: Attention heads (A); must divide `hidden_size`.
    intermediate_size: Width of the feed-forward layer (4H in the paper).
    hidden_act: Feed-forward activation: "gelu" (exact, erf), "gelu_tanh",
      "relu" or "silu".
    max_position_embeddings: Rows of the learned position table (longest input).
    type_vocab_size: Rows of the token type (segment) table.
    hidden_dropout_prob: Dropout on embeddings and on each sub-layer's output.
    attention_dropout_prob: Dropout on the attention probabilities.
    classifier_dropout: Dropout before fine-tuning output layers; None means
      `hidden_dropout_prob`.
    layer_norm_eps: LayerNorm epsilon (1e-12 in the original code).
    initializer_range: Standard deviation of the truncated normal weight
      initialiser (the original code's `create_initializer`).
    pad_token_id: Id of [PAD]; kept for export, the model masks by
      `attention_mask`, not by id.
    dtype: Compute dtype of matmuls and activations. Parameters, softmax,
      LayerNorm and losses stay float32.
    residual_dtype: The dtype of the residual stream, what each layer passes
      to the next ("": `dtype`). "float32" with a bfloat16 `dtype` rounds
      only the matmuls' inputs, as PyTorch's autocast (ModernBERT's mixed
      precision) does, at twice the stream's memory.
    scan_layers: Run the layers with `nn.scan` (parameters stacked on a leading
      "layers" axis): one compiled layer, fast compiles for deep models.
    remat_policy: Rematerialisation of each layer in the backward pass.
    attention_impl: "auto" (the fastest kernel the call allows: splash on
      TPUs, cuDNN on GPUs, XLA on CPUs and whenever attention dropout is on),
      "xla" (einsum + softmax, with attention dropout), "dot_product"
      (`jax.nn.dot_product_attention`'s XLA implementation), "cudnn" (cuDNN's
      flash kernel on NVIDIA GPUs; bfloat16 or float16) or "splash" (the TPU
      Pallas kernel). The fused kernels have no attention dropout
      (`bertjax.models.attention`).
    causal: Left-to-right attention mask (the paper's "LTR & No NSP" ablation);
      the pooler then reads the last real token, not [CLS] (`encoder.pool`).
    return_hidden_states: Also return the embedding output and every layer's
      output (the feature-based approach).
    span_bilstm: A BiLSTM (hidden_size / 2 units each way) between the encoder
      and the span layer of question answering: the paper's Table 5
      "+ BiLSTM" row, randomly initialised for fine-tuning.
    global_attention_every: ModernBERT: layer i attends globally when i is a
      multiple of this, and locally otherwise (every third layer in
      ModernBERT; 1: every layer global).
    local_attention: ModernBERT: the local attention window, in tokens: a
      query sees the keys at most `local_attention // 2` positions away.
    global_rope_theta: ModernBERT: the rotary base of global layers.
    local_rope_theta: ModernBERT: the rotary base of local layers.
    mlp_dropout_prob: ModernBERT: dropout on the gated feed-forward's hidden
      units (`hidden_dropout_prob` is the embeddings' dropout and
      `attention_dropout_prob` the attention probabilities').
    attention_output_dropout_prob: ModernBERT: dropout on the attention's
      output; negative: `attention_dropout_prob`, as transformers' ModernBERT
      (one setting for both). ModernBERT's pre-training ran 0.1 here and 0 on
      the probabilities (which lets the fused attention kernels run).
    classifier_pooling: ModernBERT: what sequence classification and multiple
      choice summarise, "cls" (the first token) or "mean" (the real tokens).
  """

  family: str = "bert"
  vocab_size: int = 30522
  vocab_pad_multiple: int = 1
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_prob: float = 0.1
  attention_dropout_prob: float = 0.1
  classifier_dropout: float | None = None
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  pad_token_id: int = 0
  dtype: str = "float32"
  residual_dtype: str = ""
  scan_layers: bool = False
  remat_policy: str = "none"
  attention_impl: str = "auto"
  causal: bool = False
  return_hidden_states: bool = False
  span_bilstm: bool = False
  global_attention_every: int = 3
  local_attention: int = 128
  global_rope_theta: float = 160_000.0
  local_rope_theta: float = 10_000.0
  mlp_dropout_prob: float = 0.0
  attention_output_dropout_prob: float = -1.0
  classifier_pooling: str = "cls"

  def __post_init__(self):
    self.validate()

  @property
  def embedding_rows(self) -> int:
    """Rows of the word embedding table: `vocab_size` padded (`vocab_pad_multiple`)."""
    return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

  @property
  def stream_dtype(self) -> str:
    """The residual stream's dtype (`residual_dtype`, or `dtype`)."""
    return self.residual_dtype or self.dtype

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def is_global_layer(self, index: int) -> bool:
    """Whether layer `index` attends globally (every layer, in a family
    without local windows)."""
    return not FAMILIES[self.family].windowed or index % self.global_attention_every == 0

  @property
  def attention_output_dropout(self) -> float:
    """ModernBERT's dropout on the attention output."""
    if self.attention_output_dropout_prob < 0:
      return self.attention_dropout_prob
    return self.attention_output_dropout_prob

  @property
  def head_dropout(self) -> float:
    """Dropout applied before the fine-tuning output layers."""
    if self.classifier_dropout is None:
      return self.hidden_dropout_prob
    return self.classifier_dropout

  def validate(self) -> None:
    """Raises ValueError naming the offending field and what to change."""
    _check_choice("family", self.family, tuple(FAMILIES))
    for name in ("vocab_size", "vocab_pad_multiple", "hidden_size", "num_layers", "num_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size",
                 "global_attention_every", "local_attention"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise errors.UsageError(f"EncoderConfig.{name} must be a positive integer, got {value!r}")
    if self.hidden_size % self.num_heads:
      raise errors.UsageError(
          f"EncoderConfig.hidden_size={self.hidden_size} is not divisible by "
          f"num_heads={self.num_heads}; choose num_heads dividing hidden_size "
          f"(the paper uses hidden_size / 64).")
    if self.span_bilstm and self.hidden_size % 2:
      raise errors.UsageError(f"EncoderConfig.span_bilstm needs an even hidden_size (two directions "
                              f"of hidden_size / 2), got {self.hidden_size}")
    for name in ("hidden_dropout_prob", "attention_dropout_prob", "mlp_dropout_prob",
                 "attention_output_dropout_prob"):
      value = getattr(self, name)
      if name == "attention_output_dropout_prob" and value < 0:
        continue  # follows attention_dropout_prob
      if not 0.0 <= value < 1.0:
        raise errors.UsageError(f"EncoderConfig.{name} must be in [0, 1), got {value!r}")
    _check_choice("hidden_act", self.hidden_act, ACTIVATIONS)
    _check_choice("classifier_pooling", self.classifier_pooling, POOLINGS)
    self._validate_family()
    _check_choice("dtype", self.dtype, DTYPES)
    if self.residual_dtype:
      _check_choice("residual_dtype", self.residual_dtype, DTYPES)
    _check_choice("remat_policy", self.remat_policy, REMAT_POLICIES)
    _check_choice("attention_impl", self.attention_impl, ATTENTION_IMPLEMENTATIONS)
    if self.attention_impl == "cudnn" and self.dtype == "float32":
      raise errors.UsageError("EncoderConfig.attention_impl='cudnn' needs dtype 'bfloat16' or "
                              "'float16'; use attention_impl='dot_product' for float32")

  def _validate_family(self) -> None:
    spec = FAMILIES[self.family]
    for name in ("causal", "span_bilstm"):
      if getattr(self, name) and name not in spec.modes:
        raise errors.UsageError(f"EncoderConfig.{name}=True is not a mode of {spec.title} "
                                f"(family={self.family!r}); its modes: "
                                f"{', '.join(spec.modes) or 'none'}")
    if not spec.rotary:
      return
    if self.head_dim % 2:
      raise errors.UsageError(f"EncoderConfig: rotary positions need an even head width; "
                              f"hidden_size / num_heads is {self.head_dim}")
    for name in ("global_rope_theta", "local_rope_theta"):
      if getattr(self, name) <= 0:
        raise errors.UsageError(f"EncoderConfig.{name} must be positive, got {getattr(self, name)!r}")

  def describe(self, parameters: int | None = None) -> str:
    """How a log names the model: its family, the name of its size where a
    preset of its family has its shape, its shape and its parameters
    ("BERT tiny (L2/H128/A2, 4.4M parameters)")."""
    shape = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
    sizes = [name.split("_", 1)[1] for name, preset in PRESETS.items()
             if preset.get("family", "bert") == self.family and name.split("_", 1)[1].isalpha()
             and all(preset[field] == getattr(self, field) for field in shape)]
    counted = f", {parameters} parameters" if parameters else ""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
      if parameters and parameters >= scale:
        counted = f", {parameters / scale:.1f}{unit} parameters"
        break
    return (f"{FAMILIES[self.family].title}{' ' + sizes[0] if sizes else ''} "
            f"(L{self.num_layers}/H{self.hidden_size}/A{self.num_heads}{counted})")

  def replace(self, **changes: Any) -> EncoderConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, values: dict[str, Any], source: str = "config") -> EncoderConfig:
    """Builds a config from a dict, rejecting keys it does not know."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise errors.UsageError(f"{source}: unknown EncoderConfig keys {unknown}; known keys are "
                              f"{sorted(known)}")
    return cls(**values)

  @classmethod
  def from_run_config(cls, config: Any) -> EncoderConfig:
    """The model of a training run's config (its `model` block, an
    `ml_collections.ConfigDict`)."""
    return cls.from_dict(config.model.to_dict(), "config.model")

  @classmethod
  def from_preset(cls, name: str, **overrides: Any) -> EncoderConfig:
    """A named model size (see `PRESETS`), with optional field overrides."""
    if name not in PRESETS:
      raise errors.UsageError(f"Unknown model preset {name!r}; known presets: "
                              f"{', '.join(sorted(PRESETS))}")
    return cls(**{**PRESETS[name], **overrides})


BertConfig = EncoderConfig  # its name before it described other families; kept for users


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
  if value not in choices:
    raise errors.UsageError(f"EncoderConfig.{name}={value!r} is not one of {choices}")


def _size(layers: int, hidden: int, heads: int | None = None) -> dict[str, int]:
  # The paper and Turc et al. (2019) use 64-wide heads and a 4H feed-forward.
  return dict(num_layers=layers, hidden_size=hidden,
              num_heads=heads or hidden // 64, intermediate_size=4 * hidden)


def _presets() -> dict[str, dict[str, Any]]:
  presets = {
      "bert_base": _size(12, 768, 12),    # 110M parameters
      "bert_large": _size(24, 1024, 16),  # 340M parameters
  }
  # The 24 smaller BERTs of Turc et al. (2019), released with the original code.
  for layers in (2, 4, 6, 8, 10, 12):
    for hidden in (128, 256, 512, 768):
      presets[f"bert_L{layers}_H{hidden}"] = _size(layers, hidden)
  # Their names in the original release.
  presets["bert_tiny"] = presets["bert_L2_H128"]
  presets["bert_mini"] = presets["bert_L4_H256"]
  presets["bert_small"] = presets["bert_L4_H512"]
  presets["bert_medium"] = presets["bert_L8_H512"]
  # The paper's Table 6 ablation over model size (#L, #H, #A).
  for layers, hidden, heads in ((3, 768, 12), (6, 768, 3), (6, 768, 12),
                                (12, 768, 12), (12, 1024, 16), (24, 1024, 16)):
    presets[f"table6_L{layers}_H{hidden}_A{heads}"] = _size(layers, hidden, heads)
  # ModernBERT (Warner et al., 2024), as transformers' ModernBertConfig and
  # the released answerdotai/ModernBERT-base and -large (whose configs pool
  # the mean of the tokens for classification; transformers' default is cls).
  # Every ModernBERT field is named, so that a run's config shows (and
  # overrides) them.
  modern = dict(family="modernbert", vocab_size=50368, max_position_embeddings=8192,
                hidden_act="gelu", hidden_dropout_prob=0.0, attention_dropout_prob=0.0,
                mlp_dropout_prob=0.0, attention_output_dropout_prob=-1.0,
                classifier_dropout=0.0, layer_norm_eps=1e-5,
                pad_token_id=50283, global_attention_every=3, local_attention=128,
                global_rope_theta=160_000.0, local_rope_theta=10_000.0,
                classifier_pooling="mean")
  presets["modernbert_base"] = dict(modern, num_layers=22, hidden_size=768, num_heads=12,
                                    intermediate_size=1152)
  presets["modernbert_large"] = dict(modern, num_layers=28, hidden_size=1024, num_heads=16,
                                     intermediate_size=2624)
  return presets


PRESETS: dict[str, dict[str, Any]] = _presets()
