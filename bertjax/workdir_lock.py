"""One run per workdir: an exclusive lock, taken before anything is written.

Two runs in one workdir (a relaunch while the old job still runs, a second
terminal) would delete each other's saves in flight and interleave their
metrics. A run therefore holds `<workdir>/run.lock`, which says who holds it
(host, process, command, since when); a second run is refused in one line
naming the holder.

- On a local disk (or any file system with POSIX locks) the lock is the
  operating system's (`flock`): it goes with the process that held it, so a
  crashed or killed run leaves nothing to take over.
- On `gs://` it is an object created only if absent (a generation
  precondition), rewritten every `HEARTBEAT_S` seconds by its holder under a
  precondition on its own generation. A lock whose holder is gone is taken
  over, again under a precondition, so of two runs racing for it one wins:
  gone means a process of this host that no longer runs, or a heartbeat older
  than `STALE_S` seconds. A holder whose lock was taken over (it hung for
  longer than that) stops at once, writing nothing more.

A multi-host run holds the lock once, on process 0 (`bertjax.tasks.run`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Iterator

from absl import logging

from bertjax import errors, files

LOCK_FILE = "run.lock"
HEARTBEAT_S = 30.0
STALE_S = 180.0  # six heartbeats missed
LOST_EXIT_CODE = 2  # a usage error's: the run stopped, its line says why


def _holder() -> dict[str, Any]:
  """Who this process is, as the lock records it."""
  return {"host": socket.gethostname(), "pid": os.getpid(), "boot": _boot_id(),
          "process_start": _process_start(os.getpid()),
          "command": " ".join(sys.argv)[:500], "since": time.time(), "heartbeat": time.time()}


def _boot_id() -> str:
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      return f.read().strip()
  except OSError:
    return ""


def _process_start(pid: int) -> str:
  """The start time of process `pid` in clock ticks since boot ('' if unknown):
  with the boot id, it tells a process from a later one given the same pid."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return ""


def _describe(holder: dict[str, Any] | None) -> str:
  if not holder:
    return "another process (it has not said which yet)"
  since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
  return (f"process {holder.get('pid')} on {holder.get('host')} since {since} "
          f"({holder.get('command') or 'command unknown'})")


def _gone_on_this_host(holder: dict[str, Any]) -> bool:
  """Whether the holder ran on this machine and no longer runs."""
  if holder.get("host") != socket.gethostname() or not holder.get("boot"):
    return False
  if holder["boot"] != _boot_id():
    return True  # the machine restarted since
  pid = holder.get("pid")
  if not isinstance(pid, int):
    return False
  return _process_start(pid) != holder.get("process_start")


