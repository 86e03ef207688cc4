"""The container recipe (launch/Dockerfile): what it installs and the layout it
runs in. Docker itself is not here; the layout is rebuilt as the image has it:
the package installed from a wheel, and the workload's directory holding only
the configs."""

import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dockerfile():
  return open(os.path.join(ROOT, "launch", "Dockerfile"), encoding="utf-8").read()


def test_the_recipe_installs_the_tpu_extra_in_a_python_bertjax_supports():
  recipe = _dockerfile()
  base = re.search(r"^FROM python:(\d+)\.(\d+)", recipe, re.M)
  assert base and (int(base.group(1)), int(base.group(2))) >= (3, 11)
  assert 'pip install ".[tpu]"' in recipe
  # Every file it copies is in the build context (.dockerignore leaves it in).
  ignored = [line.strip() for line in open(os.path.join(ROOT, ".dockerignore"))
             if line.strip() and not line.startswith("#")]
  for source in re.findall(r"^COPY (.+) \S+$", recipe, re.M):
    for name in source.split():
      assert os.path.exists(os.path.join(ROOT, name)), name
      assert name not in ignored, name
  # The workload's directory (the last WORKDIR) must not hold a bertjax/ that
  # would hide the installed package: only the configs and the launch files.
  final = recipe[recipe.rindex("WORKDIR"):]
  assert re.findall(r"^COPY (\S+)", final, re.M) == ["configs", "launch"]


def test_in_the_images_layout_the_shipped_configs_load(tmp_path):
  site = tmp_path / "site"
  install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--no-build-isolation", f"--target={site}", ROOT],
                           capture_output=True, text=True, timeout=600)
  assert install.returncode == 0, install.stderr[-3000:]
  shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)
  app = tmp_path / "app"
  shutil.copytree(os.path.join(ROOT, "configs"), app / "configs")
  check = ("import bertjax, bertjax.configs.large_pretrain as c; "
           "print(bertjax.__file__); print(c.get_config('lamb').train.batch_size)")
  result = subprocess.run([sys.executable, "-c", check], cwd=app, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(site)})
  assert result.returncode == 0, result.stderr[-3000:]
  package, batch = result.stdout.split()
  assert package.startswith(str(site)) and batch == "32768"
  loads = subprocess.run([sys.executable, "-m", "bertjax.main", "--helpshort"], cwd=app,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(site)})
  assert loads.returncode == 0 and "--workdir" in loads.stdout, loads.stderr[-3000:]


def test_every_build_command_builds_for_the_tpu_hosts():
  """TPU hosts are x86-64: the build commands in the recipe and in the docs
  name the platform, so that one run on an ARM machine builds an image the
  hosts can run."""
  docs = open(os.path.join(ROOT, "docs", "tpu.md"), encoding="utf-8").read()
  builds = [line for text in (_dockerfile(), docs) for line in text.splitlines()
            if "docker build" in line]
  assert len(builds) >= 2
  assert all("--platform=linux/amd64" in line for line in builds), builds
