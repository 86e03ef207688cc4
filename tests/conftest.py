"""Test setup: 8 fake CPU devices, float32 matmuls, quiet logs.

The environment is set before anything imports jax, so sharding tests see a
mesh of 8 devices on any machine.
"""

import os
import time

# (The runs tests start compile faster: tests/envs.py. In here XLA optimises
# as it does for users: the numerics tests see what users get.)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the test session's processes (the
# runs a test starts and reruns compile the same steps again and again).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    __import__("tempfile").gettempdir(), f"bertjax-tests-jax-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# gcsfs's gRPC bucket-layout probe, which the storage emulator does not serve
# (see tests/gcs.py); read when gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import jax  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def write_corpus(path, num_documents=120, seed=0):
  """Documents of 2-12 sentences of words from the test vocabulary."""
  from tests import reference

  rng = np.random.default_rng(seed)
  words = [w for w in reference.vocab_tokens() if w.isalpha() and w.islower() and len(w) > 2]
  lines = []
  for _ in range(num_documents):
    for _ in range(rng.integers(2, 13)):
      lines.append(" ".join(rng.choice(words, rng.integers(3, 15))) + ".")
    lines.append("")
  path.write_text("\n".join(lines) + "\n")
  return path


def corpus_and_vocab(root, num_documents):
  """(corpus file, the test vocabulary's file), written into `root`."""
  from tests import reference

  vocab = str(root / "vocab.txt")
  reference.write_vocab(vocab)
  return str(write_corpus(root / "corpus.txt", num_documents=num_documents)), vocab


def staging_files(directory):
  """Staging files and directories under `directory`: what a writer left half-done."""
  return [name for root, dirs, names in os.walk(directory) for name in dirs + names
          if ".tmp-" in name or "orbax-checkpoint-tmp" in name]


def modes_not_the_umasks(directory, umask=None):
  """Files and directories under `directory` (itself included) whose mode is
  not the one the umask gives new ones: 0644 and 0755 under 022."""
  if umask is None:
    umask = os.umask(0)
    os.umask(umask)
  wrong = []
  for root, _, names in os.walk(directory):
    paths = [(root, 0o777)] + [(os.path.join(root, n), 0o666) for n in names]
    wrong += [f"{path}: {oct(os.stat(path).st_mode & 0o777)}" for path, mode in paths
              if os.stat(path).st_mode & 0o777 != mode & ~umask]
  return wrong


def process_group_gone(pid, timeout=30):
  """Whether every process of the session `pid` leads has ended (waiting up
  to `timeout` seconds): a command left no worker behind."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    try:
      os.killpg(pid, 0)
    except ProcessLookupError:
      return True
    time.sleep(0.1)
  return False


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory):
  """A small prepared pre-training directory (the test vocabulary, 120 documents)."""
  from bertjax.data import builder
  from bertjax.data.tokenizers import WordPieceTokenizer
  from tests import reference

  root = tmp_path_factory.mktemp("prepared")
  vocab = root / "vocab.txt"
  reference.write_vocab(str(vocab))
  corpus = write_corpus(root / "corpus.txt")
  out = root / "data"
  builder.prepare(str(corpus), str(out), WordPieceTokenizer(str(vocab)), num_shards=3,
                  show_progress=False)
  return str(out)


@pytest.fixture(scope="session")
def tiny_hf_checkpoint(tmp_path_factory):
  """A Hugging Face BERT directory (L2/H32, random weights, the test vocabulary)."""
  from tests import reference

  return reference.write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_hf"))


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """fake-gcs-server on 127.0.0.1, this process's clients pointed at it, and the
  local cache of remote files in a temporary directory."""
  from tests.gcs import FakeGcs

  server = FakeGcs(str(tmp_path_factory.mktemp("gcs")))
  server.start()
  os.environ.update(server.env)
  os.environ["BERTJAX_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
  yield server
  server.stop()


@pytest.fixture
def absl_caplog(caplog):
  """`caplog` that also sees absl's log lines (INFO and up), whether or not an
  earlier test in this process installed absl's own handler (which stops the
  "absl" logger from propagating to the root logger caplog listens on)."""
  import logging

  logger = logging.getLogger("absl")
  logger.addHandler(caplog.handler)
  level = logger.level
  logger.setLevel(logging.INFO)
  try:
    yield caplog
  finally:
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


@pytest.fixture
def small_disk(tmp_path):
  """`small_disk(size)`: a directory on a tmpfs of `size` (e.g. "4m") that fills
  (ENOSPC), with `fill(leave)` to take all but `leave` bytes of it and `free()`
  to give them back. Mounting needs root (CI runs as root): skipped otherwise."""
  import subprocess

  mounts = []

  class Disk:
    def __init__(self, path):
      self.path = path
      self._filler = os.path.join(path, ".filler")

    def fill(self, leave=0):
      free = os.statvfs(self.path).f_bavail * os.statvfs(self.path).f_frsize
      with open(self._filler, "ab") as f:
        f.write(b"\0" * max(free - leave, 0))

    def free(self):
      if os.path.exists(self._filler):
        os.remove(self._filler)

  def mount(size):
    if os.geteuid() != 0:
      pytest.skip("a small tmpfs needs root to mount (CI runs as root)")
    path = tmp_path / f"disk{len(mounts)}"
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode:
      pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    mounts.append(str(path))
    return Disk(str(path))

  yield mount
  for path in reversed(mounts):
    subprocess.run(["umount", "-l", path], capture_output=True)


def _fast_lane() -> frozenset[str]:
  """The test files of the fast lane (tests/fast_lane.txt), relative to the root."""
  path = os.path.join(os.path.dirname(__file__), "fast_lane.txt")
  with open(path, encoding="utf-8") as f:
    return frozenset(line.strip() for line in f if line.strip() and not line.startswith("#"))


FAST_LANE = _fast_lane()


def pytest_collection_modifyitems(config, items):
  """Marks the tests of the fast lane's files `fast` (`pytest -m fast`)."""
  del config
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for item in items:
    if os.path.relpath(str(item.path), root) in FAST_LANE:
      item.add_marker(pytest.mark.fast)
