r"""Copies a run's log into its workdir as it is written, and how the run ended.

  python -m bertjax.tools.ship_log --log=~/bertjax-logs/r1.log \
      --to=gs://bucket/run/logs/r1/worker-0 --until_pid=4127 --status_file=~/bertjax-logs/r1.status

Started by `launch/worker.sh` beside each run on a TPU worker: a worker's disk
goes with the slice (a preemption, a recreation, `delete.sh`), and with it the
one record of why a run stopped. The log's new lines are appended to
`<to>.log` every `--every_s` seconds (on `gs://`, each batch is composed onto
the object: the log is never uploaded again whole). Once the process
`--until_pid` has ended, the rest follows, and `<to>.json` says how the run
ended: its exit status (from `--status_file`), the last training step it
logged, and why (`finished`, `stopped to be resumed`, the error's line, ...).
`launch/logs.sh --workdir=...` reads both when the slice is gone.

A run resumed after a restart of its host goes on in the same log, and its
copier goes on from what `<to>.log` holds already. A SIGTERM (the host going
down) sends what is left and stops, with no `<to>.json`: the run has not ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time

from absl import flags

from bertjax import files, metrics, paths, usage

_LOG = paths.DEFINE_path("log", None, "The log file to copy, as it grows.", required=True)
_TO = paths.DEFINE_path("to", None, "Where it goes, without the extension: <to>.log and "
                        "<to>.json (local or gs://).", required=True)
_UNTIL_PID = flags.DEFINE_integer("until_pid", None, "Copy until this process has ended.",
                                  required=True)
_STATUS_FILE = paths.DEFINE_path("status_file", None, "The run's exit status, once written.")
_EVERY_S = flags.DEFINE_float("every_s", 30.0, "Seconds between two copies of new lines.")

_STEP = re.compile(r"\bstep (\d+)/(\d+)\b")
# What an exit status says (bertjax.main's, worker.sh's).
_REASONS = {0: "finished", 130: "interrupted (Ctrl-C)",
            143: "stopped to be resumed (a preemption notice, or launch/stop.sh)"}


def _running(pid: int) -> bool:
  """Whether process `pid` still runs (a zombie, ended and not yet reaped, does not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return True


def ending(log_tail: str, status: int | None) -> dict[str, object]:
  """How a run ended, from its exit status and the end of its log: the last
  training step it logged and why it stopped."""
  # A last line with no newline was cut as it was written: its step count may
  # be cut too ("step 12/4" of "step 12/400").
  whole = log_tail if log_tail.endswith("\n") else log_tail.rpartition("\n")[0]
  steps = _STEP.findall(whole)
  lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("error: ")]
  if status is None:
    reason = "ended without an exit status (its shell was killed)"
  elif status in _REASONS:
    reason = _REASONS[status]
  elif status == 2 and errors:
    reason = errors[-1]
  else:
    last = next((line for line in reversed(lines) if not line.startswith("worker.sh:")), "")
    reason = f"failed (exit {status}): {last}" if last else f"failed (exit {status})"
  return {"exit_status": status, "last_step": int(steps[-1][0]) if steps else None,
          "total_steps": int(steps[-1][1]) if steps else None, "reason": reason}


_COMPARED = 4096  # bytes of the copy's end compared with the log's


def _shipped(target: str, log: str) -> int:
  """The bytes of `log` that `target` holds already: an earlier copier's, before
  this host restarted (0 when `target` is not a copy of this log's start: its
  end differs from the log's bytes there, or the log is shorter).

  A copy of another log (the host came back with a new disk) that ends in part
  of a line, as a copier stopped mid-way leaves it, gets that line ended, so
  that this log's first line starts a line of its own.
  """
  import fsspec

  fs, name = fsspec.core.url_to_fs(target)
  try:
    size = fs.size(name)
  except FileNotFoundError:
    return 0
  if size == 0:
    return 0
  tail = fs.cat_file(name, start=max(0, size - _COMPARED), end=size)
  if os.path.exists(log) and os.path.getsize(log) >= size:
    with open(log, "rb") as f:
      f.seek(size - len(tail))
      if f.read(len(tail)) == tail:
        return size
  if not tail.endswith(b"\n"):
    return -1
  return 0


def ship(log: str, to: str, until_pid: int, status_file: str | None, every_s: float,
         stop: threading.Event | None = None) -> dict[str, object] | None:
  """Copies `log` to `<to>.log` until `until_pid` ends, then writes `<to>.json`.

  Returns what `<to>.json` says, or None when `stop` was set first (the host is
  going down: what was copied is kept, and the run has not ended).
  """
  stop = stop or threading.Event()
  offset, tail = _shipped(f"{to}.log", log), ""
  target = metrics.AppendFile(f"{to}.log", flush_every_s=every_s)
  if offset < 0:  # a copy of another log, cut mid-line: this one starts a line
    target.append(b"\n")
    offset = 0
  try:
    while True:
      running = _running(until_pid) and not stop.is_set()
      if os.path.exists(log):
        with open(log, "rb") as f:
          f.seek(offset)
          data = f.read()
        if data:
          offset += len(data)
          target.append(data)
          tail = (tail + data.decode("utf-8", "replace"))[-20_000:]
      if not running:
        break
      stop.wait(min(every_s, 1.0))
  finally:
    target.close()
  if stop.is_set():
    return None
  status = None
  if status_file and os.path.exists(status_file):
    text = open(status_file, encoding="utf-8").read().strip()
    status = int(text) if text.lstrip("-").isdigit() else None
  record = {"host": socket.gethostname(), "log": f"{to}.log", "ended": time.strftime(
      "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **ending(tail, status)}
  files.write_text(f"{to}.json", json.dumps(record, indent=2) + "\n")
  return record


def main(argv):
  del argv
  stop = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the host going down
  ship(_LOG.value, _TO.value, _UNTIL_PID.value, _STATUS_FILE.value, _EVERY_S.value, stop)


if __name__ == "__main__":
  usage.run_main(main)
