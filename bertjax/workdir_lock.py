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
  gone means a process of this host that no longer runs, an earlier attempt
  of this run's own workload (below), or a heartbeat older than `STALE_S`
  seconds. A holder heard from recently is watched for one heartbeat: if it
  renews the lock it is alive, and the run is refused; if it stays silent the
  run waits until the lock is stale and takes it over. A holder whose lock
  was taken over (it hung for longer than that) stops at once, writing
  nothing more; a renewal refused because an earlier try of it landed (its
  answer lost) finds its own record there, and goes on.

A workload that a supervisor restarts as a whole (GKE's JobSet) names itself
in `BERTJAX_WORKLOAD` and its restart attempt in `BERTJAX_RESTART_ATTEMPT`
(JobSet's `jobset.sigs.k8s.io/restart-attempt`, which a pod reads through
the downward API): a lock whose holder names the same workload and a lower
attempt is taken over at once, whichever node the new attempt's process 0
lands on, since the supervisor starts an attempt only after ending the one
before. Both numbers are needed: a holder or a caller without one (an
operator's shell or `kubectl exec` with the workload's variable, or a
launcher that cannot pass the attempt, as `launch/xpk.sh` cannot) is no
evidence that the holder is over, and the holder is watched as any other.
Storage that does not answer is waited for (`bertjax.outage`) before the run
gives up, restartably.

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

from bertjax import errors, files, outage

LOCK_FILE = "run.lock"
HEARTBEAT_S = 30.0
STALE_S = 180.0  # six heartbeats missed
LOST_EXIT_CODE = 2  # a usage error's: the run stopped, its line says why
# How long the client retries one request (its default, 120 s, would hide an
# outage from `bertjax.outage`, which says what it waits for and for how long).
REQUEST_RETRY_S = 30.0
WORKLOAD_VARIABLE = "BERTJAX_WORKLOAD"  # the supervised workload this run is an attempt of
ATTEMPT_VARIABLE = "BERTJAX_RESTART_ATTEMPT"  # which attempt (JobSet's restart-attempt)


def _holder() -> dict[str, Any]:
  """Who this process is, as the lock records it."""
  return {"host": socket.gethostname(), "pid": os.getpid(), "boot": _boot_id(),
          "process_start": _process_start(os.getpid()), "pid_namespace": _pid_namespace(),
          "workload": os.environ.get(WORKLOAD_VARIABLE, ""), "attempt": _attempt(),
          "command": " ".join(sys.argv)[:500], "since": time.time(), "heartbeat": time.time(),
          "heartbeat_s": HEARTBEAT_S}


def _attempt() -> int | None:
  """This process's restart attempt (`BERTJAX_RESTART_ATTEMPT`); None unless
  the variable holds a number of 0 or more."""
  try:
    attempt = int(os.environ[ATTEMPT_VARIABLE])
  except (KeyError, ValueError):
    return None
  return attempt if attempt >= 0 else None


def _earlier_attempt(holder: dict[str, Any]) -> bool:
  """Whether the holder is an earlier restart attempt of this run's own
  workload: both name the workload and an attempt, the holder's the lower.

  Only the supervisor's attempt numbers say so: the workload's name alone is
  in any process given its variable (an operator's shell, a `kubectl exec`
  into a live pod), which must not take a live run's lock at once.
  """
  workload = os.environ.get(WORKLOAD_VARIABLE, "")
  if not workload or holder.get("workload") != workload:
    return False
  theirs, mine = holder.get("attempt"), _attempt()
  return isinstance(theirs, int) and mine is not None and theirs < mine


def _boot_id() -> str:
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      return f.read().strip()
  except OSError:
    return ""


def _pid_namespace() -> str:
  """This process's PID namespace ('pid:[4026531836]'; '' if unknown): two
  containers of one machine (pods on the host's network share its host name)
  number their processes each in its own."""
  try:
    return os.readlink("/proc/self/ns/pid")
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
  workload = (f", workload {holder['workload']}" + (
      f" attempt {holder['attempt']}" if holder.get("attempt") is not None else "")
              if holder.get("workload") else "")
  return (f"process {holder.get('pid')} on {holder.get('host')} since {since}{workload} "
          f"({holder.get('command') or 'command unknown'})")


def _gone_on_this_host(holder: dict[str, Any]) -> bool:
  """Whether the holder ran on this machine and no longer runs."""
  if holder.get("host") != socket.gethostname() or not holder.get("boot"):
    return False
  if holder["boot"] != _boot_id():
    return True  # the machine restarted since
  if holder.get("pid_namespace", "") != _pid_namespace():
    return False  # another container's process: its number means nothing here
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


def _same_holder(a: dict[str, Any], b: dict[str, Any]) -> bool:
  return all(a.get(key) == b.get(key) for key in ("host", "pid", "since"))


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

    failed_since = None  # when the storage stopped answering
    while True:
      try:
        self._acquire()
        return
      except errors.Error:
        raise  # worded already: a busy workdir, a missing bucket
      except (exceptions.GoogleAPICallError, exceptions.RetryError, OSError) as e:
        if errors.storage_unreachable(e) is None:  # refused: rights, a bucket
          raise errors.StorageError(
              f"{self.path}: cannot lock the workdir ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:300]}); check that this account may write there "
              "(gcloud storage ls the bucket)") from e
        failed_since = failed_since or time.monotonic()
        outage.wait_until_reachable(self.path, self._read, e,
                                    "from the workdir's newest checkpoint", failed_since)

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
      reason = self._gone(holder, generation)
      if reason is None:
        continue  # the lock changed hands while it was watched: look again
      try:
        self._write(generation)  # taken over only if nobody else did first
        logging.warning("Took over the workdir lock %s from %s, which is gone (%s)",
                        self.path, _describe(holder), reason)
        break
      except exceptions.PreconditionFailed:
        continue
    else:
      raise errors.WorkdirBusyError(f"{self.path}: other runs keep taking the workdir's lock; "
                                    "give another --workdir")
    self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                    name="workdir lock heartbeat")
    self._thread.start()

  def _gone(self, holder: dict[str, Any] | None, generation: int) -> str | None:
    """Why the holder of lock `generation` is gone (watching a silent one until
    its lock is stale), or None when the lock changed hands meanwhile.

    Raises:
      WorkdirBusyError: the holder renewed its lock: it is alive.
    """
    if not holder:
      return "its lock names nobody"
    if _same_holder(holder, self._holder):
      return "it is this run's own, written by a request that was retried"
    if _gone_on_this_host(holder):
      return "its process has ended"
    if _earlier_attempt(holder):
      return "an earlier attempt of this workload"
    heartbeat_s = float(holder.get("heartbeat_s") or HEARTBEAT_S)
    # A renewal is due within a heartbeat; a write's own retries take longer.
    silent_after = time.monotonic() + heartbeat_s + min(heartbeat_s, 30.0) + 5.0
    announced = said_silent = False
    while True:
      age = time.time() - float(holder.get("heartbeat", 0))
      if age >= STALE_S:
        return f"not renewed for {age:.0f} s"
      if not announced:
        announced = True
        logging.warning("%s is held by %s, last heard from %.0f s ago: watching whether it "
                        "renews the lock (taken over once it has not for %.0f s)", self.path,
                        _describe(holder), age, STALE_S)
      time.sleep(min(max(heartbeat_s / 4, 0.05), 5.0, STALE_S - age))
      current, current_generation = self._read()
      if current_generation != generation:
        if current_generation is not None and current and _same_holder(current, holder):
          self._refuse(current, time.time() - float(current.get("heartbeat", 0)))
        return None
      if time.monotonic() > silent_after and not said_silent:
        said_silent = True
        logging.warning("%s: its holder has not renewed it for %.0f s (heartbeat every %.0f "
                        "s): waiting for the lock to be %.0f s old", self.path, age,
                        heartbeat_s, STALE_S)

  def _refuse(self, holder: dict[str, Any], age: float) -> None:
    raise errors.WorkdirBusyError(
        f"{self.path.rsplit('/', 1)[0]} is in use by {_describe(holder)}, last heard "
        f"from {age:.0f} s ago; wait for that run to end or stop it, or give another "
        f"--workdir (a lock not renewed for {STALE_S:.0f} s is taken over)")

  def _write(self, generation: int) -> None:
    """Writes the lock if its live generation is `generation` (0: if absent)."""
    self._holder["heartbeat"] = time.time()
    blob = self._bucket.blob(self._key)  # each request its own: no generation pinned
    blob.upload_from_string(json.dumps(self._holder), content_type="application/json",
                            if_generation_match=generation, retry=_retry())
    self._generation = blob.generation

  def _read(self) -> tuple[dict[str, Any] | None, int | None]:
    """(holder, generation) of the live lock; (None, None) when there is none."""
    from google.api_core import exceptions

    blob = self._bucket.blob(self._key)
    try:
      data = blob.download_as_bytes(retry=_retry())
    except exceptions.NotFound:
      return None, None
    return _read_json(data), blob.generation

  def _heartbeat(self) -> None:
    from google.api_core import exceptions

    while not self._stop.wait(HEARTBEAT_S):
      try:
        try:
          self._write(self._generation)
        except exceptions.PreconditionFailed:
          self._renewed_or_lost()
      except Exception as e:  # pylint: disable=broad-except  # tried again next time
        logging.warning("%s: renewing the workdir lock failed (%s); trying again in %.0f s",
                        self.path, e, HEARTBEAT_S)

  def _renewed_or_lost(self) -> None:
    """After a renewal refused for its generation: the lock read back says
    whether this run holds it still (a renewal that reached the server but
    whose answer was lost, retried with the generation it replaced) or lost
    it to another run, which ends this one at once."""
    holder, generation = self._read()
    if holder is not None and generation is not None and _same_holder(holder, self._holder):
      logging.info("%s: an earlier try of the renewal had landed (its answer was lost); "
                   "the lock is this run's", self.path)
      self._generation = generation
      return
    # Another run took the workdir over: this one must not write to it again.
    print(f"error: the workdir lock {self.path} was taken over by {_describe(holder)} "
          f"(this run was not heard from for over {STALE_S:.0f} s); stopping without "
          "writing more", file=sys.stderr, flush=True)
    os._exit(LOST_EXIT_CODE)  # pylint: disable=protected-access

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._generation is None:
      return
    try:
      self._bucket.blob(self._key).delete(if_generation_match=self._generation,
                                          retry=_retry())
    except Exception as e:  # pylint: disable=broad-except  # stale: taken over when needed
      logging.warning("%s: releasing the workdir lock failed (%s); the next run takes it "
                      "over once it is %.0f s old", self.path, e, STALE_S)
    self._generation = None


def _retry():
  from google.cloud.storage.retry import DEFAULT_RETRY

  return DEFAULT_RETRY.with_timeout(REQUEST_RETRY_S)


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
