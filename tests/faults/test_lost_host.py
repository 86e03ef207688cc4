"""A host of a multi-host run lost (killed with -9, as a node that is gone):
the others end with a status that supervisors restart on, never 0, 1 or 2
(docs/troubleshooting.md's table: xpk restarts on 127-255)."""

import signal
import subprocess
import sys

from tests.faults.test_training import _tiny, _wait_for_step
from tests.tasks.test_pretrain import ROOT, _env, _free_port


def test_the_host_left_after_process_0_is_lost_ends_restartably(prepared_dir, tmp_path):
  workdir = str(tmp_path / "run")
  args = _tiny(workdir, prepared_dir, **{"train.total_steps": 100_000,
                                         "checkpoint.every_steps": 50, "eval.every_steps": 0})
  port = _free_port()
  log = str(tmp_path / "log1")
  processes = [subprocess.Popen(
      args + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
              f"--process_id={i}"],
      cwd=ROOT, env={**_env(devices=2), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"},
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if i == 0 else open(log, "w"))
      for i in range(2)]
  try:
    _wait_for_step(processes[0], workdir, 20)
    processes[0].kill()  # the node of process 0 (and JAX's coordinator) is gone
    code = processes[1].wait(timeout=300)
  finally:
    for process in processes:
      process.kill()
  # JAX's distributed service aborts the survivor: a container's shell reports
  # 128 + SIGABRT = 134, which xpk's JobSet and launch/run.sh restart.
  assert code == -signal.SIGABRT, open(log).read()[-3000:]
  assert "another task died" in open(log).read()