class _LocalLock:
  """`flock` on `<workdir>/run.lock`, the holder's description inside."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_FILE)
    self._fd: int | None = None

  def acquire(self) -> None:
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read_json(os.pread(fd, 1 << 16, 0))
        os.close(fd)
        raise errors.WorkdirBusyError(
            f"{os.path.dirname(self.path)} is in use by {_describe(holder)}; wait for that "
            "run to end or stop it, or give another --workdir") from None
      except OSError as e:
        os.close(fd)
        raise errors.StorageError(f"{self.path}: cannot lock the workdir ({e.strerror}); "
                                  "give a --workdir on a disk with file locks") from None
      try:
        current = os.stat(self.path)
      except FileNotFoundError:
        current = None
      locked = os.fstat(fd)
      if current and (current.st_ino, current.st_dev) == (locked.st_ino, locked.st_dev):
        break
      os.close(fd)  # its holder removed the file as we opened it: take the new one
    self._fd = fd
    with errors.writing(self.path, "nothing else was written"):
      os.ftruncate(fd, 0)  # a killed holder's description, longer, may still be there
      os.pwrite(fd, json.dumps(_holder()).encode(), 0)

  def release(self) -> None:
    if self._fd is None:
      return
    # Removed while still locked: a run that opened it meanwhile finds that
    # it locked a file no longer there, and opens the path again.
    try:
      os.remove(self.path)
    except OSError:
      pass
    os.close(self._fd)  # the lock goes with the descriptor
    self._fd = None


def _read_json(data: bytes) -> dict[str, Any] | None:
  try:
    value = json.loads(data.decode("utf-8"))
  except (ValueError, UnicodeDecodeError):
    return None
  return value if isinstance(value, dict) else None


class _RemoteLock:
  """An object `<workdir>/run.lock` on Cloud Storage, written under generation
  preconditions and kept fresh by a heartbeat thread."""

  def __init__(self, workdir: str):
    self.path = files.join(workdir, LOCK_FILE)
    bucket, _, key = self.path[len("gs://"):].partition("/")
    from google.cloud import storage

    self._bucket, self._key = _client(storage).bucket(bucket), key
    self._generation: int | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._holder = _holder()

  def acquire(self) -> None:
    from google.api_core import exceptions

    try:
      self._acquire()
    except (exceptions.GoogleAPICallError, exceptions.RetryError) as e:  # refused, unreachable
      raise errors.StorageError(
          f"{self.path}: cannot lock the workdir ({type(e).__name__}: "
          f"{str(e).splitlines()[0][:300]}); check that this account may write there "
          "(gcloud storage ls the bucket) and that Cloud Storage is reachable") from e

  def _acquire(self) -> None:
    from google.api_core import exceptions

    for _ in range(5):  # a lock released or taken over between two requests
      try:
        self._write(0)  # only if there is no lock object
        break
      except exceptions.PreconditionFailed:
        pass
      except exceptions.NotFound as e:
        raise errors.MissingFileError(
            f"cannot write {self.path}: the bucket does not exist, or this account cannot "
            "see it; create it (gcloud storage buckets create gs://BUCKET "
            "--location=REGION) or correct --workdir") from e
      holder, generation = self._read()
      if generation is None:
        continue  # released meanwhile: try again
      age = time.time() - float((holder or {}).get("heartbeat", 0))
      if holder and not _gone_on_this_host(holder) and age < STALE_S:
        raise errors.WorkdirBusyError(
            f"{self.path.rsplit('/', 1)[0]} is in use by {_describe(holder)}, last heard "
            f"from {age:.0f} s ago; wait for that run to end or stop it, or give another "
            f"--workdir (a lock not renewed for {STALE_S:.0f} s is taken over)")
      try:
        self._write(generation)  # taken over only if nobody else did first
        logging.warning("Took over the workdir lock %s from %s, which is gone (%s)",
                        self.path, _describe(holder),
                        "its process has ended" if holder and _gone_on_this_host(holder)
                        else f"not renewed for {age:.0f} s")
        break
      except exceptions.PreconditionFailed:
        continue
    else:
      raise errors.WorkdirBusyError(f"{self.path}: other runs keep taking the workdir's lock; "
                                    "give another --workdir")
    self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                    name="workdir lock heartbeat")
    self._thread.start()

  def _write(self, generation: int) -> None:
    """Writes the lock if its live generation is `generation` (0: if absent)."""
    self._holder["heartbeat"] = time.time()
    blob = self._bucket.blob(self._key)  # each request its own: no generation pinned
    blob.upload_from_string(json.dumps(self._holder), content_type="application/json",
                            if_generation_match=generation)
    self._generation = blob.generation

  def _read(self) -> tuple[dict[str, Any] | None, int | None]:
    """(holder, generation) of the live lock; (None, None) when there is none."""
    from google.api_core import exceptions

    blob = self._bucket.blob(self._key)
    try:
      data = blob.download_as_bytes()
    except exceptions.NotFound:
      return None, None
    return _read_json(data), blob.generation

  def _heartbeat(self) -> None:
    from google.api_core import exceptions

    while not self._stop.wait(HEARTBEAT_S):
      try:
        self._write(self._generation)
      except exceptions.PreconditionFailed:
        holder, _ = self._read()
        # Another run took the workdir over: this one must not write to it again.
        print(f"error: the workdir lock {self.path} was taken over by {_describe(holder)} "
              f"(this run was not heard from for over {STALE_S:.0f} s); stopping without "
              "writing more", file=sys.stderr, flush=True)
        os._exit(LOST_EXIT_CODE)  # pylint: disable=protected-access
      except Exception as e:  # pylint: disable=broad-except  # tried again next time
        logging.warning("%s: renewing the workdir lock failed (%s); trying again in %.0f s",
                        self.path, e, HEARTBEAT_S)

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._generation is None:
      return
    try:
      self._bucket.blob(self._key).delete(if_generation_match=self._generation)
    except Exception as e:  # pylint: disable=broad-except  # stale: taken over when needed
      logging.warning("%s: releasing the workdir lock failed (%s); the next run takes it "
                      "over once it is %.0f s old", self.path, e, STALE_S)
    self._generation = None


def _client(storage):
  """A Cloud Storage client (the emulator's when STORAGE_EMULATOR_HOST is set)."""
  if os.environ.get("STORAGE_EMULATOR_HOST"):
    return storage.Client()
  import google.auth
  from google.auth import exceptions

  try:
    credentials, project = google.auth.default()
  except exceptions.DefaultCredentialsError as e:
    raise errors.StorageError(
        f"no Google Cloud credentials to lock a gs:// workdir with ({str(e).splitlines()[0]}); "
        "on your own machine run `gcloud auth application-default login`") from None
  return storage.Client(credentials=credentials, project=project)


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
  """Holds the workdir's lock for the block.

  Raises:
    WorkdirBusyError: another live run holds it, naming which.
  """
  if files.is_remote(workdir):
    if not workdir.startswith("gs://"):
      raise errors.UsageError(f"--workdir={workdir}: only local paths and gs:// are supported")
    lock: _LocalLock | _RemoteLock = _RemoteLock(workdir)
  else:
    lock = _LocalLock(workdir)
  lock.acquire()
  try:
    yield
  finally:
    lock.release()
