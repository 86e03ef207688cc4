"""The cores other processes keep busy, read from /proc, against real work:
a process outside this one's tree that spends a second of CPU counts as
others', this process's own child doing the same does not."""

import os
import subprocess
import sys
import time

from bertjax import cpu_load

# A second of CPU time, however long that takes on a busy machine; then a
# file says it is done.
_SPIN = "import sys, time\nwhile time.process_time() < 1.0: pass\nopen(sys.argv[1], 'w').close()\n"
# Starts the spinner and exits at once: the spinner goes to init, out of this tree.
_LAUNCH = "import subprocess, sys\nsubprocess.Popen([sys.executable, *sys.argv[1:]])\n"


def _window(work):
  """Samples around `work()`; returns (before, after)."""
  before = cpu_load.sample()
  work()
  return before, cpu_load.sample()


def test_a_process_elsewhere_counts_and_this_ones_children_do_not(tmp_path):
  spin, done = tmp_path / "spin.py", tmp_path / "done"
  spin.write_text(_SPIN)

  def elsewhere():
    subprocess.run([sys.executable, "-c", _LAUNCH, str(spin), str(done)], check=True)
    while not done.exists():
      time.sleep(0.05)

  before, after = _window(elsewhere)
  assert cpu_load.other_cores(before, after) * (after.wall - before.wall) > 0.95
  assert after.own - before.own < 0.6  # the launcher's start, not the spinning
  before, after = _window(lambda: subprocess.run(
      [sys.executable, str(spin), str(tmp_path / "again")], check=True))
  assert after.own - before.own > 0.95
  assert cpu_load.cores() == os.cpu_count()


def test_too_short_a_window_or_no_sample_gives_no_figure():
  first = cpu_load.sample()
  assert cpu_load.other_cores(first, cpu_load.sample()) is None  # under 0.1 s
  assert cpu_load.other_cores(None, first) is None and cpu_load.other_cores(first, None) is None
