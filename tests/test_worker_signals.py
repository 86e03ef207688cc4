"""Worker processes deaf to a terminal's signals from their first instruction,
a resource tracker that survives SIGHUP, and workers that end with their parent.

Each case runs in processes of its own: the masks, handlers and the resource
tracker are process-wide state the test process must keep as it is.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

from bertjax import worker_signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERMINAL = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM}


def _signal_set(pid, field):
  """The signals of `field` (SigBlk, SigIgn) in /proc/PID/status."""
  for line in open(f"/proc/{pid}/status"):
    if line.startswith(field + ":"):
      bits = int(line.split()[1], 16)
      return {signum for signum in signal.Signals if bits >> (signum - 1) & 1}
  raise AssertionError(f"no {field} for {pid}")


def _python(code, **kwargs):
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_process_started_in_the_block_begins_with_the_signals_blocked():
  """Blocked at its start, before Python runs a line of its own (the program
  reads its own mask at once), while this thread gets its mask back."""
  before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
  with worker_signals.blocked_for_children():
    child = _python("print(open('/proc/self/status').read())")
  assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
  out, _ = child.communicate(timeout=60)
  blocked = next(line for line in out.splitlines() if line.startswith("SigBlk:"))
  assert TERMINAL <= {s for s in signal.Signals if int(blocked.split()[1], 16) >> (s - 1) & 1}


def test_a_worker_ignores_the_terminal_and_a_pool_s_worker_keeps_sigterm():
  program = """
      import os, signal, sys, time
      from bertjax import worker_signals
      worker_signals.ignore_in_worker(keep_sigterm=sys.argv[1] == "keep")
      for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        os.kill(os.getpid(), signum)
        time.sleep(0.05)
        print(signal.Signals(signum).name, flush=True)
      """
  for keep, printed, code in (("", "SIGINT SIGHUP SIGTERM", 0), ("keep", "SIGINT SIGHUP", -15)):
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(program), keep], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert (child.returncode, child.stdout.split()) == (code, printed.split()), child.stderr


def test_the_resource_tracker_outlives_the_terminal_s_signals():
  """Multiprocessing's tracker ignores SIGINT and SIGTERM itself; SIGHUP, which
  killed it, stays blocked in it."""
  child = _python("""
      import sys
      from multiprocessing import resource_tracker
      from bertjax import worker_signals
      worker_signals.start_resource_tracker()
      print(resource_tracker._resource_tracker._pid, flush=True)
      sys.stdin.read()  # until the test is done
      """, stdin=subprocess.PIPE)
  try:
    tracker = int(child.stdout.readline())
    deadline = time.time() + 30
    while not {signal.SIGINT, signal.SIGTERM} <= _signal_set(tracker, "SigIgn"):  # started
      assert time.time() < deadline, "the tracker never ignored SIGINT and SIGTERM"
      time.sleep(0.02)
    assert signal.SIGHUP in _signal_set(tracker, "SigBlk")
    for signum in TERMINAL:
      os.kill(tracker, signum)
    time.sleep(0.3)
    assert _alive(tracker)
  finally:
    _, err = child.communicate(input="", timeout=60)
  assert child.returncode == 0 and "Traceback" not in err, err


def _alive(pid):
  """Whether `pid` runs (not ended, not a zombie waiting for its parent)."""
  try:
    return "State:\tZ" not in open(f"/proc/{pid}/status").read()
  except FileNotFoundError:
    return False


def test_a_worker_ends_within_a_poll_of_its_parent_killed_outright():
  parent = _python("""
      import subprocess, sys
      worker = subprocess.Popen([sys.executable, "-c", "from bertjax import worker_signals; "
                                 "worker_signals.exit_with_parent(poll_s=0.05); "
                                 "print('watching', flush=True); import time; time.sleep(60)"])
      print(worker.pid, flush=True)
      worker.wait()
      """)
  worker = int(parent.stdout.readline())
  assert parent.stdout.readline().strip() == "watching"
  parent.kill()
  parent.communicate(timeout=60)
  deadline = time.time() + 10
  while _alive(worker):
    assert time.time() < deadline, "the worker outlived its parent"
    time.sleep(0.05)
