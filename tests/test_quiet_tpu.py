"""The `[tpu]` extra on a machine without TPU chips: commands run on the CPU
without the TPU runtime's errors about the TPU it does not find."""

import importlib.util
import os
import subprocess
import sys

import pytest

from bertjax import platforms
from tests import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = ("TPU_WORKER_HOSTNAMES", "host bounds", "libtpu", "E0000", "InitGoogle")

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu (the [tpu] extra) is not installed")


def _env():
  env = {k: v for k, v in os.environ.items()
         if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
  return env


def _noise(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if any(n in line for n in NOISE)]


@needs_libtpu
def test_a_command_on_a_cpu_machine_prints_no_tpu_errors(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/glue.py:sst2",
       f"--workdir={tmp_path / 'run'}", f"--config.data.dir={tmp_path / 'none'}"],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
  assert "Process 0 of 1" in result.stderr  # JAX started (on the CPU)
  assert _noise(result.stderr) == [], result.stderr[-3000:]


@needs_libtpu
def test_the_compile_tool_prints_no_tpu_errors(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.tools.compile", "--config=configs/demo.py",
       "--topology=v5litepod-8", "--eval=false"],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '"device_kind": "TPU v5 lite"' in result.stdout
  assert _noise(result.stderr) == [], result.stderr[-3000:]


# The README's "From Python" use, as a script or notebook cell runs it.
_LIBRARY_USE = """
import bertjax
bundle = bertjax.load_pretrained({directory!r})
features = bertjax.encode(bundle, ["The cat sat."], max_length=16)
print("devices", __import__("jax").devices(), features["pooled_output"].shape)
"""


@needs_libtpu
@pytest.mark.parametrize("jax_first", [False, True], ids=["bertjax_first", "jax_imported_first"])
def test_the_library_in_a_script_prints_no_tpu_errors(tmp_path, jax_first):
  directory = reference.write_tiny_checkpoint(tmp_path / "bert")
  script = ("import jax\n" if jax_first else "") + _LIBRARY_USE.format(directory=directory)
  result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "devices [CpuDevice(id=0)" in result.stdout and "(1, 32)" in result.stdout
  assert _noise(result.stderr) == [], result.stderr[-3000:]


@needs_libtpu
def test_a_jax_the_script_started_itself_is_left_as_it_is(tmp_path):
  script = "import jax; jax.devices()\nimport bertjax; print(jax.config.jax_platforms)"
  result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
  assert result.stdout.strip() == "None", result.stderr[-3000:]


@needs_libtpu
def test_a_command_started_by_a_process_that_started_libtpu_runs_on_the_cpu(tmp_path):
  """libtpu, started off a TPU machine (a notebook importing JAX with the
  extra), leaves placeholders in TPU_WORKER_ID and the like, which the
  commands it starts inherit: they run on the CPU as any other."""
  parent = ("import subprocess, sys, jax; jax.devices(); "
            "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
  result = subprocess.run(
      [sys.executable, "-c", parent, sys.executable, "-m", "bertjax.main",
       "--config=configs/glue.py:sst2", f"--workdir={tmp_path / 'run'}",
       f"--config.data.dir={tmp_path / 'none'}"],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
  assert "Process 0 of 1," in result.stderr, result.stderr[-3000:]  # not a TPU host
  assert "config.data.dir must hold the sst2 TSVs" in result.stderr


def test_libtpus_placeholders_are_no_sign_of_a_tpu(monkeypatch):
  for name in ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(platforms.glob, "glob", lambda pattern: [])
  monkeypatch.setattr(platforms.os.path, "isdir", lambda path: False)
  monkeypatch.setenv("TPU_WORKER_ID", "WARNING: could not determine TPU worker number, please "
                     "set env var `TPU_WORKER_ID` manually")
  assert not platforms.tpu_chips_here()
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
  assert platforms.tpu_chips_here()


def _pci_device(root, name: str, vendor: str, device: str) -> None:
  os.makedirs(root / name)
  (root / name / "vendor").write_text(vendor + "\n")
  (root / name / "device").write_text(device + "\n")


def test_tpu_chips_on_the_pci_bus_are_found_as_jax_finds_them(tmp_path):
  """A TPU VM that shows its chips as /dev/vfio/N alone, without TPU_*
  variables, is still a TPU machine: `import bertjax` there must not pin JAX
  to the CPU. Google's other devices (gVNIC) are no TPU."""
  _pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0042")  # gVNIC
  _pci_device(tmp_path, "0000:00:05.0", "0x8086", "0x0063")  # another vendor
  (tmp_path / "0000:00:06.0").mkdir()  # no vendor file
  assert platforms.tpu_pci_devices(str(tmp_path)) == 0
  for slot in range(4):
    _pci_device(tmp_path, f"0000:00:1{slot}.0", "0x1ae0", "0x006f")  # v6e
  assert platforms.tpu_pci_devices(str(tmp_path)) == 4
  assert platforms.tpu_pci_devices(str(tmp_path / "none")) == 0
  # JAX's own table of TPU device ids: every one is known here.
  from jax._src import hardware_utils
  assert set(hardware_utils._TPU_PCI_DEVICE_IDS) <= platforms._TPU_PCI_DEVICES
  assert hardware_utils._GOOGLE_PCI_VENDOR_ID == platforms._GOOGLE_PCI_VENDOR


def test_the_platforms_are_left_to_the_user_and_to_tpu_machines(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name: object() if name == "libtpu" else None)
  for env, chips, expected in [({}, False, "cpu"), ({"JAX_PLATFORMS": "tpu"}, False, "tpu"),
                               ({}, True, None)]:
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    for key, value in env.items():
      monkeypatch.setenv(key, value)
    monkeypatch.setattr(platforms, "tpu_chips_here", lambda chips=chips: chips)
    platforms.keep_jax_off_absent_tpus()
    assert os.environ.get("JAX_PLATFORMS") == expected
