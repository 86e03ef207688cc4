"""How every command line behaves: flags, one-line errors, Ctrl-C.

Each command's module ends with `usage.run_main(main)`, which

- parses the flags (`parse_flags`): a flag mistake, an unknown `--config.*`
  field included, is one line; a config is loaded, its path fields are
  resolved (`bertjax.paths`) and its numbers checked against their ranges
  (`bertjax.config_ranges`: a value outside is one line naming the field)
  before `main` sees it;
- says an error bertjax words for the user (`bertjax.errors`: a setting to
  change, a file missing or damaged, a full disk, a workdir another run holds)
  as one line, `error: ...`, and exits with status 2, or 42 for a failure a
  restart can cure (storage that did not answer: `errors.exit_status`).
  Whether an error is one is decided by what it is, not by where it was
  raised: anything else is a bug and keeps its traceback; `--verbosity=1`
  shows every traceback;
- ends on Ctrl-C with status 130 and one line saying what was kept: every
  staging file is removed on the way out (each writer does so on any
  exception), and finished work stays for a rerun to continue from; SIGTERM
  and SIGHUP end it the same way, with status 143 and 129 (a training run
  takes SIGTERM as a preemption notice instead: `bertjax.signals`).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import logging as std_logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterator, NoReturn, TypeVar

from absl import app, flags, logging
from absl.flags import _helpers as absl_helpers
import ml_collections
from ml_collections.config_flags.config_flags import is_config_flag

from bertjax import (config_files, config_ranges, errors, paths, platforms, preemption,
                     schedule_fit, trackers)
# (Their home is bertjax.config_files; every command's code names them here.)
from bertjax.config_files import config_leaves, load_config_file, shipped_configs

T = TypeVar("T")
EXIT_CODE = errors.USAGE_EXIT_CODE
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT


def fail(message: str, status: int = EXIT_CODE) -> NoReturn:
  """Prints `error: message` (one line) to stderr and exits with `status` (2:
  a person must mend something)."""
  print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
  sys.exit(status)


def is_usage_error(error: BaseException) -> bool:
  """Whether `error` is said in one line (`bertjax.errors.one_line`)."""
  return errors.one_line(error) is not None


def run(fn: Callable[[], T],
        interrupted: str | Callable[[], str] = "nothing was left half-written") -> T:
  """`fn()`, with a worded error turned into one line and exit status 2 (42
  for a failure a restart can cure).

  Ctrl-C that reaches here exits at once with status 130 and the line
  `interrupted (Ctrl-C): <interrupted>`; background threads (a checkpoint save
  being abandoned) are not waited for. With `--verbosity=1` or more,
  everything keeps its traceback.
  """
  global _running
  verbose = logging.get_verbosity() >= logging.DEBUG
  _running = True
  try:
    return fn()
  except preemption.ExitAtOnce as e:
    # No time to wait for anything (a SIGKILL follows): the run's log says
    # what a restart resumes from.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(e.code)  # pylint: disable=protected-access
  except KeyboardInterrupt as stop:
    if verbose:
      raise
    # The process ends at once: the logs are silenced first, so that a
    # background thread being abandoned (an orbax save) cannot log after the
    # line that says what happened.
    logging.set_verbosity(logging.FATAL)
    std_logging.disable(std_logging.CRITICAL)
    kept = interrupted() if callable(interrupted) else interrupted
    print(f"error: interrupted ({_signal_name(stop)}): {kept}", file=sys.stderr,
          flush=True)
    sys.stdout.flush()
    os._exit(_signal_exit_code(stop))  # pylint: disable=protected-access
  except Exception as e:  # pylint: disable=broad-except
    line = errors.one_line(e)
    if verbose or line is None:
      raise
    fail(f"{line} (--verbosity=1 shows where)", errors.exit_status(e) or EXIT_CODE)
  finally:
    _running = False


_running = False  # whether `run` is running a command (a Ctrl-C is its to end)


def run_main(main: Callable[[list[str]], Any], *,
             interrupted: str | Callable[[], str] = "nothing was left half-written") -> None:
  """Runs a command's `main(argv)` as every bertjax command runs (see above).

  Args:
    main: Takes the arguments left after the flags; `argv[1:]` must be empty.
    interrupted: What a Ctrl-C leaves, said after "interrupted (Ctrl-C): " (or
      a function that says it then).
  """

  stop_as_ctrl_c()
  platforms.keep_jax_off_absent_tpus()  # before anything starts JAX

  def checked(argv: list[str]) -> Any:
    from bertjax import metrics

    metrics.quiet_checkpoint_logs()  # orbax's INFO lines only with --verbosity=1
    if len(argv) > 1:
      fail(f"unexpected arguments {argv[1:]}: every setting is a --flag (--help lists "
           "them)")
    result = run(lambda: main(argv), interrupted)
    work_is_done()
    return result

  try:
    app.run(checked, flags_parser=parse_flags)
  except SystemExit as exit_:
    # absl ends --help (and --helpshort, --helpfull) with status 1; help that
    # was asked for and given is a success.
    if exit_.code == 1 and set(sys.argv[1:]) & _HELP_FLAGS:
      sys.exit(0)
    raise
  except KeyboardInterrupt as stop:  # while the flags or the config loaded
    if logging.get_verbosity() >= logging.DEBUG:
      raise
    print(f"error: interrupted ({_signal_name(stop)})", file=sys.stderr, flush=True)
    sys.exit(_signal_exit_code(stop))


_HELP_FLAGS = frozenset({"--help", "-help", "-h", "-?", "--helpshort", "--helpfull",
                         "--helpxml"})


class Terminated(KeyboardInterrupt):
  """SIGTERM (`kill`, a scheduler, a machine shutting down) or SIGHUP (the
  terminal closed), ending a command as Ctrl-C does: the same clean-up runs
  (worker processes stopped, staging files removed), and the command exits
  with 128 + the signal's number."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def _signal_name(stop: KeyboardInterrupt) -> str:
  return signal.Signals(stop.signum).name if isinstance(stop, Terminated) else "Ctrl-C"


