"""Stop requests during training (bertjax.signals.StopRequests): the moment a
SIGTERM lands is noted as it lands, on one process and on several, where
JAX's own handler takes the signal for its preemption sync point and must
still hear it, even after Python's handlers were installed again over it."""

import subprocess
import sys

import pytest

from tests.tasks.test_pretrain import ROOT, _free_port

# SIGTERM lands while the main thread waits for the device (as for a step);
# prints how late `signalled` is against the signal, what was requested, and
# the step at which JAX's sync point was reached (-1: never).
_RUN = """
import os, signal, sys, threading, time
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils
from bertjax import signals, usage

usage.stop_as_ctrl_c()  # as every command starts: Python's own SIGTERM handler first
multi_process = sys.argv[1] == "jax.distributed"
if multi_process:  # JAX's preemption notifier installs its SIGTERM handler
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  with signals.installing_jax_sigterm():  # as bertjax.main starts it
    jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=1, process_id=0)
  # Python's handlers installed again after JAX's (as holding signals around a
  # critical section or starting a worker pool does) replace it in C.
  with usage.signals_held():
    pass
step = jax.jit(lambda x: jax.lax.fori_loop(0, 300, lambda i, y: jnp.tanh(y @ y), x))
x = jnp.ones((500, 500)) / 500
step(x).block_until_ready()
with signals.StopRequests(multi_process=multi_process) as stop:
  stop.begin_training()
  sent = []

  def send():
    time.sleep(0.2)
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=send).start()
  while not sent:
    step(x).block_until_ready()
  synced = -1
  for s in range(100):
    if multi_process and multihost_utils.reached_preemption_sync_point(s):
      synced = s
      break
    time.sleep(0.05)
print(stop.signalled - sent[0], stop.requested, synced, flush=True)
"""


@pytest.mark.parametrize("processes", ["one", "jax.distributed"])
def test_the_moment_a_sigterm_lands_is_noted_while_the_main_thread_waits(processes):
  result = subprocess.run([sys.executable, "-c", _RUN, processes, str(_free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  late, requested, synced = result.stdout.split()
  assert requested == "SIGTERM"
  assert float(late) < 0.1, result.stdout  # the grace is counted from here
  if processes == "jax.distributed":
    assert int(synced) >= 0, "JAX's own SIGTERM handler did not hear the signal"
