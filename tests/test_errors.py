"""Which errors a command says in one line (bertjax.errors), decided by what they are."""

import errno
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from bertjax import errors, usage


def test_worded_errors_are_one_line_and_bugs_keep_their_traceback():
  assert errors.one_line(errors.UsageError("set --config.x=1")) == "set --config.x=1"
  # Raised by bertjax itself but not worded: a bug, whatever frame raised it.
  assert errors.one_line(ValueError("invalid literal for int()")) is None
  assert errors.one_line(KeyError("params")) is None
  assert usage.is_usage_error(errors.CorruptFileError("x"))
  # The standard bases stay, for callers that catch them.
  assert isinstance(errors.MissingFileError("x"), FileNotFoundError)
  assert isinstance(errors.StorageFullError("x"), OSError)
  assert isinstance(errors.TrainingStoppedError("x"), FloatingPointError)


def test_the_operating_systems_file_errors_are_the_users_to_mend(tmp_path):
  with pytest.raises(OSError) as error:
    open(tmp_path / "missing.txt", encoding="utf-8")
  assert errors.one_line(error.value) == f"{tmp_path / 'missing.txt'}: No such file or directory"
  assert errors.one_line(OSError(errno.EIO, "Input/output error")) is None  # not the user's


def test_a_full_disk_is_found_anywhere_in_the_chain_and_named(tmp_path):
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))
    except OSError as e:
      raise RuntimeError("the writer failed") from e
  except RuntimeError as chained:
    line = errors.one_line(chained)
  assert line.startswith(f"writing {tmp_path / 'x'} failed: the disk is full (")
  assert "free of" in line and "free space on that disk" in line
  # A library's text (tensorstore, array_record) counts too.
  assert errors.storage_full(RuntimeError("write() failed: No space left on device; ..."))
  with pytest.raises(errors.StorageFullError, match="quota is exhausted.*raise the quota"):
    with errors.writing(str(tmp_path / "out"), "nothing was written"):
      raise OSError(errno.EDQUOT, "Disk quota exceeded")
  with pytest.raises(ValueError, match="^other$"):  # not a full disk: as it was
    with errors.writing(str(tmp_path / "out"), "nothing was written"):
      raise ValueError("other")


@pytest.mark.parametrize("code,what,advice", [
    (errno.EFBIG, "a file reached the largest size its file system takes",
     "write to a file system that takes larger files"),
    (errno.EROFS, "the file system is read-only", "write elsewhere, or remount it writable"),
    (errno.EIO, "the storage reported an input/output error", "check that disk or mount"),
    (errno.ESTALE, "the network file system's handle went stale", "remount it"),
])
def test_every_write_the_storage_refuses_is_one_line(tmp_path, code, what, advice):
  """Not only a full disk: whatever the machine's disks, mounts or limits
  refuse a write with is said in one line, by its errno or a library's text."""
  out = str(tmp_path / "out")
  for raised in (OSError(code, os.strerror(code)),
                 RuntimeError(f"write() failed: {os.strerror(code)}; writing {out}/.x.tmp")):
    with pytest.raises(errors.StorageWriteError) as error:
      with errors.writing(out, "nothing was written"):
        raise raised
    line = str(error.value)
    assert line.startswith(f"writing {out} failed: {what}") and f"; {advice}" in line, line
    assert line.endswith(", then rerun the same command; nothing was written"), line
    assert errors.exit_status(error.value) == errors.USAGE_EXIT_CODE
  # Outside a writer, a named file is enough; an input/output error without
  # one may be a read's, and is not said as a write's.
  named = errors.one_line(OSError(code, os.strerror(code), str(tmp_path / "x")))
  if code in (errno.EIO, errno.ESTALE):  # a read's as well: said of the file, not as a write
    assert named.startswith(f"{tmp_path / 'x'}: {what}") and "writing" not in named, named
    assert errors.one_line(OSError(code, os.strerror(code))) is None
  else:
    assert named.startswith(f"writing {tmp_path / 'x'} failed: {what}"), named


def test_a_file_size_limit_says_the_limit_and_what_makes_files_smaller(tmp_path, monkeypatch):
  monkeypatch.setattr(errors, "_file_size_limit", lambda: 150 << 10)
  with pytest.raises(errors.StorageWriteError) as error:
    with errors.writing(str(tmp_path), "the shards finished before are kept",
                        smaller="build smaller shards (more --num_shards)"):
      raise OSError(errno.EFBIG, "File too large")
  assert str(error.value) == (
      f"writing {tmp_path} failed: a file reached this process's file-size limit (150.0 KiB, "
      "ulimit -f); raise the limit (ulimit -f unlimited), or build smaller shards (more "
      "--num_shards), then rerun the same command; the shards finished before are kept")
  assert not isinstance(error.value, errors.StorageFullError)
  assert isinstance(error.value, errors.StorageError) and isinstance(error.value, OSError)


