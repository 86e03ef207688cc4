"""Where a pre-training run resumes (bertjax.tasks.pretrain_resume), on two
real JAX processes: a step damaged on one host is set aside by both, which
resume from the same older step; a failure other than damage on any host
ends both with its status, the host that found damage too."""

import os
import subprocess
import sys

import pytest

from tests.tasks.test_pretrain import ROOT, _free_port

# One of two processes restoring steps 20 and 10. Its checkpoints' storage is
# a stand-in that fails as the case says for this process on step 20 ("-":
# reads back); step 10 reads back on both.
_PROCESS = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from bertjax import checkpoint, usage
from bertjax.tasks import pretrain_resume

process_id, port, workdir, *cases = sys.argv[1:]


class Storage:
  directory = os.path.join(workdir, "checkpoints")

  def __init__(self):
    self.steps = [10, 20]

  def all_steps(self):
    return list(self.steps)

  def restore(self, step, target):
    case = cases[jax.process_index()] if step == 20 else "-"
    if case == "damaged":
      raise checkpoint.DamagedCheckpointError(f"step {step}: a file is cut short")
    if case == "outage":
      raise TimeoutError()
    if case == "bug":
      raise RuntimeError("an index out of range")
    return f"state {step}", None, None

  def move_aside(self, steps, aside):
    self.steps = [s for s in self.steps if s not in steps]

  def reload(self):
    pass


def main():
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                             process_id=int(process_id))
  state, _ = pretrain_resume.restore_newest(Storage(), None, workdir)
  print(f"resumed: {state}", flush=True)


usage.run(main)
"""


@pytest.mark.parametrize("cases,status", [
    (("damaged", "-"), 0),  # one host's damage: both set step 20 aside
    (("damaged", "outage"), 42),  # damage beside an outage: both wait for a restart
    (("outage", "damaged"), 42),
    (("damaged", "bug"), 1),
], ids=["damaged-on-one", "damaged-and-outage", "outage-and-damaged", "damaged-and-bug"])
def test_hosts_resume_from_one_step_or_end_alike(cases, status, tmp_path):
  port = _free_port()
  processes = [subprocess.Popen(
      [sys.executable, "-c", _PROCESS, str(i), str(port), str(tmp_path), *cases], cwd=ROOT,
      env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in range(2)]
  try:
    outputs = [p.communicate(timeout=120) for p in processes]
  finally:
    for process in processes:
      process.kill()
  assert [p.returncode for p in processes] == [status, status], outputs
  if status == 0:
    assert all("resumed: state 10\n" in out for out, _ in outputs), outputs
    assert "DAMAGED CHECKPOINT: step 20" in outputs[0][1]
