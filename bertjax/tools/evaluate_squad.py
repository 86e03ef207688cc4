r"""Scores SQuAD predictions as the official v1.1 and v2.0 scripts do.

  python -m bertjax.tools.evaluate_squad dev-v1.1.json predictions.json
  python -m bertjax.tools.evaluate_squad dev-v2.0.json predictions.json \
      --na-prob-file null_odds.json [--na-prob-thresh 1.0] [--out-file eval.json]

The data's "version" picks the rules ("1.1" and "1.0": v1.1's; anything else:
v2.0's) unless --rules says. The printed JSON has the official keys and values
(`bertjax.evaluation.squad` lists the differences between the two scripts).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from bertjax import errors, files, paths, usage


def _load_json(path: str, what: str):
  try:
    return json.loads(files.read_text(path))
  except FileNotFoundError:
    raise errors.MissingFileError(f"{what} {path} not found") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.CorruptFileError(f"{what} {path} is not valid JSON: {e}") from None


# The two files the command scores, in their order.
_FILES = {"data.json": "the SQuAD data file (dev-v1.1.json, dev-v2.0.json)",
          "pred.json": "the predictions a run wrote (its predictions.json)"}


def _refusal(message: str) -> str:
  """argparse's complaint as one line naming what to give."""
  required = re.match(r"the following arguments are required: (.+)", message)
  if required is None:
    return f"{message} (--help lists the arguments)"
  names = required.group(1).split(", ")
  what = ("; ".join(f"{name}: {_FILES.get(name, '')}" for name in names) if len(names) > 1
          else _FILES.get(names[0], ""))
  return (f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} required: {what} "
          f"(python -m bertjax.tools.evaluate_squad {' '.join(_FILES)})")


def _parse_args(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m bertjax.tools.evaluate_squad", description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.error = lambda message: usage.fail(_refusal(message))  # one line, exit 2
  for (name, what), dest in zip(_FILES.items(), ("data_file", "pred_file")):
    parser.add_argument(dest, metavar=name, type=paths.resolve,
                        help=what[0].upper() + what[1:] + ".")
  parser.add_argument("--out-file", "-o", metavar="eval.json", type=paths.resolve,
                      help="Write accuracy metrics to file (default is stdout).")
  parser.add_argument("--na-prob-file", "-n", metavar="na_prob.json", type=paths.resolve,
                      help="Model estimates of probability of no answer.")
  parser.add_argument("--na-prob-thresh", "-t", type=float, default=1.0,
                      help='Predict "" if no-answer probability exceeds this (default = 1.0).')
  parser.add_argument("--rules", choices=["auto", "v1.1", "v2.0"], default="auto",
                      help="Which script's rules (default: from the data's version).")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
  """Scores as the official scripts do; an error is one line and exit status 2."""
  usage.run(lambda: _evaluate(_parse_args(sys.argv[1:] if argv is None else argv)))


def _evaluate(args: argparse.Namespace) -> None:
  # Imported once a signal ends the command in one line (`usage.run`).
  from bertjax.data import squad as squad_data
  from bertjax.evaluation import squad

  if args.out_file:
    files.check_file(args.out_file, "--out-file")
  data = _load_json(args.data_file, "Data file")
  try:
    for _ in squad_data.iter_paragraphs(data, args.data_file):
      pass  # every record the scorer reads has its fields, of their types
  except ValueError as e:
    raise errors.CorruptFileError(f"malformed SQuAD data: {e}") from None
  predictions = _load_json(args.pred_file, "Prediction file")
  if not isinstance(predictions, dict):
    raise errors.UsageError(f"{args.pred_file}: predictions must be a JSON object id -> "
                            "answer")
  not_text = [qid for qid, answer in predictions.items() if not isinstance(answer, str)]
  if not_text:
    raise errors.UsageError(f"{args.pred_file}: the prediction of {not_text[0]!r} is not a "
                            f"string ({len(not_text)} such)")
  rules = args.rules
  if rules == "auto":
    rules = "v1.1" if str(data.get("version")) in ("1.1", "1.0") else "v2.0"
  try:
    if rules == "v1.1":
      if str(data.get("version")) != "1.1":
        print(f"Evaluation expects v-1.1, but got dataset with v-{data.get('version')}",
              file=sys.stderr)
      result = squad.evaluate_v1(data["data"], predictions)
    else:
      no_answer_probs = (_load_json(args.na_prob_file, "No-answer probability file")
                         if args.na_prob_file else None)
      result = squad.evaluate_v2(data["data"], predictions, no_answer_probs,
                                 args.na_prob_thresh)
  except (KeyError, TypeError) as e:
    raise errors.CorruptFileError(f"{args.data_file}: malformed SQuAD data "
                                  f"({type(e).__name__}: {e})") from None
  except ValueError as e:  # the data and predictions do not fit together
    raise errors.UsageError(f"{args.data_file} with {args.pred_file}: {e}") from None
  if args.out_file:
    files.write_text(args.out_file, json.dumps(result))
  elif rules == "v1.1":
    print(json.dumps(result))  # as the official v1.1 script prints it
  else:
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
  usage.stop_as_ctrl_c()
  main()
  usage.work_is_done()
