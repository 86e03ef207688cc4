"""The environment of the processes tests start: CPU devices, fast compiles."""

import os

# LLVM's optimisation off: half the compile time of the tiny models, results
# within rounding (a comparison of runs has both sides compiled alike; an
# exact comparison across shardings does not hold at this level, so tests in
# the pytest process keep XLA's default).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0"


def xla_flags(devices: int) -> str:
  return f"{FAST_COMPILE_FLAGS} --xla_force_host_platform_device_count={devices}"


def cpu_env(devices: int, **extra: str) -> dict[str, str]:
  """This process's environment with `devices` CPU devices (and `extra`)."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["XLA_FLAGS"] = xla_flags(devices)
  env.update(extra)
  return env