def _signal_exit_code(stop: KeyboardInterrupt) -> int:
  return 128 + stop.signum if isinstance(stop, Terminated) else INTERRUPTED_EXIT_CODE


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
  """Holds Ctrl-C, SIGTERM and SIGHUP until the block ends, then acts on the
  first that came (KeyboardInterrupt, `Terminated`).

  For the first import of JAX and its C extensions (an exception raised inside
  an extension's initialisation can crash Python, a segmentation fault or an
  abort, instead of ending the command in one line), and for work that must
  not be cut short (stopping worker processes). Unlike blocking the signals
  (`signal.pthread_sigmask`, of the calling thread only), this holds them
  whichever thread the operating system hands them to. A signal ignored (SIGHUP
  under `nohup`) stays ignored; off the main thread the block runs as it is.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  received: list[int] = []
  previous = {}
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(signum) not in (signal.SIG_IGN, None):
      previous[signum] = signal.signal(signum, lambda signum, frame: received.append(signum))
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  if received:
    raise KeyboardInterrupt if received[0] == signal.SIGINT else Terminated(received[0])


def import_held(name: str) -> Any:
  """The module `name`, imported with the signals held (`signals_held`) the
  first time; once imported, as it is, the handlers left alone (a JAX run on
  several hosts has its own SIGTERM handler then, which Python does not see)."""
  import importlib

  if name in sys.modules:
    return sys.modules[name]
  with signals_held():
    return importlib.import_module(name)


def work_is_done() -> None:
  """Ignores Ctrl-C, SIGTERM and SIGHUP for the rest of a command whose work is
  done: one landing while the process exits (Python's own handlers are gone
  by then) would end it by the signal, and a supervisor would rerun finished
  work. Only for a command's process (`run_main` calls it)."""
  if threading.current_thread() is threading.main_thread():
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
      signal.signal(signum, signal.SIG_IGN)  # the whole process's (JAX has threads)


def stop_as_ctrl_c() -> None:
  """Makes SIGTERM and SIGHUP end this process's command as Ctrl-C does (see
  `Terminated`); `run_main` does it for every absl command, a command with a
  parser of its own calls it first."""
  _redeliver_swallowed_interrupts()
  _stop_on_termination_signals()


def _stop_on_termination_signals() -> None:
  """SIGTERM and SIGHUP raise `Terminated` in the main thread. A signal that
  is ignored (SIGHUP under `nohup`) stays ignored; a training run replaces
  SIGTERM's handler with its own while it trains (a preemption notice:
  `bertjax.signals`), as `jax.distributed` does on several hosts."""
  if threading.current_thread() is not threading.main_thread():
    return

  def stop(signum, frame):
    del frame
    raise Terminated(signum)

  for signum in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(signum) == signal.SIG_DFL:
      signal.signal(signum, stop)


