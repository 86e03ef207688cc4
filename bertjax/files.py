"""Files anywhere: local paths and `gs://` URLs alike.

Local paths go through `os`; URLs (`gs://bucket/...`) through `etils.epath`,
which reaches Google Cloud Storage through `gcsfs`. Libraries that only read
local files (array_record, tokenizers, sentencepiece) get a local copy in a
cache directory (`BERTJAX_CACHE_DIR`, default `~/.cache/bertjax`).

Object stores have no atomic rename, so a directory on `gs://` is "complete"
when its marker file (the one readers look for first: `bertjax.json`,
`config.json`, a shard's `.stats.json`) exists, and that file is always
written last.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from typing import Any, Callable, Iterable, Iterator

from bertjax import errors, paths


is_remote = paths.is_remote


def join(path: str, *names: str) -> str:
  """`os.path.join` that keeps `gs://` URLs intact."""
  return os.path.join(os.fspath(path), *names)


def _epath(path: str):
  from etils import epath

  return epath.Path(path)


def exists(path: str) -> bool:
  """Whether a file or directory exists, locally or at a `gs://`-style URL."""
  if is_remote(path):
    return _epath(path).exists()
  return os.path.exists(path)


def isfile(path: str) -> bool:
  if is_remote(path):
    return _epath(path).is_file()
  return os.path.isfile(path)


def check_directory(path: str, flag: str | None = None) -> None:
  """Refuses an output directory `path` (given as `flag`, "--output_dir") that
  is an existing file, before anything is written: the file is left as it was.

  Raises:
    UsageError: naming the path and what to give instead.
  """
  if isfile(path):
    raise errors.UsageError(f"{_given(path, flag)} is a file, not a directory: give a "
                            "directory (a new one is created)")
  _check_parents(path, flag)


def check_file(path: str, flag: str | None = None) -> None:
  """Refuses an output file `path` (given as `flag`, "--output") that is an
  existing directory, before anything is written.

  Raises:
    UsageError: naming the path and what to give instead.
  """
  if isdir(path):
    raise errors.UsageError(f"{_given(path, flag)} is a directory, not a file: give the path "
                            "of a file")
  _check_parents(path, flag)


def _check_parents(path: str, flag: str | None) -> None:
  """Refuses a local `path` inside an existing file (`notes.txt/out`)."""
  if is_remote(path):
    return
  parent = os.path.dirname(os.path.abspath(path))
  while parent and not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if os.path.isfile(parent):
    raise errors.UsageError(f"{_given(path, flag)} is inside {parent}, which is a file: give "
                            "a path in a directory")


def _given(path: str, flag: str | None) -> str:
  return f"{flag}={path}" if flag else path


def isdir(path: str) -> bool:
  """Whether `path` is a directory (on `gs://`: whether any object lies under it)."""
  if is_remote(path):
    return _epath(path).is_dir()
  return os.path.isdir(path)


def listdir(path: str) -> list[str]:
  """The names in a directory, sorted."""
  if is_remote(path):
    return sorted(p.name for p in _epath(path).iterdir())
  return sorted(os.listdir(path))


def size(path: str) -> int:
  """The size in bytes of a file, local or at a URL."""
  if is_remote(path):
    return _epath(path).stat().length
  return os.path.getsize(path)


def modified(path: str) -> float | None:
  """The modification time of a file, local or at a URL, as `local_copy`
  compares it (seconds since the epoch)."""
  if is_remote(path):
    return _epath(path).stat().mtime
  return os.path.getmtime(path)


def makedirs(path: str) -> None:
  """Creates a local directory and its parents (nothing to do on `gs://`)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


@contextlib.contextmanager
def removed_if_left_empty(directory: str) -> Iterator[None]:
  """Removes `directory`, and the parents made for it, if the block fails and
  they did not exist before it: a run refused once its workdir was made leaves
  no empty one behind. Each folder of that chain goes only if it is empty
  (`os.rmdir`, from the workdir up), so a sibling's run in a parent made at
  the same time keeps its folders; folders inside `directory` are another
  block's (`empty_folders_removed`, while the run holds its lock). A block
  refused because another run holds the workdir (`WorkdirBusyError`) removes
  nothing: its folders are that run's. On `gs://` a folder is the objects
  under it: none is left once the last is removed."""
  chain = []  # the folders made for `directory`, deepest first
  if not is_remote(directory):
    path = os.path.abspath(directory)
    while not os.path.exists(path) and path != os.path.dirname(path):
      chain.append(path)
      path = os.path.dirname(path)
  try:
    yield
  except errors.WorkdirBusyError:
    raise
  except BaseException:
    for folder in chain:
      try:
        os.rmdir(folder)
      except OSError:
        break  # holds something (another run's, perhaps): it and its parents are kept
    raise


