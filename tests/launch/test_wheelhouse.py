"""Installing on workers that reach no internet: launch/wheelhouse.sh gathers
uv, a Python build and every wheel bertjax[tpu] needs, and setup.sh
--wheelhouse installs from it alone. Run for real here: the wheelhouse is built
from PyPI (this machine reaches it; it reaches no GitHub and no Python build
download), and the workers' install runs with every network request refused."""

import os
import subprocess
import sys
import sysconfig
import tarfile

import pytest

from tests.launch.test_scripts import HOST, ROOT, _gcloud_stub, _script

_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
# Every HTTP(S) request goes to a port where nothing listens.
_NO_NETWORK = {name: "http://127.0.0.1:9" for name in (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")}


def _python_archive(path):
  """This machine's CPython as a build in python-build-standalone's
  install_only layout (python/bin, python/lib, python/include), without its
  site-packages: the stand-in for the build uv downloads, which this machine
  cannot reach."""
  prefix = sys.base_prefix
  skip = ("site-packages", "__pycache__", os.sep + "test" + os.sep, "idlelib", "tkinter",
          "config-" + _VERSION)

  def keep(info):
    return None if any(s in info.name + os.sep for s in skip) or info.name.endswith(".a") \
        else info

  with tarfile.open(path, "w:gz", compresslevel=1) as tar:
    for folder in ("bin", "lib", "include"):
      tar.add(os.path.join(prefix, folder), f"python/{folder}", filter=keep)
  assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "patchlevel.h"))


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
  """A wheelhouse for bertjax[tpu], in a folder that stands for the bucket."""
  root = tmp_path_factory.mktemp("wheelhouse")
  archive = root / f"cpython-{_VERSION}-test.tar.gz"
  _python_archive(archive)
  bucket = root / "bucket"
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "wheelhouse.sh"), f"--to={bucket}/wh",
       f"--python={_VERSION}", f"--python-archive={archive}"],
      capture_output=True, text=True, cwd=root, timeout=900)
  assert result.returncode == 0, result.stderr
  return bucket


def test_the_wheelhouse_holds_uv_a_python_and_every_requirement(wheelhouse):
  names = os.listdir(wheelhouse / "wh")
  assert any(n.startswith("uv-") and n.endswith(".whl") for n in names)
  for package in ("jax-", "jaxlib-", "libtpu-", "flax-", "orbax_checkpoint-", "grain-",
                  "setuptools-"):
    assert any(n.startswith(package) for n in names), package
  assert (wheelhouse / "wh" / "python-version").read_text() == _VERSION + "\n"
  assert (wheelhouse / "wh" / "complete").exists()  # put in place whole
  assert not (wheelhouse / "wh.partial").exists()
  assert "@WHEELHOUSE@/python/cpython-" in (wheelhouse / "wh" / "python-downloads.json"
                                            ).read_text()


def test_setup_installs_from_the_wheelhouse_with_no_network(wheelhouse, tmp_path):
  """setup.sh --wheelhouse's worker command, run here with every request
  refused: the wheelhouse comes from the bucket (the stand-in gcloud copies
  the folder), uv from its wheel, the Python from the wheelhouse's build, and
  bertjax[tpu] from its wheels; the Python that results imports bertjax."""
  env = _gcloud_stub(tmp_path, f"""case "$*" in
  *"tpu-vm scp"*) cp "$5" "$HOME/bertjax.tar.gz" ;;
  *"tpu-vm ssh"*) remote "$@" ;;
  *"storage rsync"*) cp -r "{wheelhouse}/${{4#gs://bucket/}}/." "$5" ;;
esac""") | _NO_NETWORK
  result = _script("setup.sh", "--wheelhouse=gs://bucket/wh", env=env, cwd=tmp_path,
                   timeout=900)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith(
      f"{HOST}: Python {sys.version.split()[0]} in ~/bertjax-venv, from gs://bucket/wh")
  assert (f"storage rsync --recursive gs://bucket/wh {tmp_path}/bertjax-wheelhouse"
          in (tmp_path / "calls.txt").read_text().splitlines())
  python = tmp_path / "bertjax-venv" / "bin" / "python"
  # uv's own copy of the Python, made from the wheelhouse's build.
  assert os.path.realpath(python).startswith(str(tmp_path / ".local" / "share" / "uv"))
  result = subprocess.run(
      [str(python), "-c", "import bertjax.main, jax, libtpu; print(bertjax.__file__)"],
      capture_output=True, text=True, cwd="/", timeout=300, env=env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == str(tmp_path / "bertjax" / "bertjax" / "__init__.py")


def test_a_wheelhouse_that_is_not_there_is_a_clear_failure(tmp_path):
  env = _gcloud_stub(tmp_path, """case "$*" in
  *"tpu-vm scp"*) cp "$5" "$HOME/bertjax.tar.gz" ;;
  *"tpu-vm ssh"*) remote "$@" ;;
  *"storage rsync"*) echo "ERROR: gs://bucket/none not found" >&2; exit 1 ;;
esac""") | _NO_NETWORK
  result = _script("setup.sh", "--wheelhouse=gs://bucket/none", env=env, cwd=tmp_path)
  assert result.returncode == 1
  assert "installing on the workers of bert from gs://bucket/none failed" in result.stderr
  assert "Private Google Access" in result.stderr


def test_an_incomplete_wheelhouse_is_refused_before_anything_is_installed(tmp_path):
  """A bucket whose wheelhouse.sh was interrupted has no 'complete' marker."""
  partial = tmp_path / "bucket" / "wh"
  partial.mkdir(parents=True)
  (partial / "requirements.txt").write_text("jax==0.10.2\n")
  env = _gcloud_stub(tmp_path, f"""case "$*" in
  *"tpu-vm scp"*) cp "$5" "$HOME/bertjax.tar.gz" ;;
  *"tpu-vm ssh"*) remote "$@" ;;
  *"storage rsync"*) cp -r "{partial}/." "$5" ;;
esac""") | _NO_NETWORK
  result = _script("setup.sh", "--wheelhouse=gs://bucket/wh", env=env, cwd=tmp_path)
  assert result.returncode == 1
  assert "gs://bucket/wh is not a whole wheelhouse (no 'complete' marker)" in result.stderr
  assert not (tmp_path / "bertjax-venv").exists()


@pytest.mark.parametrize("args,message", [
    (["--wheelhouse=/tmp/wh"], "--wheelhouse takes a gs:// path"),
    (["--wheelhouse=gs://b/wh", "--python=3.12"], "a wheelhouse has its own Python"),
])
def test_setup_refuses_a_wheelhouse_it_cannot_use(args, message):
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "setup.sh"), "--dry-run", "--project=p",
       "--zone=z", "--name=n", *args], capture_output=True, text=True, timeout=60)
  assert result.returncode == 2 and message in result.stderr, result.stderr


def test_wheelhouse_refuses_an_archive_that_is_not_a_python_build(tmp_path):
  archive = tmp_path / "not-python.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(__file__, "python/README")
  result = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "wheelhouse.sh"), f"--to={tmp_path}/wh",
       "--python=3.11", f"--python-archive={archive}", "--extras="],
      capture_output=True, text=True, timeout=600)
  assert result.returncode != 0
  assert "is not a CPython 3.11 build in the install_only layout" in result.stderr
