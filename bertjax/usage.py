"""How the command lines report a usage error: one line that says what to change.

A usage error is a mistake in what was asked (an unknown `--config.*` field, a
value the config refuses, a missing file) rather than a bug; a failure of the
machine's surroundings that bertjax words itself (a checkpoint save the
storage refused, `bertjax.checkpoint.CheckpointSaveError`) is reported the
same way. bertjax raises
those itself, with a message naming the key, file or value and what to do; the
command line prints that message alone and exits with status 2. Any other
exception keeps its traceback, and `--verbosity=1` shows the traceback of a
usage error too.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Callable, NoReturn, TypeVar

from absl import flags, logging

T = TypeVar("T")
EXIT_CODE = 2

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where bertjax raises its own, worded errors: the package and the configs.
_OWN_CODE = tuple(os.path.join(_PACKAGE_ROOT, name) + os.sep for name in ("bertjax", "configs"))
# What a worded error is raised as (a bug in bertjax's own code would more
# likely be a TypeError, AttributeError, IndexError or KeyError).
_USAGE_TYPES = (ValueError, OSError, FloatingPointError)


def fail(message: str) -> NoReturn:
  """Prints `error: message` (one line) to stderr and exits with status 2."""
  print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
  sys.exit(EXIT_CODE)


def is_usage_error(error: BaseException) -> bool:
  """Whether `error` is one bertjax raised on purpose, worded for the user.

  Judged by its type and by where it was raised: the innermost frame of its
  traceback must be bertjax's code or a config file (a `ValueError` from deep
  inside JAX is a bug to report, with its traceback).
  """
  if not isinstance(error, _USAGE_TYPES):
    return False
  frames = traceback.extract_tb(error.__traceback__)
  if not frames:
    return True
  return os.path.abspath(frames[-1].filename).startswith(_OWN_CODE)


def run(fn: Callable[[], T]) -> T:
  """`fn()`, with a usage error turned into one line and exit status 2.

  Ctrl-C that reaches here (a second one, which aborts) exits at once with
  status 130 and no traceback: background threads (a checkpoint save being
  abandoned) are not waited for. With `--verbosity=1` or more, everything
  keeps its traceback.
  """
  verbose = logging.get_verbosity() >= logging.DEBUG
  try:
    return fn()
  except KeyboardInterrupt:
    if verbose:
      raise
    print("error: interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)  # pylint: disable=protected-access
  except Exception as e:  # pylint: disable=broad-except
    if verbose or not is_usage_error(e):
      raise
    fail(f"{e} (--verbosity=1 shows where)")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (pass as `app.run(main, flags_parser=usage.parse_flags)`),
  with a flag mistake, an unknown `--config.*` field included, as one line."""
  try:
    remaining = flags.FLAGS(argv)
    if "config" in flags.FLAGS and flags.FLAGS["config"].present:
      # config_flags keeps a config file it cannot load as an error raised on
      # first use: use it here, where it is a flag mistake.
      getattr(flags.FLAGS["config"].value, "task", None)
    return remaining
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
    # config_flags raises AttributeError or KeyError for an unknown --config.*
    # field, with ml_collections' "did you mean" in the message.
    message = str(e.args[0]) if e.args else str(e)
    if isinstance(e, OSError):
      lines = [line.strip() for line in message.splitlines() if line.strip()]
      message = f"--config: {lines[-1]}"
    elif isinstance(e, (AttributeError, KeyError)):
      name = (re.findall(r"'([^'\\]+)", message) or ["?"])[0]
      suggestion = re.search(r'Did you mean "([^"]+)"', message)
      given = [arg.split("=")[0] for arg in argv[1:] if arg.startswith("--config.")
               and name in arg.split("=")[0].split(".")]
      message = (f"{given[0] if given else '--config'}: the config has no field {name!r}"
                 + (f" (did you mean {suggestion.group(1)!r}?)" if suggestion else "")
                 + "; docs/configs.md lists the fields")
    else:
      if len(message) > 1 and message[0] == message[-1] == "'":
        message = message[1:-1]
      # config_flags folds a config file's own traceback into its message: keep
      # the flag's part and the error line ("ValueError: ...").
      lines = [line.strip() for line in message.replace("\\n", "\n").splitlines()
               if line.strip()]
      if len(lines) > 1:
        errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line)]
        message = f"{lines[0]} {errors[-1] if errors else lines[-1]}"
    fail(message)