@contextlib.contextmanager
def empty_folders_removed(directory: str) -> Iterator[None]:
  """Removes the empty folders inside a local `directory` if the block fails:
  entered only while this process holds the directory's lock, so that every
  folder in it is this run's."""
  try:
    yield
  except BaseException:
    if not is_remote(directory):
      for root, _, _ in os.walk(directory, topdown=False):
        if root != directory:
          try:
            os.rmdir(root)
          except OSError:
            pass  # holds something: kept
    raise


def remove(path: str) -> None:
  if is_remote(path):
    _epath(path).unlink()
  else:
    os.remove(path)


def read_bytes(path: str) -> bytes:
  if is_remote(path):
    return _epath(path).read_bytes()
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  """The text of a UTF-8 file (a byte-order mark, as Windows editors write,
  is not part of it).

  Raises:
    UsageError: the file is UTF-16 or UTF-32 (its byte-order mark says so).
    UnicodeDecodeError: it is not UTF-8 otherwise.
  """
  return _decoded(path, read_bytes(path))


def _decoded(path: str, data: bytes) -> str:
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    if marked_encoding(data[:4]):
      raise errors.UsageError(not_utf8(path, data[:4], e)) from None
    raise


# UTF-32's little-endian mark starts with UTF-16's, so it comes first.
_UNICODE_MARKS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                  (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def marked_encoding(head: bytes) -> str | None:
  """"UTF-16" or "UTF-32" if bytes start with its byte-order mark, else None."""
  return next((name for mark, name in _UNICODE_MARKS if head.startswith(mark)), None)


def not_utf8(path: str, head: bytes, error: UnicodeDecodeError) -> str:
  """Why a file that must be UTF-8 text could not be read, in one line: a
  UTF-16 or UTF-32 byte-order mark at its start (`head`) is named (Excel's
  "Unicode Text" and Notepad's "Unicode" save UTF-16 with one), else the
  decoder's error."""
  encoding = marked_encoding(head)
  if encoding:
    return (f"{path}: {encoding} text (it starts with a {encoding} byte-order mark), not "
            f"UTF-8; save it as UTF-8 (e.g. iconv -f {encoding} -t UTF-8)")
  return f"{path}: not UTF-8 text ({error})"


@contextlib.contextmanager
def open_text(path: str, newline: str | None = None) -> Iterator[Any]:
  """A text file for reading (UTF-8, a byte-order mark dropped), local or remote.

  Args:
    newline: As for `open` (`""` for the csv module).
  """
  if is_remote(path):
    import io
    with _epath(path).open("rb") as raw:
      yield io.TextIOWrapper(raw, encoding="utf-8-sig", newline=newline)
  else:
    with open(path, encoding="utf-8-sig", newline=newline) as f:
      yield f


def staging_name(path: str) -> str:
  """A name beside `path` to write it under before renaming it into place.

  Unique per host, process and call (`.NAME.tmp-HOST-PID-RANDOM`): hosts that
  share a file system never write to the same staging file, and readers that
  list a directory skip it (its name starts with a dot and holds ".tmp").
  """
  directory, name = os.path.split(os.fspath(path))
  return os.path.join(directory, f".{name}.tmp-{_host()}-{os.getpid()}-{secrets.token_hex(4)}")


_STAGING = re.compile(
    r"^\.(?P<name>.+)\.tmp-(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-[0-9a-f]{8}")


def remove_stale_staging(directory: str) -> list[str]:
  """Removes the staging files and directories (`staging_name`) in a local
  `directory` left by processes of this host that no longer run (killed, or
  stopped with their workers); returns their names. Other hosts' staging
  files, and those of live processes, are left alone."""
  if is_remote(directory) or not os.path.isdir(directory):
    return []
  host = _host()
  removed = []
  for name in os.listdir(directory):
    match = _STAGING.match(name)
    if not match or match["host"] != host or _process_runs(int(match["pid"])):
      continue
    path = os.path.join(directory, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
    removed.append(name)
  return removed


def _process_runs(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _host() -> str:
  return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"


def _bucket(url: str) -> str:
  """`gs://bucket` of `gs://bucket/path`."""
  scheme, _, rest = os.fspath(url).partition("://")
  return f"{scheme}://{rest.split('/', 1)[0]}"


@contextlib.contextmanager
def _writing(url: str) -> Iterator[None]:
  """Says so when a write to `url` failed because its bucket is not there
  (gcsfs' error names only the upload's address). bertjax never creates
  buckets: where one goes, and who pays for it, is the user's to decide."""
  try:
    yield
  except FileNotFoundError as error:
    bucket = _bucket(url)
    try:
      missing = not _epath(bucket).exists()
    except Exception:  # pylint: disable=broad-except  # cannot tell: the error as it was
      missing = False
    if missing:
      raise errors.MissingFileError(
          f"cannot write {url}: the bucket {bucket} does not exist, or this account cannot "
          f"see it; create it in the region of your TPUs or GPUs (gcloud storage buckets "
          f"create {bucket} --location=REGION) or correct the path") from error
    raise


def upload(local: str, remote: str) -> None:
  """Copies a local file to a URL."""
  from etils import epath

  with _writing(remote):
    _epath(remote).parent.mkdir(parents=True, exist_ok=True)
    epath.Path(local).copy(_epath(remote), overwrite=True)


def cache_root() -> str:
  return os.environ.get("BERTJAX_CACHE_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "bertjax")


def cache_path(url: str) -> str:
  """Where the local copy of `url` goes: `<cache>/gs/<bucket>/<path>`."""
  scheme, rest = os.fspath(url).split("://", 1)
  return os.path.join(cache_root(), scheme, rest.strip("/"))


def cached_url(local: str) -> str | None:
  """The URL whose cache copy `local` is (`cache_path`'s inverse); None for a
  path outside the cache."""
  relative = os.path.relpath(os.path.abspath(local), os.path.abspath(cache_root()))
  if relative.startswith(".."):
    return None
  scheme, _, rest = relative.partition(os.sep)
  return f"{scheme}://{rest}" if rest else None


def download(remote: str, local: str, mtime: float | None = None) -> None:
  """Copies a remote file to `local` (written under a temporary name, then
  renamed), with the remote's modification time when given."""
  os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
  staging = staging_name(local)
  try:
    with (errors.writing(local, "the copies finished before are kept (set BERTJAX_CACHE_DIR "
                                "to a larger disk)"),
          _epath(remote).open("rb") as source, open(staging, "wb") as target):
      shutil.copyfileobj(source, target, 16 << 20)
    if mtime is not None:
      os.utime(staging, (mtime, mtime))
    os.replace(staging, local)
  except BaseException:
    if os.path.exists(staging):
      os.remove(staging)
    raise


def local_file(path: str) -> str:
  """A local path to the file `path`: itself, or its copy in the cache for a URL."""
  if not is_remote(path):
    return path
  directory, name = path.rstrip("/").rsplit("/", 1)
  return os.path.join(local_copy(directory, [name]), name)


def local_copy(path: str, names: Iterable[str] | Callable[[str], bool] | None = None,
               *, check_space: bool = True) -> str:
  """A local directory holding `path`'s files; `path` itself when it is local.

  A remote directory is mirrored into `cache_path(path)`: each wanted file is
  downloaded unless a copy of the same size and modification time is there
  already (files are renamed into place only once complete, so a copy is never
  half-written).

  Args:
    path: A directory, local or a URL.
    names: Which files: a list of names, a predicate on the name, or None for
      every file directly in the directory (no sub-directories).
    check_space: Refuse (with the sizes) when the local disk lacks the
      room, before downloading anything.
  """
  if not is_remote(path):
    return path
  local = cache_path(path)
  remote = _epath(path)
  if names is None or callable(names):
    keep = names or (lambda name: True)
    entries = [p for p in remote.iterdir() if keep(p.name) and p.is_file()]
  else:
    entries = [remote / name for name in names]
  todo = []
  for entry in entries:
    try:
      stat = entry.stat()
    except FileNotFoundError:
      raise errors.MissingFileError(f"{path}/{entry.name} not found") from None
    target = os.path.join(local, entry.name)
    if not (os.path.isfile(target) and os.path.getsize(target) == stat.length
            and int(os.path.getmtime(target)) == int(stat.mtime or -1)):
      todo.append((entry, target, stat))
  if todo and check_space:
    os.makedirs(local, exist_ok=True)
    needed = sum(stat.length for *_, stat in todo)
    free = shutil.disk_usage(local).free
    if needed > free:
      raise errors.StorageFullError(
          f"{path}: {needed / 2**30:.1f} GiB to copy into {local} but only "
          f"{free / 2**30:.1f} GiB free; set BERTJAX_CACHE_DIR to a larger disk, "
          "or mount the bucket with gcsfuse and give the local path")
  for entry, target, stat in todo:
    download(os.fspath(entry), target, stat.mtime)
  os.makedirs(local, exist_ok=True)
  return local


def write_bytes(path: str, data: bytes) -> None:
  """Writes a whole file, locally or at a URL, atomically (an object store
  creates an object whole; a local file is renamed into place)."""
  if is_remote(path):
    with _writing(path):
      _epath(path).write_bytes(data)
    return
  check_file(path)  # (a rename over a directory would fail after the write)
  staging = staging_name(path)
  try:
    with errors.writing(path, f"{path} is as it was"):
      with open(staging, "wb") as f:
        f.write(data)
      os.replace(staging, path)
  except BaseException:
    if os.path.exists(staging):
      os.remove(staging)
    raise


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def read_json(path: str) -> dict[str, Any]:
  """A JSON object from `path` (local or a URL); errors name the file."""
  try:
    if is_remote(path) and not exists(path):
      raise errors.MissingFileError(path)
    data = json.loads(read_text(path))  # (a byte-order mark is no JSON)
  except FileNotFoundError:
    raise errors.MissingFileError(f"{path} not found") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.UsageError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(data, dict):
    raise errors.UsageError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def write_json(path: str, data: dict[str, Any]) -> None:
  write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_directory(out_dir: str, overwrite: bool = False,
                     marker: str | None = None) -> Iterator[str]:
  """Yields a temporary directory that becomes `out_dir` only if the block succeeds.

  Locally the temporary directory is a sibling of `out_dir` (same file system,
  so the final rename is atomic). On any error it is removed and `out_dir` is
  left as it was. An existing `out_dir` is an error unless `overwrite`, in
  which case it is replaced only after the new one is complete.

  On `gs://` the block writes to a local temporary directory that is uploaded
  afterwards, `marker` (the file readers look for first) last; when replacing,
  the old marker goes first, so a reader never takes a half-written directory
  for a complete one.
  """
  check_directory(out_dir)  # `overwrite` replaces a directory, never a file
  kept = (f"{out_dir} is as it was" if exists(out_dir) else f"nothing was written to {out_dir}")
  with errors.writing(out_dir, kept):
    if is_remote(out_dir):
      with _remote_directory(out_dir, overwrite, marker) as staging:
        yield staging
      return
    with _local_directory(out_dir, overwrite) as staging:
      yield staging


@contextlib.contextmanager
def _local_directory(out_dir: str, overwrite: bool) -> Iterator[str]:
  """`atomic_directory` on a local disk: a sibling renamed into place."""
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and not overwrite:
    raise errors.OutputExistsError(f"{out_dir} already exists; choose a new directory or "
                                   "pass overwrite=True")
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=os.path.basename(staging_name(out_dir)) + "-", dir=parent)
  try:
    yield staging
    _give_usual_modes(staging)
    if not os.path.exists(out_dir):
      os.rename(staging, out_dir)
      return
    retired = staging + ".old"
    os.rename(out_dir, retired)
    try:
      os.rename(staging, out_dir)
    except BaseException:
      os.rename(retired, out_dir)
      raise
    shutil.rmtree(retired)
  except BaseException:
    remove_tree(staging)
    raise


def _give_usual_modes(directory: str) -> None:
  """Gives `directory` and all in it the modes new files get under the umask:
  some writers make theirs private (mkdtemp's 0700 directory, the safetensors
  library's 0600 files), which would hide a model from a machine's other users."""
  umask = os.umask(0)
  os.umask(umask)
  for root, _, names in os.walk(directory):
    os.chmod(root, 0o777 & ~umask)
    for path in (os.path.join(root, name) for name in names):
      if not os.path.islink(path):
        executable = os.stat(path).st_mode & 0o100
        os.chmod(path, (0o777 if executable else 0o666) & ~umask)


def remove_tree(path: str, within_s: float = 3.0, quiet_s: float = 0.5) -> None:
  """Removes the local directory `path`, again while a writer still running
  (a storage library's threads, which a Ctrl-C in the main thread does not
  stop) adds files to it or makes it anew: done once it has stayed away for
  `quiet_s`, or after `within_s` seconds."""
  deadline = time.monotonic() + within_s
  gone_since = None
  while time.monotonic() < deadline:
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
      gone_since = None
    else:
      gone_since = gone_since or time.monotonic()
      if time.monotonic() - gone_since >= quiet_s:
        return
    time.sleep(0.02)
  shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _remote_directory(out_dir: str, overwrite: bool, marker: str | None) -> Iterator[str]:
  target = _epath(out_dir)
  if target.exists() and not overwrite:
    raise errors.OutputExistsError(f"{out_dir} already exists; choose a new directory or "
                                   "pass overwrite=True")
  with tempfile.TemporaryDirectory(prefix="bertjax-upload-") as staging:
    yield staging
    if target.exists():
      if marker and (target / marker).exists():
        (target / marker).unlink()
      target.rmtree()
    names = []
    for root, _, filenames in os.walk(staging):
      names += [os.path.relpath(os.path.join(root, n), staging) for n in filenames]
    for name in sorted(names, key=lambda n: n == marker):
      upload(os.path.join(staging, name), join(out_dir, name))
