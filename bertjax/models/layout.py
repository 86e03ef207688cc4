"""Convert parameters between the looped and the scanned layer layouts.

Looped (`scan_layers=False`): `bert/layers_0/...`, ..., `bert/layers_{L-1}/...`.
Scanned (`scan_layers=True`): `bert/layers/layer/...` with a leading [L] axis.
Checkpoint converters work on the looped layout and call `to_layout` at the end.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bertjax.models.encoder import SCANNED_LAYERS

Params = dict[str, Any]


def is_scanned(bert_params: Params) -> bool:
  return SCANNED_LAYERS in bert_params


def stack_layers(bert_params: Params) -> Params:
  """Looped encoder parameters -> scanned."""
  names = sorted((k for k in bert_params if k.startswith("layers_")),
                 key=lambda k: int(k.split("_")[1]))
  rest = {k: v for k, v in bert_params.items() if k not in names}
  stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                         *[bert_params[k] for k in names])
  return {**rest, SCANNED_LAYERS: {"layer": stacked}}


def unstack_layers(bert_params: Params) -> Params:
  """Scanned encoder parameters -> looped."""
  stacked = bert_params[SCANNED_LAYERS]["layer"]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  rest = {k: v for k, v in bert_params.items() if k != SCANNED_LAYERS}
  for i in range(num_layers):
    rest[f"layers_{i}"] = jax.tree.map(lambda x, i=i: np.asarray(x[i]), stacked)
  return rest


def to_layout(params: Params, scan_layers: bool) -> Params:
  """Returns task-model `params` with its `bert` subtree in the requested layout."""
  bert = params["bert"]
  if is_scanned(bert) == scan_layers:
    return params
  bert = stack_layers(bert) if scan_layers else unstack_layers(bert)
  return {**params, "bert": bert}
