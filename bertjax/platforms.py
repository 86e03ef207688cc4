"""Which platform JAX starts on, decided before it starts.

A machine without TPU chips runs JAX on its CPU even where libtpu is installed
(the `[tpu]` extra, which the compile tool needs): left to choose, JAX starts
the TPU runtime, which prints warnings and errors about the TPU it does not
find ("Failed to find host bounds", a source location trace; with two
processes, a lock file). Every command and the library itself
(`import bertjax`) keep JAX on the CPU there; a platform the user chose, a TPU
machine and a GPU plugin are left as they are.

Imports nothing heavy: it runs before JAX is imported.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

# JAX's GPU plugins: where one is installed, JAX chooses among the platforms.
_GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm7_plugin")


def tpu_chips_here() -> bool:
  """Whether this machine is a Cloud TPU VM (or a GKE TPU node), judged
  without starting JAX.

  libtpu started off a TPU machine (a notebook that imported JAX with the
  `[tpu]` extra) writes placeholders into these variables ("WARNING: could not
  determine TPU worker number, ..."), which the commands it starts inherit:
  those are no sign of a TPU.
  """
  return (any(not os.environ.get(name, "WARNING:").startswith("WARNING:")
              for name in ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE"))
          or bool(glob.glob("/dev/accel*")) or os.path.isdir("/dev/vfio/devices")
          or tpu_pci_devices() > 0)


# Google's PCI vendor id, and the device ids of its TPU chips (v3, v4, v5p,
# v5e, v6e, TPU7x and one unnamed), as JAX finds TPUs itself: a VM that shows
# its chips only as /dev/vfio/N is still a TPU VM. (Google's other PCI
# devices, gVNIC and its NVMe disks, are no TPU.)
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f",
                              "0x0076"})


def tpu_pci_devices(root: str = "/sys/bus/pci/devices") -> int:
  """The TPU chips attached to this machine through PCI (0 off Linux)."""
  chips = 0
  for device in glob.glob(os.path.join(root, "*")):
    try:
      with open(os.path.join(device, "vendor"), encoding="ascii") as f:
        vendor = f.read().strip()
      if vendor != _GOOGLE_PCI_VENDOR:
        continue
      with open(os.path.join(device, "device"), encoding="ascii") as f:
        chips += f.read().strip() in _TPU_PCI_DEVICES
    except (OSError, UnicodeDecodeError):
      continue  # a device without these files, or one that went away
  return chips


def _tpu_runtime_would_start_in_vain() -> bool:
  """libtpu is installed, no TPU is here, and nothing else decides."""
  return not (tpu_chips_here() or importlib.util.find_spec("libtpu") is None
              or any(importlib.util.find_spec(name) for name in _GPU_PLUGINS))


def keep_jax_off_absent_tpus() -> None:
  """Sets `JAX_PLATFORMS=cpu` where the TPU runtime would start in vain (see
  above), unless the user set `JAX_PLATFORMS`. Only before JAX is imported:
  the variable is read then, and the commands it starts inherit it."""
  if "JAX_PLATFORMS" not in os.environ and _tpu_runtime_would_start_in_vain():
    os.environ["JAX_PLATFORMS"] = "cpu"


def keep_library_jax_off_absent_tpus() -> None:
  """`keep_jax_off_absent_tpus` for `import bertjax` in a script or notebook.

  Before JAX is imported, as for a command. Where the script imported JAX
  first, its platforms setting is made the CPU instead, as long as JAX has
  started no backend and the script set no platforms of its own; a JAX that is
  running is left alone.
  """
  if "jax" not in sys.modules:
    keep_jax_off_absent_tpus()
    return
  if "JAX_PLATFORMS" in os.environ or not _tpu_runtime_would_start_in_vain():
    return
  jax = sys.modules["jax"]
  try:
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):  # a JAX of another layout: left as it is
    return
  if not started and not jax.config.jax_platforms:
    jax.config.update("jax_platforms", "cpu")
