"""launch/xpk.sh against the real `xpk` package's dry run: the JobSet it would
apply (no cluster needed), checked against bertjax's own view of the slices.

xpk pins its dependencies strictly, so it gets a virtual environment of its
own (tests/launch/xpk_env.py).
"""

import os
import subprocess

import pytest
import yaml

from tests.launch.xpk_env import XPK_VERSION, xpk_executable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = "us-docker.pkg.dev/my-project/images/bertjax:1"


@pytest.fixture(scope="module")
def xpk():
  """The path of an `xpk` executable of its own virtual environment."""
  executable = xpk_executable()
  if executable is None:
    pytest.skip(f"xpk {XPK_VERSION} could not be installed from PyPI here")
  return executable


def _submit(xpk, tmp_path, *args):
  manifest = tmp_path / "jobset.yaml"
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--dry-run", "--project=my-project",
       "--zone=us-central2-b", "--cluster=bert", f"--image={IMAGE}",
       "--config=configs/large_pretrain.py:lamb", "--workdir=gs://my-bucket/runs/large",
       f"--manifest={manifest}", *args],
      capture_output=True, text=True, timeout=300, cwd=tmp_path,
      env={**os.environ, "BERTJAX_XPK": xpk})
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return yaml.safe_load(manifest.read_text()), result.stdout


@pytest.mark.parametrize("tpu_type,slices", [("v4-32", 1), ("v5litepod-16", 2),
                                             ("v5p-64", 1), ("v6e-16", 2)])
def test_the_workload_runs_bertjax_on_every_host_of_every_slice(xpk, tmp_path, tpu_type,
                                                               slices):
  from bertjax import topology
  from bertjax.configs import large_pretrain
  from bertjax.tools import compile as compile_tool

  jobset, printed = _submit(xpk, tmp_path, f"--tpu-type={tpu_type}", f"--num-slices={slices}",
                            "--workload=bert-large", "--max-restarts=7", "--spot", "--",
                            "--config.data.dir=gs://my-bucket/data/wiki")
  assert jobset["kind"] == "JobSet" and jobset["metadata"]["name"] == "bert-large"
  assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 7
  (job,) = jobset["spec"]["replicatedJobs"]
  pod = job["template"]["spec"]["template"]["spec"]
  (container,) = pod["containers"]
  assert container["image"] == IMAGE
  assert ("python3 -m bertjax.main --config=configs/large_pretrain.py:lamb "
          "--workdir=gs://my-bucket/runs/large --config.data.dir=gs://my-bucket/data/wiki"
          in container["command"][-1])
  assert pod["terminationGracePeriodSeconds"] == 300  # time to save on a preemption
  # The slices and hosts are those bertjax compiles the run for.
  tpu_slice = topology.parse(tpu_type)
  hosts, chips_per_host = job["template"]["spec"]["parallelism"], int(
      container["resources"]["limits"]["google.com/tpu"])
  assert job["replicas"] == slices and hosts == tpu_slice.hosts
  assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "x".join(
      map(str, tpu_slice.shape))
  config = large_pretrain.get_config("lamb")
  target = compile_tool.make_target(config, tpu_type, slices)
  assert target.hosts == slices * hosts and target.chips == slices * hosts * chips_per_host
  assert dict(target.mesh.shape)["data"] * dict(target.mesh.shape)["fsdp"] == target.chips
  assert "kubectl apply" in printed  # what xpk would do, not done


def test_a_preemption_restarts_the_workload_and_an_error_to_mend_ends_it(xpk, tmp_path):
  """xpk restarts on exit codes 42 and 127-255: bertjax exits 143 after saving
  on a preemption's SIGTERM (a restart resumes it), 2 on an error to mend and 1
  on a bug (a restart would end the same way)."""
  jobset, _ = _submit(xpk, tmp_path, "--tpu-type=v5litepod-16")
  (job,) = jobset["spec"]["replicatedJobs"]
  (rule,) = job["template"]["spec"]["podFailurePolicy"]["rules"]
  assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "NotIn"
  restarted = set(rule["onExitCodes"]["values"])
  assert {143, 137} <= restarted and not {0, 1, 2} & restarted
  assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 10  # the default


@pytest.mark.parametrize("args,message", [
    (["--tpu-type=v4-8"], "missing --image"),
    ([f"--image={IMAGE}"], "missing --tpu-type"),
    ([f"--image={IMAGE}", "--tpu-type=v4-8", "--workload=Bert_Large"],
     "--workload takes lower-case letters"),
    ([f"--image={IMAGE}", "--tpu-type=v4-8", "--spot", "--on-demand"], "choose one of"),
])
def test_settings_to_mend_are_one_line(args, message, tmp_path):
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "xpk.sh"), "--dry-run", "--project=p",
       "--zone=z", "--cluster=c", "--config=configs/demo.py", "--workdir=gs://b/r", *args],
      capture_output=True, text=True, timeout=60, cwd=tmp_path,
      env={k: v for k, v in os.environ.items() if not k.startswith("BERTJAX_")})
  assert result.returncode == 2 and message in result.stderr, result.stderr