@pytest.mark.parametrize("raised,code,line", [
    ("errors.UsageError('set x')", 2, "error: set x (--verbosity=1 shows where)"),
    ("ValueError('a bug')", 1, None),
    ("KeyboardInterrupt()", 130, "error: interrupted (Ctrl-C): nothing was left half-written"),
])
def test_a_command_says_a_worded_error_in_one_line_and_a_bug_with_its_traceback(
    raised, code, line):
  script = ("from bertjax import errors, usage\n"
            f"def main(argv):\n  raise {raised}\n"
            "usage.run_main(main)\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == code, result.stderr
  if line is None:
    assert "Traceback" in result.stderr and "ValueError: a bug" in result.stderr
  else:
    assert result.stderr.strip().splitlines() == [line]
  verbose = subprocess.run([sys.executable, "-c", script, "--verbosity=1"],
                           capture_output=True, text=True, timeout=120)
  assert "Traceback" in verbose.stderr  # every traceback, with --verbosity=1


def _chained(cause, error):
  try:
    try:
      raise cause
    except BaseException as e:
      raise error from e
  except BaseException as chained:
    return chained


def test_the_exit_status_says_whether_a_restart_can_cure_it():
  """42 (xpk and launch/run.sh restart) for storage that did not answer, 2 for
  what a person must mend, None (a traceback, 1) for a bug."""
  from gcsfs.retry import HttpError
  from google.api_core import exceptions

  restart, mend = errors.RESTART_EXIT_CODE, errors.USAGE_EXIT_CODE
  assert (restart, mend) == (42, 2)
  assert errors.exit_status(errors.StorageUnreachableError("x")) == restart
  for cause in (ConnectionRefusedError(111, "Connection refused"),
                TimeoutError("timed out"),
                HttpError({"code": 503, "message": "Service Unavailable"}),
                HttpError({"code": 429, "message": "rate limited"}),
                exceptions.ServiceUnavailable("backend"),
                ValueError("UNAVAILABLE: tensorstore write failed")):
    error = _chained(cause, errors.StorageError("saving step 30 failed"))
    assert errors.exit_status(error) == restart, cause
    assert errors.exit_status(cause) == restart, cause
    assert "did not answer" in errors.one_line(cause)
  for refused in (HttpError({"code": 403, "message": "Forbidden"}),
                  exceptions.NotFound("no bucket"),
                  OSError(errno.ENOSPC, "No space left on device", "/x")):
    assert errors.exit_status(_chained(refused, errors.StorageError("x"))) == mend, refused
  assert errors.exit_status(errors.WorkdirBusyError("held")) == mend
  assert errors.exit_status(errors.UsageError("x")) == mend
  assert errors.exit_status(KeyError("params")) is None


def test_a_workdir_whose_storage_does_not_answer_exits_42_in_one_line(tmp_path):
  """Nothing listens at the emulator's address: the run waits --storage_wait_s
  for it, then exits 42, which supervisors restart on."""
  from tests.gcs import free_port

  url = f"http://127.0.0.1:{free_port()}"
  env = {**__import__("os").environ, "STORAGE_EMULATOR_HOST": url,
         "TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x",
         "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
  result = subprocess.run([sys.executable, "-m", "bertjax.main", "--config=configs/demo.py",
                           "--workdir=gs://bertjax-test/run", "--storage_wait_s=5"],
                          capture_output=True, text=True, timeout=300, env=env,
                          cwd=__import__("os").path.dirname(__import__("os").path.dirname(
                              __import__("os").path.abspath(__file__))))
  assert result.returncode == 42, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "did not answer" in last, last
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_a_held_block_ends_the_command_after_it(signum):
  """A Ctrl-C (SIGTERM, SIGHUP) that lands while JAX's extensions start is
  acted on once they have: raised inside one it can crash Python."""
  previous = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
  try:
    _held_then_raised(signum)
  finally:
    for n, handler in previous.items():
      signal.signal(n, handler)


def _held_then_raised(signum):
  usage.stop_as_ctrl_c()
  before = signal.getsignal(signal.SIGINT)
  done = []
  with pytest.raises(KeyboardInterrupt) as stopped:
    with usage.signals_held():
      os.kill(os.getpid(), signum)
      time.sleep(0.05)  # the handler runs here: held, not raised
      done.append(True)
  assert done == [True]
  assert getattr(stopped.value, "signum", signal.SIGINT) == signum
  assert signal.getsignal(signal.SIGINT) is before  # the handlers as they were


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_after_the_work_is_done_does_not_end_the_command_by_it(signum):
  """The command has done its work and is exiting (here: slowly): a signal
  then would end it by the signal (a supervisor reruns on 130, 143, 129)."""
  script = ("import atexit, sys, time\nfrom bertjax import usage\n"
            "def main(argv):\n  atexit.register(time.sleep, 3)\n"
            "  print('done', flush=True)\n"
            "usage.run_main(main)\n")
  process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  assert process.stdout.readline() == "done\n"
  time.sleep(0.3)  # out of main: exiting
  sent = time.monotonic()
  process.send_signal(signum)
  _, stderr = process.communicate(timeout=60)
  assert process.returncode == 0, stderr
  assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
  assert time.monotonic() - sent > 2  # its exit went on as it was, not cut by the signal


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one_line(args, cwd, timeout=120):
  """(exit status, the one line on stderr) of `python -m args` run in `cwd`."""
  result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
  # (A run logs a line as JAX starts: the error is the one line that says error.)
  lines = [line for line in result.stderr.splitlines() if not re.match(r"[IW]\d{4} ", line)]
  assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.returncode, lines[0]


# Each command with a required flag, run without it, and the line it says.
_LEFT_OUT = {
    "bertjax.main": (["--config=configs/demo.py"], "error: --workdir is required: checkpoints, "
                     "metrics and the resolved config go here"),
    "bertjax.tools.compile": (["--config=configs/demo.py"], "error: --topology is required: "
                              "gcloud accelerator type"),
    "bertjax.tools.sweep": (["--config=configs/glue.py:mrpc"], "error: --workdir is required: "
                            "where the runs and the tables go"),
    "bertjax.tools.convert": ([], "error: --input and --output are required: --input: model "
                              "directory"),
    "bertjax.tools.plot": (["--runs=a"], "error: --output is required: the PNG to write"),
    "bertjax.tools.train_vocab": (["--input=demo:stdlib"], "error: --output is required: "),
    "bertjax.tools.prepare_pretraining_data": (
        [], "error: --input, --output_dir and --vocab are required: --input: "),
    "bertjax.tools.ship_log": (["--log=x", "--to=y"], "error: --until_pid is required: copy "
                               "until this process has ended"),
    "bertjax.tools.evaluate_squad": (["dev.json"], "error: pred.json is required: the "
                                     "predictions a run wrote"),
}


def test_every_command_with_a_required_flag_is_checked_here():
  tools = os.path.join(ROOT, "bertjax", "tools")
  with_required = {f"bertjax.tools.{name[:-3]}" for name in os.listdir(tools)
                   if name.endswith(".py") and re.search(
                       r"required=True|mark_flags?_as_required|import argparse",
                       open(os.path.join(tools, name), encoding="utf-8").read())}
  assert with_required | {"bertjax.main"} == set(_LEFT_OUT)


@pytest.mark.parametrize("module", sorted(_LEFT_OUT))
def test_a_required_flag_left_out_is_named_with_what_it_is_for(module, tmp_path):
  """Not as the config file's mistake ("get_config returned None")."""
  args, says = _LEFT_OUT[module]
  code, line = _one_line([module, *args], tmp_path)
  assert code == 2 and line.startswith(says), line


@pytest.mark.parametrize("args,says", [
    (["bertjax.main"], "error: --config and --workdir are required: --config: the run's config "
     "file, e.g. configs/demo.py"),
    (["bertjax.tools.config_fields"], "error: --config is required: the config whose fields"),
])
def test_every_flag_left_out_is_named(tmp_path, args, says):
  code, line = _one_line(args, tmp_path)
  assert code == 2 and line.startswith(says), line


@pytest.mark.parametrize("given,meant", [
    ("configs/dmeo.py", "configs/demo.py"),                       # misspelt
    ("config/demo.py", "configs/demo.py"),                        # another folder
    (os.path.join("somewhere", "demo.py"), "configs/demo.py"),
    ("configs/glue:mrpc", "configs/glue.py:mrpc"),                # without .py
    ("configs/glue/mrpc", "configs/glue.py:mrpc"),
    ("configs/squad.v2.0", "configs/squad.py:v2.0"),
    ("my_config.py", None),                                       # nothing like a shipped one
])
def test_a_config_path_that_names_no_file_lists_the_shipped_ones(tmp_path, given, meant):
  code, line = _one_line(["bertjax.main", f"--config={given}", "--workdir=run"], tmp_path)
  assert code == 2
  assert line.startswith(f"error: --config={given}: no such file under {tmp_path}"), line
  assert (f"(did you mean {meant}?)" in line) == (meant is not None), line
  assert "; the shipped configs are configs/base_pretrain.py, configs/demo.py, " in line
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args,says", [
    (["bertjax.main", "--config=configs/demo.py", "--worksdir=run"], "(did you mean --workdir?)"),
    # A config's field, as other BERT code names it.
    (["bertjax.main", "--config=configs/demo.py", "--steps=100"],
     "(did you mean --config.train.total_steps?)"),
    (["bertjax.main", "--config=configs/demo.py", "--train_batch_size=64"],
     "(did you mean --config.train.batch_size?)"),
    (["bertjax.main", "--config=configs/demo.py", "--workdir=run",
      "--config.train.num_train_steps=100"], "(did you mean --config.train.total_steps?)"),
    # absl's --run_with_pdb is as close to --run as --runs is: the command's own first.
    (["bertjax.tools.plot", "--run=a"], "(did you mean --runs?); --help lists its flags"),
    (["bertjax.tools.benchmark", "--step=3"], "(did you mean --steps?)"),
    # Nothing of the command's is close: absl's own, said as such.
    (["bertjax.main", "--config=configs/demo.py", "--run_with=1"],
     "(only absl's own flags are close: --run_with_pdb, --run_with_profiling)"),
])
def test_an_unknown_flag_suggests_the_commands_own_flags_first(tmp_path, args, says):
  code, line = _one_line(args, tmp_path)
  assert code == 2 and line.startswith("error: --") and says in line, line
  assert ("run_with_pdb" in line) == ("run_with=" in " ".join(args)), line


