"""Which errors a command says in one line (bertjax.errors), decided by what they are."""

import errno
import subprocess
import sys

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
