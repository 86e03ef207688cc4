"""bertjax.files against a real GCS API server (fake-gcs-server on 127.0.0.1):
reads, writes, local copies, and directories that are complete or absent."""

import os

import pytest

from bertjax import files


def test_read_write_list_and_copy_on_gcs(gcs, tmp_path):
  root = gcs.url_of("files/basic")
  files.write_json(files.join(root, "a.json"), {"x": 1})
  files.write_text(files.join(root, "b.txt"), "héllo\n")
  assert files.read_json(files.join(root, "a.json")) == {"x": 1}
  assert files.isfile(files.join(root, "b.txt")) and files.isdir(root)
  assert not files.exists(files.join(root, "c.txt"))
  assert files.listdir(root) == ["a.json", "b.txt"]
  with files.open_text(files.join(root, "b.txt")) as f:
    assert f.read() == "héllo\n"
  local = files.local_copy(root)
  assert local.startswith(os.environ["BERTJAX_CACHE_DIR"])
  assert sorted(os.listdir(local)) == ["a.json", "b.txt"]
  # A copy of the same size stays; the file is not fetched again.
  stamp = os.stat(os.path.join(local, "b.txt")).st_mtime_ns
  files.local_copy(root)
  assert os.stat(os.path.join(local, "b.txt")).st_mtime_ns == stamp
  assert open(files.local_file(files.join(root, "b.txt")), encoding="utf-8").read() == "héllo\n"
  with pytest.raises(FileNotFoundError, match="files/basic/missing.txt"):
    files.local_copy(root, ["missing.txt"])
  with pytest.raises(FileNotFoundError, match="a.json"):
    files.read_json(files.join(root, "missing", "a.json").replace("missing/", "nothing/"))


def test_a_remote_directory_is_complete_or_not_there(gcs):
  out = gcs.url_of("files/model")
  with pytest.raises(RuntimeError, match="boom"):
    with files.atomic_directory(out, marker="config.json") as staging:
      open(os.path.join(staging, "weights.bin"), "wb").write(b"1" * 100)
      raise RuntimeError("boom")
  assert not files.exists(out)  # nothing was uploaded
  with files.atomic_directory(out, marker="config.json") as staging:
    open(os.path.join(staging, "weights.bin"), "wb").write(b"1" * 100)
    open(os.path.join(staging, "config.json"), "w").write("{}")
    os.makedirs(os.path.join(staging, "params"))
    open(os.path.join(staging, "params", "x"), "w").write("x")
  assert files.listdir(out) == ["config.json", "params", "weights.bin"]
  with pytest.raises(FileExistsError, match="already exists"):
    with files.atomic_directory(out, marker="config.json"):
      pass
  with files.atomic_directory(out, overwrite=True, marker="config.json") as staging:
    open(os.path.join(staging, "config.json"), "w").write('{"v": 2}')
  assert files.listdir(out) == ["config.json"]  # the old directory is gone, not merged
  assert files.read_json(files.join(out, "config.json")) == {"v": 2}


def test_the_marker_is_uploaded_last(gcs, monkeypatch):
  uploaded = []
  original = files.upload
  monkeypatch.setattr(files, "upload", lambda local, remote: (uploaded.append(
      os.path.basename(remote)), original(local, remote)))
  with files.atomic_directory(gcs.url_of("files/ordered"), marker="bertjax.json") as staging:
    for name in ("bertjax.json", "vocab.txt", "z.txt"):
      open(os.path.join(staging, name), "w").write(name)
  assert uploaded[-1] == "bertjax.json" and sorted(uploaded) == ["bertjax.json", "vocab.txt",
                                                                 "z.txt"]


def test_local_copy_refuses_a_disk_too_small(gcs, monkeypatch):
  import shutil
  from collections import namedtuple

  root = gcs.url_of("files/big")
  files.write_text(files.join(root, "shard"), "x" * 1000)
  usage = namedtuple("usage", "total used free")
  monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2000, 1990, 10))
  with pytest.raises(OSError, match="BERTJAX_CACHE_DIR.*gcsfuse"):
    files.local_copy(root)


def test_a_file_rewritten_in_the_bucket_is_copied_again(gcs):
  import time

  root = gcs.url_of("files/rewritten")
  files.write_json(files.join(root, "info.json"), {"v": 1})
  local = files.local_copy(root)
  time.sleep(1.1)  # a later modification time, the same size
  files.write_json(files.join(root, "info.json"), {"v": 2})
  assert files.local_copy(root) == local
  assert files.read_json(os.path.join(local, "info.json")) == {"v": 2}