_CONFIG_FILES = {"none.py": "def get_config(arg=None):\n  config = {'task': 'pretrain'}\n",
                 "typo.py": "def get_config(arg=None):\n  return seeed\n"}


@pytest.mark.parametrize("args,says", [
    (["--config", "none.py"], "error: --config: none.py's get_config returned None: return the "
     "ml_collections.ConfigDict it builds"),
    (["--config", "typo.py"], "typo.py, line 2, column 10: NameError: name 'seeed' is not "
     "defined; correct the config file"),
    (["--config", "configs/demo.py", "--steps=100"], "(did you mean --config.train.total_steps?)"),
    (["--config", "configs/demo.py", "--config.train.num_train_steps=100"],
     "(did you mean --config.train.total_steps?)"),
], ids=["returned-none", "file-line", "flag-as-field", "field-of-other-code"])
def test_a_config_given_as_two_words_is_told_as_one_given_with_equals(tmp_path, args, says):
  """`--config PATH`, from a directory of the user's own (the shipped configs
  found all the same): the same lines as `--config=PATH` gives."""
  for name, text in _CONFIG_FILES.items():
    (tmp_path / name).write_text(text)
  result = subprocess.run([sys.executable, "-m", "bertjax.main", *args, "--workdir=run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
  lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert len(lines) == 1 and says in lines[0], result.stderr[-3000:]


def test_a_refused_run_leaves_no_empty_workdir_and_keeps_one_that_was_there(tmp_path):
  """Refused after its workdir was made (the mesh does not fit the devices):
  the folders it made go; a workdir that existed before stays, as it was."""
  refused = ["bertjax.main", "--config=configs/demo.py", "--config.mesh.data=3"]
  code, line = _one_line([*refused, f"--workdir={tmp_path / 'new' / 'run'}"], tmp_path,
                         timeout=300)
  assert code == 2 and "mesh sizes" in line, line
  assert os.listdir(tmp_path) == []
  (tmp_path / "mine").mkdir()
  code, _ = _one_line([*refused, f"--workdir={tmp_path / 'mine'}"], tmp_path, timeout=300)
  assert code == 2 and os.listdir(tmp_path) == ["mine"]
  assert os.listdir(tmp_path / "mine") == []


def test_only_empty_folders_the_block_made_are_removed(tmp_path):
  from bertjax import files

  with pytest.raises(ValueError):
    with files.removed_if_left_empty(str(tmp_path / "a" / "b")):
      with files.empty_folders_removed(str(tmp_path / "a" / "b")):
        os.makedirs(tmp_path / "a" / "b" / "c")
        (tmp_path / "a" / "kept.txt").write_text("x")
        raise ValueError("refused")
  assert sorted(os.listdir(tmp_path / "a")) == ["kept.txt"]  # b and c were empty
  with files.removed_if_left_empty(str(tmp_path / "d")):
    os.makedirs(tmp_path / "d")
  assert os.path.isdir(tmp_path / "d")  # a run that ends well keeps its workdir


def test_a_refused_run_leaves_nothing_in_a_gs_workdir(gcs, tmp_path):
  """On gs:// a folder is the objects under it: the lock is the run's only
  one, and it goes when the run is refused."""
  from bertjax import files

  workdir = gcs.url_of("errors/refused")
  code, line = _one_line(["bertjax.main", "--config=configs/demo.py", "--config.mesh.data=3",
                          f"--workdir={workdir}"], tmp_path, timeout=300)
  assert code == 2 and "mesh sizes" in line, line
  assert not files.exists(workdir) and not files.isdir(workdir)
