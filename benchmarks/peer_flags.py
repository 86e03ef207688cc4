"""The flags of the peer benchmarks (hf_torch_bert.py, hf_flax_bert.py), the
same as `python -m bertjax.tools.benchmark`'s: imported from the scripts' folder, so
it needs nothing of bertjax (the Flax peer runs in a venv of its own)."""

import argparse


def parse(description: str, extra=()) -> argparse.Namespace:
  """The step's sizes, with `intermediate` (4 x hidden) and `max_predictions`
  (15% of the length, rounded up) filled in; `extra`: a script's own flags,
  (name, type, default, help) each."""
  parser = argparse.ArgumentParser(description=description)
  for name, default in (("layers", 4), ("hidden", 256), ("heads", 4), ("intermediate", None),
                        ("vocab", 30522), ("seq_len", 128), ("batch", 32),
                        ("max_predictions", None), ("steps", 20), ("warmup", 2)):
    parser.add_argument(f"--{name}", type=int, default=default)
  for name, kind, default, text in extra:
    parser.add_argument(f"--{name}", type=kind, default=default, help=text)
  args = parser.parse_args()
  args.intermediate = args.intermediate or 4 * args.hidden
  args.max_predictions = args.max_predictions or -(-15 * args.seq_len // 100)
  return args
