"""Agreement between the hosts of a run (bertjax.hosts.agree), on two real JAX
processes: whichever host fails, and however its error is worded, every host
ends the command with the same exit status, the one the failure's class
gives (docs/troubleshooting.md: 42 restarts a JobSet, 2 and 1 end it)."""

import os
import subprocess
import sys

import pytest

from bertjax import workdir_lock
from tests.tasks.test_pretrain import ROOT, _free_port

# One of the two processes: it meets the failure named for it ("-": none),
# then every process agrees, as a command does (`usage.run`).
_PROCESS = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from bertjax import errors, hosts, usage, workdir_lock

process_id, port, workdir, *cases = sys.argv[1:]


def failure(case):
  if case == "outage":  # what gcsfs raises when a request times out: no message
    return TimeoutError()
  if case == "lock":  # the workdir is held by another live run
    with workdir_lock.hold(workdir):
      return None
  if case == "config":
    return errors.UsageError("--config.train.batch_size=12: not a multiple of 8 devices")
  if case == "bug":
    return RuntimeError("an index out of range")
  return None


def main():
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                             process_id=int(process_id))
  try:
    error = failure(cases[jax.process_index()])
  except Exception as e:
    error = e
  hosts.agree(error, "starting the run")
  print("agreed: no failure", flush=True)


usage.run(main)
"""


@pytest.mark.parametrize("cases,status", [
    (("outage", "-"), 42), (("-", "outage"), 42),  # a restart can cure it: all restart
    (("lock", "-"), 2), (("-", "config"), 2),  # a person must act: all end for good
    (("-", "bug"), 1),  # a bug: its traceback on its host, one line on the others
    (("outage", "config"), 2),  # one host's final failure ends every host
], ids=["outage-on-0", "outage-on-1", "lock-refused", "bad-config", "bug", "outage-and-config"])
def test_every_host_ends_with_the_status_of_the_failure(cases, status, tmp_path):
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  port = _free_port()
  with workdir_lock.hold(workdir):  # another live run holds it (case "lock")
    processes = [subprocess.Popen(
        [sys.executable, "-c", _PROCESS, str(i), str(port), workdir, *cases], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
      stderr = [p.communicate(timeout=120)[1] for p in processes]
    finally:
      for process in processes:
        process.kill()
  assert [p.returncode for p in processes] == [status, status], stderr
  failed = [i for i, case in enumerate(cases) if case != "-"]
  for process, text in enumerate(stderr):
    if cases[process] == "bug":
      assert "Traceback" in text and "RuntimeError: an index out of range" in text, text
      continue
    lines = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in text, text
    if process not in failed:
      assert f"starting the run failed on process {failed[0]} of 2" in lines[0], text
