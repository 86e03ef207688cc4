"""Convert parameters between the looped and the scanned layer layouts.

BERT: looped (`scan_layers=False`), `bert/layers_0/...`, ...,
`bert/layers_{L-1}/...`; scanned (`scan_layers=True`), `bert/layers/layer/...`
with a leading [L] axis.

ModernBERT: looped as BERT; scanned, `layers_0` stays looped, the next layers
form blocks of `global_attention_every` (`bert/layers/layers_j/...`, a leading
[blocks] axis, block b's layer j being layer 1 + b * every + j), and the layers
left over stay looped under their own numbers (`bertjax.models.modernbert`).

Checkpoint converters work on the looped layout and call `to_layout` at the end.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bertjax.models.config import EncoderConfig
from bertjax.models.encoder import SCANNED_LAYERS

Params = dict[str, Any]


def is_scanned(bert_params: Params) -> bool:
  return SCANNED_LAYERS in bert_params


def _is_modern(bert_params: Params) -> bool:
  return "final_norm" in bert_params


def _stack(trees: list[Params]) -> Params:
  return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def stack_layers(bert_params: Params, config: EncoderConfig | None = None) -> Params:
  """Looped encoder parameters -> scanned (ModernBERT's need its `config`)."""
  if _is_modern(bert_params):
    if config is None:
      raise ValueError("stacking ModernBERT layers needs the model's config")
    from bertjax.models.modernbert import block_plan

    every = config.global_attention_every
    blocks, _ = block_plan(config)
    if not blocks:
      return bert_params
    names = {j: [f"layers_{1 + b * every + j}" for b in range(blocks)] for j in range(every)}
    stacked = {f"layers_{j}": _stack([bert_params[n] for n in group])
               for j, group in names.items()}
    taken = {n for group in names.values() for n in group}
    rest = {k: v for k, v in bert_params.items() if k not in taken}
    return {**rest, SCANNED_LAYERS: stacked}
  names = sorted((k for k in bert_params if k.startswith("layers_")),
                 key=lambda k: int(k.split("_")[1]))
  rest = {k: v for k, v in bert_params.items() if k not in names}
  return {**rest, SCANNED_LAYERS: {"layer": _stack([bert_params[k] for k in names])}}


def unstack_layers(bert_params: Params) -> Params:
  """Scanned encoder parameters -> looped."""
  stacked = bert_params[SCANNED_LAYERS]
  rest = {k: v for k, v in bert_params.items() if k != SCANNED_LAYERS}
  if _is_modern(bert_params):
    every = len(stacked)
    blocks = jax.tree.leaves(stacked)[0].shape[0]
    for b in range(blocks):
      for j in range(every):
        rest[f"layers_{1 + b * every + j}"] = jax.tree.map(
            lambda x, b=b: np.asarray(x[b]), stacked[f"layers_{j}"])
    return rest
  layers = stacked["layer"]
  num_layers = jax.tree.leaves(layers)[0].shape[0]
  for i in range(num_layers):
    rest[f"layers_{i}"] = jax.tree.map(lambda x, i=i: np.asarray(x[i]), layers)
  return rest


def to_layout(params: Params, scan_layers: bool, config: EncoderConfig | None = None) -> Params:
  """Returns task-model `params` with its `bert` subtree in the requested layout.

  Args:
    params: Task-model parameters, either layout.
    scan_layers: The layout wanted (`EncoderConfig.scan_layers`).
    config: The model's config; needed to scan ModernBERT's layers.
  """
  bert = params["bert"]
  if is_scanned(bert) == scan_layers:
    return params
  bert = stack_layers(bert, config) if scan_layers else unstack_layers(bert)
  return {**params, "bert": bert}
