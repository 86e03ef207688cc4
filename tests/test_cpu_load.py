"""The cores other processes keep busy, read from /proc, against real work:
a process outside this one's tree that spends a second of CPU counts as
others', this process's own child doing the same does not, and neither does
work on a core this process may not use."""

import json
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
# Held to one CPU, samples while another process spins on another CPU.
_PINNED = """
import json, os, sys, time
from bertjax import cpu_load
os.sched_setaffinity(0, {int(sys.argv[1])})
def everything():
  with open("/proc/stat") as f:
    fields = f.readline().split()
  return sum(int(fields[1 + i]) for i in (0, 1, 2, 5, 6, 7)) / os.sysconf("SC_CLK_TCK")
before, machine = cpu_load.sample(), everything()
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):
  time.sleep(0.05)
after, machine = cpu_load.sample(), everything() - machine
print(json.dumps({"cores": cpu_load.cores(), "wall": after.wall - before.wall, "machine": machine,
                  "mine": after.machine_busy - before.machine_busy}))
"""


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
  assert cpu_load.cores() == len(os.sched_getaffinity(0))


def test_a_live_child_is_this_runs_where_the_kernel_does_not_list_children(tmp_path,
                                                                              monkeypatch):
  """Without /proc/<pid>/task/<tid>/children (gVisor, CONFIG_PROC_CHILDREN
  off), the children are found by the parent each process names."""
  spin, done = tmp_path / "spin.py", tmp_path / "done"
  spin.write_text(_SPIN)
  monkeypatch.setattr(cpu_load, "_listed_children", lambda pid: [])  # such a kernel
  monkeypatch.setattr(cpu_load, "_parents", cpu_load._children_by_parent)
  before = cpu_load.sample()
  child = subprocess.Popen([sys.executable, str(spin), str(done)])
  assert child.pid in cpu_load._children_by_parent()[os.getpid()]
  while not done.exists():
    time.sleep(0.05)
  after = cpu_load.sample()  # the spinner is still alive: not waited for yet
  child.wait()
  assert after.own - before.own > 0.95


def test_a_core_this_process_may_not_use_is_not_counted(tmp_path):
  """Held to one CPU (taskset, a container's cpuset), a run counts one core,
  and a process spinning on the other CPU is not among the others on its own."""
  first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
  assert first != last  # a machine of two CPUs or more
  spin, started, done = tmp_path / "spin.py", tmp_path / "started", tmp_path / "done"
  spin.write_text(f"import os\nos.sched_setaffinity(0, {{{last}}})\n" + _SPIN)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  pinned = subprocess.Popen([sys.executable, "-c", _PINNED, str(first), str(started), str(done)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": root})
  while not started.exists():
    time.sleep(0.05)
  subprocess.run([sys.executable, str(spin), str(done)], check=True)
  seen = json.loads(pinned.communicate(timeout=60)[0])
  assert seen["cores"] == 1
  # The whole machine's busy time holds the spinner's second on the other
  # CPU; what the pinned process counts does not, and cannot pass one core.
  assert seen["machine"] - seen["mine"] > 0.9
  assert seen["mine"] <= 1.05 * seen["wall"] + 0.05


def test_a_cgroup_cpu_quota_caps_the_cores(tmp_path, monkeypatch):
  """docker --cpus, a systemd CPUQuota: cgroup v2's cpu.max of the process's
  group or a parent's, the tightest, rounded up to whole cores."""
  (tmp_path / "cgroup").write_text("0::/outer/inner\n")
  root = tmp_path / "fs"
  (root / "outer" / "inner").mkdir(parents=True)
  (root / "outer" / "inner" / "cpu.max").write_text("max 100000\n")
  monkeypatch.setattr(cpu_load, "_PROC_CGROUP", str(tmp_path / "cgroup"))
  monkeypatch.setattr(cpu_load, "_CGROUP_ROOT", str(root))
  monkeypatch.setattr(cpu_load, "_allowed_cpus", lambda: set(range(8)))
  assert cpu_load.cores() == 8  # no quota
  (root / "outer" / "cpu.max").write_text("150000 100000\n")
  assert cpu_load.cores() == 2
  (root / "outer" / "inner" / "cpu.max").write_text("50000 100000\n")
  assert cpu_load.cores() == 1
  monkeypatch.setattr(cpu_load, "_allowed_cpus", lambda: {3})
  (root / "outer" / "cpu.max").write_text("400000 100000\n")
  (root / "outer" / "inner" / "cpu.max").write_text("max 100000\n")
  assert cpu_load.cores() == 1  # the affinity is tighter
