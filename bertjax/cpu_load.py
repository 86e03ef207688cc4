"""How much of the machine's CPU other processes take while a run trains.

Linux counts, in `/proc/stat`, the time each core spent busy since boot (the
hypervisor's "steal", time another virtual machine had the core, is counted
as busy), and in `/proc/<pid>/stat` the time each process spent. Over a window,
the busy time of the cores this process may run on (its CPU affinity: a
`taskset`, a container's cpuset) less this process's and its children's (the
loader's worker processes) is what the rest of the machine took of them, in
cores. Work on cores the run cannot use does not count. A container limited by
a CPU quota (cgroup v2 `cpu.max`, docker `--cpus`) without a cpuset shares its
cores with the host's other processes: what they run there counts. Elsewhere
(no `/proc`) there is no figure.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

# /proc/stat's "cpuN" lines: user nice system idle iowait irq softirq steal guest
# guest_nice. Busy is all but idle and iowait; guest time is already in user.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
# cgroup v2: this process's group ("0::/path" in /proc/self/cgroup), and the
# CPU quota of each group on its way up ("cpu.max": "max 100000" or
# "QUOTA PERIOD", microseconds).
_PROC_CGROUP = "/proc/self/cgroup"
_CGROUP_ROOT = "/sys/fs/cgroup"


@dataclasses.dataclass(frozen=True)
class Sample:
  """CPU seconds at one moment: the busy time of the cores this process may
  use, and this process tree's."""

  wall: float
  machine_busy: float
  own: float


def cores() -> int:
  """The cores this process can keep busy at once: those its affinity allows,
  at most its cgroup's CPU quota (cgroup v2, the tightest of its group's and
  their parents', rounded up)."""
  allowed = len(_allowed_cpus()) or os.cpu_count() or 1
  quota = _cpu_quota()
  return allowed if quota is None else min(allowed, max(1, math.ceil(quota)))


def _cpu_quota() -> float | None:
  """The CPUs' worth of time cgroup v2 allows this process's group (None: no limit)."""
  try:
    with open(_PROC_CGROUP, encoding="ascii") as f:
      group = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
  except OSError:
    return None
  if group is None:
    return None
  quotas = []
  while True:
    try:
      with open(os.path.join(_CGROUP_ROOT, group.lstrip("/"), "cpu.max"),
                encoding="ascii") as f:
        quota, period = f.read().split()[:2]
      if quota != "max":
        quotas.append(int(quota) / int(period))
    except (OSError, ValueError):  # no such file at this level (the root has none)
      pass
    if group in ("", "/"):
      return min(quotas, default=None)
    group = os.path.dirname(group.rstrip("/"))


def sample() -> Sample | None:
  """The CPU seconds so far, or None where `/proc` cannot tell."""
  try:
    allowed = {f"cpu{cpu}" for cpu in _allowed_cpus()}
    busy_ticks, counted = 0, 0
    with open("/proc/stat", encoding="ascii") as f:
      for line in f:
        fields = line.split()
        if fields and fields[0] in allowed:
          busy_ticks += sum(int(fields[1 + i]) for i in _BUSY_FIELDS)
          counted += 1
    if not counted:  # no line for a core this process may use
      return None
    ticks = float(os.sysconf("SC_CLK_TCK"))
    own = _tree_ticks(os.getpid(), _parents()) / ticks
  except (OSError, ValueError, IndexError):
    return None
  return Sample(time.perf_counter(), busy_ticks / ticks, own)


def other_cores(before: Sample | None, after: Sample | None) -> float | None:
  """The cores other processes kept busy, on average, between two samples
  (None without both, or over too short a time to count: 0.1 s)."""
  if before is None or after is None or after.wall - before.wall < 0.1:
    return None
  others = (after.machine_busy - before.machine_busy) - (after.own - before.own)
  return max(others, 0.0) / (after.wall - before.wall)


def _allowed_cpus() -> set[int]:
  """The CPUs this process may run on (empty where the system cannot say)."""
  return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def _tree_ticks(pid: int, parents: dict[int, list[int]] | None) -> int:
  """Clock ticks of `pid`, its threads and children, live or waited for.
  `parents`: each process's children, where the kernel does not list them."""
  with open(f"/proc/{pid}/stat", encoding="ascii") as f:
    # The command name (field 2) may hold spaces: count from its closing ')'.
    after_name = f.read().rsplit(")", 1)[1].split()
  # utime, stime, cutime, cstime: fields 14-17 of the line, 12-15 after the name.
  total = sum(int(value) for value in after_name[11:15])
  children = parents.get(pid, []) if parents is not None else _listed_children(pid)
  for child in children:
    try:
      total += _tree_ticks(child, parents)
    except (OSError, ValueError, IndexError):  # it ended meanwhile
      pass
  return total


def _parents() -> dict[int, list[int]] | None:
  """Each live process's children, by the parent each names in its
  `/proc/<pid>/stat`; None where the kernel lists a process's children itself
  (`/proc/<pid>/task/<tid>/children`, which some kernels and sandboxes lack)."""
  if os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
    return None
  return _children_by_parent()


def _children_by_parent() -> dict[int, list[int]]:
  """Each live process's children, by the parent pid (field 4) of every
  `/proc/<pid>/stat`."""
  parents: dict[int, list[int]] = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", encoding="ascii") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):  # it ended meanwhile
      continue
    parents.setdefault(parent, []).append(int(entry))
  return parents


def _listed_children(pid: int) -> list[int]:
  """`pid`'s children as the kernel lists them for each of its threads."""
  children: list[int] = []
  try:
    threads = os.listdir(f"/proc/{pid}/task")
  except OSError:
    return children
  for thread in threads:
    try:
      with open(f"/proc/{pid}/task/{thread}/children", encoding="ascii") as f:
        children += [int(child) for child in f.read().split()]
    except OSError:  # a thread that ended
      pass
  return children
