r"""Masked-LM logits in bfloat16 against float32: the residual stream in
bfloat16, or kept in float32 (`model.residual_dtype`, PyTorch autocast's way).

  python benchmarks/mixed_precision.py --workdir=/tmp/bertjax_modernbert_demo
  python benchmarks/mixed_precision.py --size=modernbert_base --length=1024

With `--workdir` (a bertjax run, or a Hugging Face directory with a masked-LM
head) it reads the stdlib corpus with the run's tokenizer; with `--size` it
initialises that preset as pre-training does and reads random ids. 15% of the
positions hold [MASK] (the word it was otherwise). Prints one JSON line per
setting: at the masked positions, the largest and the mean absolute
difference of the logits from float32's, the share of positions whose top
word is float32's, and the masked-LM loss with its difference from float32's.
"""

from __future__ import annotations

import json

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax.data.stdlib_corpus import stdlib_documents
from bertjax.models import PRESETS, EncoderConfig, build_model, init_params
from bertjax.pretrained import Pretrained

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained model (bertjax run or HF directory).")
_SIZE = flags.DEFINE_string("size", None, "A preset to initialise instead (modernbert_base).")
_LENGTH = flags.DEFINE_integer("length", 512, "Tokens a row.")
_ROWS = flags.DEFINE_integer("rows", 4, "Rows.")
_MASK_ID = flags.DEFINE_integer("mask_id", 50284, "[MASK]'s id with --size (ModernBERT's).")

SETTINGS = (("float32", ""), ("bfloat16", ""), ("bfloat16", "float32"))


def _bundle() -> Pretrained:
  if _WORKDIR.value:
    return bertjax.load_pretrained(_WORKDIR.value, task="masked_lm")
  config = EncoderConfig(**PRESETS[_SIZE.value])
  model = build_model(config, "masked_lm")
  params = jax.device_get(init_params(model, jax.random.key(0)))
  return Pretrained(config, params, None, task="masked_lm")


def _rows(bundle: Pretrained, rng: np.random.Generator) -> tuple[np.ndarray, int]:
  """[rows, length] ids and the id of [MASK]."""
  need = _ROWS.value * _LENGTH.value
  if bundle.tokenizer is None:
    return rng.integers(5, bundle.config.vocab_size, size=need), _MASK_ID.value
  ids: list[int] = []
  for document in stdlib_documents():
    ids += bundle.tokenizer.encode(" ".join(document))[1:-1]
    if len(ids) >= need:
      break
  return np.asarray(ids[:need]), bundle.tokenizer.convert_tokens_to_ids(["[MASK]"])[0]


def main(argv):
  del argv
  if bool(_WORKDIR.value) == bool(_SIZE.value):
    raise app.UsageError("give --workdir or --size")
  bundle = _bundle()
  rng = np.random.default_rng(0)
  words, mask_id = _rows(bundle, rng)
  words = words.reshape(_ROWS.value, _LENGTH.value)
  masked = rng.random(words.shape) < 0.15
  ids = jnp.asarray(np.where(masked, mask_id, words), jnp.int32)
  attention_mask = jnp.ones_like(ids)
  exact = None
  for dtype, residual in SETTINGS:
    config = bundle.config.replace(dtype=dtype, residual_dtype=residual)
    model = build_model(config, "masked_lm", add_summary=bundle.has_summary)
    logits = jax.jit(lambda p, i, m: model.apply({"params": p}, i, m)["mlm_logits"])(
        bundle.params, ids, attention_mask)
    logits = np.asarray(logits, np.float32)[masked]  # [masked, vocab]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    loss = float(-log_probs[np.arange(len(logits)), words[masked]].mean())
    result = {"model": _WORKDIR.value or _SIZE.value, "length": _LENGTH.value,
              "rows": _ROWS.value, "masked": int(masked.sum()), "dtype": dtype,
              "residual_dtype": residual or dtype, "loss": round(loss, 5)}
    if exact is None:
      exact = (logits, loss)
    else:
      difference = np.abs(logits - exact[0])
      result.update(max_abs_logit_difference=float(difference.max()),
                    mean_abs_logit_difference=float(difference.mean()),
                    top1_agreement=float((logits.argmax(-1) == exact[0].argmax(-1)).mean()),
                    loss_difference=round(loss - exact[1], 6))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