def test_objects_another_client_wrote_after_a_listing_are_seen(gcs):
  """orbax lists a step's directory through gcsfs (epath) while tensorstore,
  another client, writes the arrays under it (as other hosts do on a pod). A
  cached listing would hide them: the CI failure 'Checkpoint directory does
  not exist: .../checkpoints/30/state' after a storage outage."""
  import tensorstore as ts
  from etils import epath

  from tests.gcs import BUCKET

  step = epath.Path(gcs.url_of("files/listed/30"))
  (step / "_CHECKPOINT_METADATA").write_text("{}")
  assert [p.name for p in step.iterdir()] == ["_CHECKPOINT_METADATA"]  # listed now
  assert not (step / "state").exists()
  store = ts.KvStore.open({"driver": "gcs", "bucket": BUCKET,
                           "path": "files/listed/30/state/"}).result()
  store.write("manifest.ocdbt", b"x").result()
  assert (step / "state").exists()
  assert sorted(p.name for p in step.iterdir()) == ["_CHECKPOINT_METADATA", "state"]


def test_a_write_into_a_bucket_that_is_not_there_says_so(gcs, tmp_path):
  """No client creates a bucket (gcsfs and tensorstore both answer 404), and
  bertjax does not either: the error names the bucket and how to make one."""
  says = (r"cannot write gs://bertjax-no-such-bucket/run/x: the bucket "
          r"gs://bertjax-no-such-bucket does not exist, or this account cannot see it; create "
          r"it in the region of your TPUs or GPUs \(gcloud storage buckets create "
          r"gs://bertjax-no-such-bucket --location=REGION\) or correct the path")
  with pytest.raises(FileNotFoundError, match=says):
    files.write_bytes("gs://bertjax-no-such-bucket/run/x", b"data")
  local = tmp_path / "x"
  local.write_bytes(b"data")
  with pytest.raises(FileNotFoundError, match=says):
    files.upload(str(local), "gs://bertjax-no-such-bucket/run/x")
  assert not os.path.exists(os.path.join(gcs.root, "storage", "bertjax-no-such-bucket"))


def test_a_cache_copy_knows_the_url_it_copies(tmp_path, monkeypatch):
  monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path / "cache"))
  local = files.cache_path("gs://bucket/data/wiki")
  assert files.cached_url(local) == "gs://bucket/data/wiki"
  assert files.cached_url(os.path.join(local, "vocab.txt")) == "gs://bucket/data/wiki/vocab.txt"
  assert files.cached_url(str(tmp_path / "elsewhere")) is None


@pytest.mark.parametrize("encoding,name", [("utf-16", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_json_file_saved_as_utf16_or_32_is_named_so(tmp_path, encoding, name):
  """Notepad's "Unicode" saves UTF-16 with its byte-order mark: the error says
  what the file is and how to save it, not a decoder's complaint."""
  from bertjax import errors

  path = tmp_path / "config.json"
  path.write_bytes('{"hidden_size": 32}'.encode(encoding))  # the codec writes the mark
  with pytest.raises(errors.UsageError, match=f"{path}: {name} text \\(it starts with a "
                     f"{name} byte-order mark\\), not UTF-8; save it as UTF-8"):
    files.read_json(str(path))
  path.write_bytes(b"\xef\xbb\xbf" + b'{"hidden_size": 32}')  # UTF-8 with a mark: read
  assert files.read_json(str(path)) == {"hidden_size": 32}


def test_a_staging_directory_is_removed_while_a_writer_still_adds_to_it(tmp_path):
  """A Ctrl-C stops the main thread, not a storage library's writing threads:
  the staging directory they still write into is removed all the same (one
  pass would leave what they add after it)."""
  import threading
  import time

  staging = tmp_path / ".out.tmp-host-1-x"
  staging.mkdir()
  until = time.monotonic() + 0.3

  def writer():
    count = 0
    while time.monotonic() < until:
      try:
        (staging / "params").mkdir(parents=True, exist_ok=True)
        (staging / "params" / str(count)).write_bytes(b"x" * 1000)
        count += 1
      except OSError:
        pass

  thread = threading.Thread(target=writer)
  thread.start()
  time.sleep(0.05)
  files.remove_tree(str(staging))
  thread.join()
  assert not staging.exists()
