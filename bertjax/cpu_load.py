"""How much of the machine's CPU other processes take while a run trains.

Linux counts, in `/proc/stat`, the time every core spent busy since boot
(the hypervisor's "steal", time another virtual machine had the core, is
counted as busy), and in `/proc/<pid>/stat` the time each process spent: the
machine's busy time less this process's and its children's (the loader's
worker processes) over a window is what the rest of the machine took, in
cores. Elsewhere (no `/proc`) there is no figure.
"""

from __future__ import annotations

import dataclasses
import os
import time

# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest
# guest_nice. Busy is all but idle and iowait; guest time is already in user.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclasses.dataclass(frozen=True)
class Sample:
  """CPU seconds at one moment: the machine's busy time (all cores) and this
  process tree's."""

  wall: float
  machine_busy: float
  own: float


def cores() -> int:
  """The machine's cores (those `/proc/stat` counts)."""
  return os.cpu_count() or 1


def sample() -> Sample | None:
  """The CPU seconds so far, or None where `/proc` cannot tell."""
  try:
    with open("/proc/stat", encoding="ascii") as f:
      fields = f.readline().split()
    ticks = float(os.sysconf("SC_CLK_TCK"))
    busy = sum(int(fields[1 + i]) for i in _BUSY_FIELDS) / ticks
    own = _tree_ticks(os.getpid()) / ticks
  except (OSError, ValueError, IndexError):
    return None
  return Sample(time.perf_counter(), busy, own)


def other_cores(before: Sample | None, after: Sample | None) -> float | None:
  """The cores other processes kept busy, on average, between two samples
  (None without both, or over too short a time to count: 0.1 s)."""
  if before is None or after is None or after.wall - before.wall < 0.1:
    return None
  others = (after.machine_busy - before.machine_busy) - (after.own - before.own)
  return max(others, 0.0) / (after.wall - before.wall)


def _tree_ticks(pid: int) -> int:
  """Clock ticks of `pid`, its threads and children, live or waited for."""
  with open(f"/proc/{pid}/stat", encoding="ascii") as f:
    # The command name (field 2) may hold spaces: count from its closing ')'.
    after_name = f.read().rsplit(")", 1)[1].split()
  # utime, stime, cutime, cstime: fields 14-17 of the line, 12-15 after the name.
  total = sum(int(value) for value in after_name[11:15])
  for child in _children(pid):
    try:
      total += _tree_ticks(child)
    except (OSError, ValueError, IndexError):  # it ended meanwhile
      pass
  return total


def _children(pid: int) -> list[int]:
  children: list[int] = []
  try:
    threads = os.listdir(f"/proc/{pid}/task")
  except OSError:
    return children
  for thread in threads:
    try:
      with open(f"/proc/{pid}/task/{thread}/children", encoding="ascii") as f:
        children += [int(child) for child in f.read().split()]
    except OSError:  # a thread that ended, or a kernel without the file
      pass
  return children