def _redeliver_swallowed_interrupts() -> None:
  """Delivers again a Ctrl-C (or SIGTERM, SIGHUP) that Python swallowed.

  A KeyboardInterrupt raised while a garbage-collection callback or a
  destructor runs (JAX registers one) is printed as "Exception ignored" and
  dropped, and the command goes on as if Ctrl-C had not been pressed. The
  signal is sent again a moment later, from a thread, when the main thread
  is back in ordinary code.
  """
  previous = sys.unraisablehook
  if getattr(previous, "_bertjax_redelivers", False):
    return

  def hook(unraisable) -> None:
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
      previous(unraisable)
      return

    stop = unraisable.exc_value
    signum = stop.signum if isinstance(stop, Terminated) else signal.SIGINT

    def resend() -> None:
      time.sleep(0.05)
      if _running:  # not once the command is done: its work is whole then
        os.kill(os.getpid(), signum)

    threading.Thread(target=resend, daemon=True).start()

  hook._bertjax_redelivers = True
  sys.unraisablehook = hook


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (pass as `app.run(main, flags_parser=usage.parse_flags)`),
  with a flag mistake, an unknown `--config.*` field included, as one line, a
  shipped config found from any directory (`shipped_configs`), a config's
  path fields resolved (`bertjax.paths.resolve_config`), a number outside
  its range (`bertjax.config_ranges`) one line naming the field, a tracker
  that is not installed (`bertjax.trackers`) one line, and a pre-training
  schedule that does not fit in its run one line naming every conflict
  (`bertjax.schedule_fit`), before anything starts. A config path that names
  no file lists the shipped configs (`config_files.missing`), a required flag
  left out is named with what it is for, and an unknown flag is answered
  with the command's own flags (or a config field) before absl's built-in
  ones."""
  argv = shipped_configs(argv)
  # (A command whose --config is a plain string reads the file itself.)
  takes_config = "config" in flags.FLAGS and is_config_flag(flags.FLAGS["config"])
  if takes_config and not set(argv[1:]) & _HELP_FLAGS:
    for value in config_files.flag_values("config", argv):
      line = config_files.missing(value)
      if line:
        fail(line)
  try:
    remaining = flags.FLAGS(argv)
    if takes_config and flags.FLAGS["config"].present:
      # config_flags keeps a config file it cannot load as an error raised on
      # first use: use it here, where it is a flag mistake.
      config = flags.FLAGS["config"].value
      if not isinstance(config, dict):  # (a dict has a task too)
        getattr(config, "task", None)
      if config is not None and not isinstance(config, ml_collections.ConfigDict):
        fail(f"--config: {config_files.config_path(argv)}'s get_config returned a "
             f"{type(config).__name__}, not a config: return the ml_collections.ConfigDict it "
             "builds (docs/configs.md)")
      paths.resolve_config(config)
      if isinstance(config, ml_collections.ConfigDict):
        refusal = config_ranges.out_of_range(config) or schedule_fit.misfit(config)
        if refusal:
          fail(refusal)
        try:
          trackers.check(config)  # a tracker asked for and not installed
        except errors.Error as e:
          fail(str(e))
    return remaining
  except errors.Error as e:  # a config's own check (an unknown size, argument)
    fail(f"--config: {e}")
  except SyntaxError as e:  # the config file's Python (IndentationError, TabError too)
    where = f"{e.filename}, line {e.lineno}" + (f", column {e.offset}" if e.offset else "")
    fail(f"--config: {where}: {e.msg} ({type(e).__name__}); correct the config file")
  except Exception as e:  # pylint: disable=broad-except
    required = _required_left_out(e, argv)
    if required:
      fail(required)
    if isinstance(e, flags.UnrecognizedFlagError) and not e.flagname.startswith("config."):
      fail(_unknown_flag(e.flagname, argv))
    frame, e = config_files.file_frame(e, argv)
    if isinstance(e, errors.Error):  # the config's own refusal (an unknown argument)
      fail(f"--config: {e}")
    shape = config_files.file_shape(e, argv) if frame is None else None
    if shape:
      fail(shape)
    if frame is not None:  # the config file's own code failed (a typo, an import)
      where = f"{frame.filename}, line {frame.lineno}" + (
          f", column {frame.colno + 1}" if getattr(frame, "colno", None) is not None else "")
      hint = ("; the shipped configs import from bertjax.configs (docs/configs.md)"
              if isinstance(e, ImportError) else "")
      inner = traceback.extract_tb(e.__traceback__)[-1].filename
      if isinstance(e, (AttributeError, KeyError)) and "ml_collections" in inner:
        detail = _flag_error(e, []).split(": ", 1)[1]  # "the config has no field 'x' ..."
      else:
        detail = f"{type(e).__name__}: {' '.join(str(e).split())}"
      fail(f"--config: {where}: {detail}; correct the config file{hint}")
    if isinstance(e, (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError,
                      ImportError)):
      fail(_flag_error(e, argv))
    raise


def _required_left_out(error: BaseException, argv: list[str]) -> str | None:
  """The line naming each required flag `argv` leaves out, and what it is for
  (absl says "must have a value other than None"; a --config given whose
  get_config returned None is the config file's mistake, said elsewhere)."""
  names = re.findall(r"Flag --(\w+) must have a value other than None", str(error))
  left_out = [name for name in names if name != "config"
              or not config_files.flag_values("config", argv)]
  if not left_out:
    return None

  def what(name: str) -> str:
    text = " ".join((flags.FLAGS[name].help or "").split()).rstrip(".")
    return text[:1].lower() + text[1:] if text[1:2].islower() else text

  if len(left_out) == 1:
    return f"--{left_out[0]} is required: {what(left_out[0])}"
  named = ", ".join(f"--{name}" for name in left_out[:-1]) + f" and --{left_out[-1]}"
  return f"{named} are required: " + "; ".join(f"--{name}: {what(name)}" for name in left_out)


def _unknown_flag(name: str, argv: list[str]) -> str:
  """The line for a flag the command does not take: the command's own flags
  that are close (absl's own rule), and the config field it most likely
  means, before absl's built-in flags (--run_with_pdb, --log_dir), which are
  suggested only where nothing of the command's is close."""
  defined = flags.FLAGS
  own = [flag for flag in defined if "." not in flag
         and not (defined.find_module_defining_flag(flag) or "absl").startswith("absl")]
  built_in = [flag for flag in defined if "." not in flag and flag not in own]
  suggestions = absl_helpers.get_flag_suggestions(name, own)
  takes_config = "config" in own and is_config_flag(defined["config"])
  config = config_files.given_config(argv) if takes_config else None
  field = config_files.field_for(name, config) if config is not None else None
  if field:
    suggestions.append(f"config.{field}")
  hint = f" (did you mean {' or '.join('--' + flag for flag in suggestions)}?)"
  if not suggestions:
    suggestions = absl_helpers.get_flag_suggestions(name, built_in)
    hint = (f" (only absl's own flags are close: {', '.join('--' + flag for flag in suggestions)})"
            if suggestions else "")
  fields = "; a config's settings are --config.FIELD=VALUE flags" if takes_config else ""
  return f"--{name} is not a flag of this command{hint}; --help lists its flags{fields}"


def _flag_error(e: BaseException, argv: list[str]) -> str:
  """The line of a flag mistake (config_flags words several of them as
  tracebacks or as errors of the config file's own)."""
  # config_flags raises AttributeError or KeyError for an unknown --config.*
  # field, with ml_collections' "did you mean" in the message.
  message = str(e.args[0]) if e.args else str(e)
  if isinstance(e, OSError):
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return f"--config: {lines[-1] if lines else e}"
  if isinstance(e, ImportError):
    return (f"--config: the config file's import failed ({type(e).__name__}: {e}); the "
            "shipped configs import from bertjax.configs (docs/configs.md)")
  if isinstance(e, (AttributeError, KeyError)):
    locked = re.search(r'Key "([^"]+)" does not exist and cannot be added', message)
    name = locked.group(1) if locked else (re.findall(r"'([^'\\]+)", message) or ["?"])[0]
    suggestion = re.search(r'Did you mean "([^"]+)"', message)
    if locked and not suggestion:  # a locked config lists its fields instead
      fields = re.findall(r"'(\w+)'\s*:", message.replace("\\'", "'"))
      close = difflib.get_close_matches(name, fields, 1)
      suggestion = re.search(r"(.+)", close[0]) if close else None
    given = [arg.split("=")[0] for arg in argv[1:] if arg.startswith("--config.")
             and name in arg.split("=")[0].split(".")]
    hint = f" (did you mean {suggestion.group(1)!r}?)" if suggestion else ""
    config = config_files.given_config(argv) if given else None
    elsewhere = (config_files.field_for(given[0][len("--config."):], config)
                 if config is not None else None)
    if elsewhere:
      hint = f" (did you mean --config.{elsewhere}?)"
    return (f"{given[0] if given else '--config'}: the config has no field {name!r}{hint}"
            "; docs/configs.md lists the fields")
  if len(message) > 1 and message[0] == message[-1] == "'":
    message = message[1:-1]
  # config_flags folds a config file's own traceback into its message: keep
  # the flag's part and the error line ("ValueError: ...").
  lines = [line.strip() for line in message.replace("\\n", "\n").splitlines()
           if line.strip()]
  if len(lines) > 1:
    found = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line)]
    message = f"{lines[0]} {found[-1] if found else lines[-1]}"
  return message
