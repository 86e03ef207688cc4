"""Metrics files: TensorBoard events readable by TensorBoard's reader, JSONL."""

import glob
import json
import logging
import sys

import pytest

from bertjax import metrics


def test_event_files_read_back_with_tensorflow(tmp_path):
  tf = pytest.importorskip("tensorflow")
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(1, {"loss": 2.5, "mlm_accuracy": 0.125, "note": "text is not a scalar"}, "train/")
  writer.write(70000, {"loss": 1.0}, "train/")
  writer.close()
  (events,) = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
  records = list(tf.compat.v1.train.summary_iterator(events))  # checks every CRC
  assert records[0].file_version == "brain.Event:2"
  assert [(r.step, {v.tag: v.simple_value for v in r.summary.value}) for r in records[1:]] == [
      (1, {"train/loss": 2.5, "train/mlm_accuracy": 0.125}), (70000, {"train/loss": 1.0})]
  lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert lines[0] == {"step": 1, "train/loss": 2.5, "train/mlm_accuracy": 0.125,
                      "train/note": "text is not a scalar"}


def test_crc32c_known_answers():
  assert metrics._crc32c(b"") == 0
  assert metrics._crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_disabled_writer_writes_nothing(tmp_path):
  writer = metrics.MetricWriter(str(tmp_path / "run"), enabled=False)
  writer.write(1, {"loss": 1.0})
  writer.close()
  assert not (tmp_path / "run").exists()


def test_console_line():
  line = metrics.format_line(100, 1000, {"loss": 2.0, "mlm_accuracy": 0.5, "mfu": 0.42,
                                         "tokens_per_s": 1234.5, "eta_s": 3700,
                                         "skipped_total": 2.0})
  assert line == ("step 100/1000  loss 2.0000  mlm_accuracy 0.500  tokens/s 1234  "
                  "mfu 42.0%  eta 1h01m  skipped 2")
  priced = metrics.format_line(100, 1000, {"eta_s": 3700, "cost_left": 12345.678})
  assert priced == "step 100/1000  eta 1h01m  cost left 12,345.68"


def test_orbax_info_lines_are_quiet_at_the_default_verbosity():
  import logging as pylogging

  from absl import logging

  metrics.quiet_checkpoint_logs()
  metrics.quiet_checkpoint_logs()  # installed once
  handler = logging.get_absl_handler()
  installed = [f for f in handler.filters if isinstance(f, metrics._OrbaxInfoFilter)]
  assert len(installed) == 1
  formatter = handler.python_handler.formatter
  assert isinstance(formatter, metrics._OneLineOrbaxErrors)
  assert not isinstance(formatter.formatter, metrics._OneLineOrbaxErrors)

  def record(path, level):
    return pylogging.LogRecord("absl", level, path, 1, "a line", (), None)

  orbax_path = "/venv/lib/python3.11/site-packages/orbax/checkpoint/_src/x.py"
  own_path = "/src/bertjax/tasks/glue.py"
  verbosity = logging.get_verbosity()
  try:
    logging.set_verbosity(logging.INFO)
    assert not installed[0].filter(record(orbax_path, pylogging.INFO))
    assert installed[0].filter(record(orbax_path, pylogging.WARNING))
    assert installed[0].filter(record(own_path, pylogging.INFO))
    # A failed save: each of orbax's threads logs the error with its traceback,
    # or with one folded into the message. One line each, pointing to --verbosity;
    # the record stays whole for other handlers.
    try:
      raise FileNotFoundError("http://storage/o?name=checkpoints%2F30%2Fstate")
    except FileNotFoundError:
      failed = pylogging.LogRecord("absl", pylogging.ERROR, orbax_path, 1,
                                   "save raised: %s", ("the error",), sys.exc_info())
    folded = pylogging.LogRecord("absl", pylogging.ERROR, orbax_path, 1,
                                 "NOT_FOUND: writing\nTraceback (most recent call last):\n  x",
                                 (), None)
    for error, first_line in ((failed, "save raised: the error"),
                              (folded, "NOT_FOUND: writing")):
      assert installed[0].filter(error)
      text = handler.format(error)
      assert "Traceback" not in text and "\n" not in text.strip(), text
      assert text.endswith(f"{first_line} (--verbosity=1 shows the traceback)"), text
    assert failed.exc_info is not None and "Traceback" in pylogging.Formatter().format(failed)
    assert "Traceback" in handler.format(
        pylogging.LogRecord("absl", pylogging.ERROR, own_path, 1, "x", (), failed.exc_info))
    logging.set_verbosity(logging.DEBUG)  # --verbosity=1
    assert installed[0].filter(record(orbax_path, pylogging.INFO))
    kept = pylogging.LogRecord("absl", pylogging.ERROR, orbax_path, 1, "a\nb", (), None)
    assert installed[0].filter(kept) and "a\nb" in handler.format(kept)  # all of it
  finally:
    logging.set_verbosity(verbosity)


def _read_events(data):
  """(step, {tag: value}) of an event file's bytes, checking every CRC."""
  import struct

  records, offset = [], 0
  while offset < len(data):
    (length,) = struct.unpack_from("<Q", data, offset)
    assert struct.unpack_from("<I", data, offset + 8)[0] == metrics._masked_crc(
        data[offset:offset + 8])
    record = data[offset + 12:offset + 12 + length]
    assert struct.unpack_from("<I", data, offset + 12 + length)[0] == metrics._masked_crc(record)
    records.append(record)
    offset += 16 + length
  return records


def test_metrics_on_gcs_append_across_runs_without_rewriting(gcs):
  from bertjax import files

  workdir = gcs.url_of("metrics/run")
  first = metrics.MetricWriter(workdir, flush_every_s=3600)
  first.write(1, {"loss": 3.0}, "train/")
  first.flush()
  first.write(2, {"loss": 2.0}, "train/")
  first.close()  # a resumed run appends to the same metrics.jsonl
  second = metrics.MetricWriter(workdir, flush_every_s=3600)
  second.write(3, {"loss": 1.0}, "train/")
  second.close()
  lines = files.read_text(files.join(workdir, "metrics.jsonl")).splitlines()
  assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
  events = files.listdir(files.join(workdir, "tensorboard"))
  assert len(events) == 2  # one event file per run, no temporary parts left over
  assert all(name.startswith("events.out.tfevents.") for name in events)
  counts = sorted(len(_read_events(files.read_bytes(files.join(workdir, "tensorboard", name))))
                  for name in events)
  assert counts == [2, 3]  # file version + steps
  assert files.listdir(workdir) == ["metrics.jsonl", "tensorboard"]


def test_a_part_left_by_a_kill_is_not_read_as_metrics(gcs, monkeypatch):
  """A kill between an append's part upload and its removal leaves the part:
  TensorBoard (every name holding "tfevents") must not read it as events."""
  import gcsfs

  from bertjax import files

  async def lost_removal(self, path, *args, **kwargs):
    raise OSError(f"killed before removing {path}")

  # gcsfs binds its sync methods to an instance when it makes one, and keeps
  # its instances: the faulty one is made here and dropped after.
  gcsfs.GCSFileSystem.clear_instance_cache()
  monkeypatch.setattr(gcsfs.GCSFileSystem, "_rm_file", lost_removal)
  try:
    workdir = gcs.url_of("metrics/killed")
    writer = metrics.MetricWriter(workdir, flush_every_s=3600)
    writer.write(1, {"loss": 3.0}, "train/")
    writer.flush()  # made: the next upload appends, through a part
    writer.write(2, {"loss": 2.0}, "train/")
    writer.close()  # the appends' parts stay
  finally:
    monkeypatch.undo()
    gcsfs.GCSFileSystem.clear_instance_cache()
  names = files.listdir(files.join(workdir, "tensorboard"))
  assert [n for n in names if n.startswith(".part-")]  # the fault happened
  assert len([n for n in names if "tfevents" in n]) == 1
  assert [n for n in files.listdir(workdir) if not n.startswith(".part-")] == [
      "metrics.jsonl", "tensorboard"]
  lines = files.read_text(files.join(workdir, "metrics.jsonl")).splitlines()
  assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_a_storage_outage_never_stops_the_writer(gcs, caplog, monkeypatch):
  import types

  import gcsfs.retry

  from bertjax import files

  async def no_wait(seconds):  # gcsfs retries each request 6 times over ~30 s
    del seconds

  monkeypatch.setattr(gcsfs.retry, "asyncio", types.SimpleNamespace(sleep=no_wait))
  workdir = gcs.url_of("metrics/outage")
  writer = metrics.MetricWriter(workdir, flush_every_s=3600)
  writer.write(1, {"loss": 3.0}, "train/")
  writer.flush()
  gcs.stop()
  try:
    writer.write(2, {"loss": 2.0}, "train/")
    with caplog.at_level("WARNING"):
      writer.flush()  # logged, not raised
    assert "could not write (try 1" in caplog.text and "training goes on" in caplog.text
  finally:
    gcs.start()
  writer.write(3, {"loss": 1.0}, "train/")
  writer.close()
  lines = files.read_text(files.join(workdir, "metrics.jsonl")).splitlines()
  assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]  # the batch was kept


def _cut_run(path_write, fragment):
  """Two whole lines, then `fragment`: a run killed while it wrote its third."""
  path_write(b'{"step": 1, "train/loss": 2.5}\n{"step": 2, "train/loss": 2.4}\n' + fragment)


@pytest.mark.parametrize("fragment", [b'{"step": 3, "tr', b'{"step": 3, "x": "' + b"y" * 200_000])
def test_a_line_cut_by_a_kill_is_dropped_before_the_next_run_appends(tmp_path, caplog,
                                                                     fragment):
  """Locally: the next run's lines each read, the cut one is gone and said so
  (a fragment longer than the tail block read too)."""
  path = tmp_path / "metrics.jsonl"
  _cut_run(path.write_bytes, fragment)
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(3, {"loss": 2.3}, "train/")
  writer.close()
  records = [json.loads(line) for line in path.read_text().splitlines()]
  assert [r["step"] for r in records] == [1, 2, 3]
  assert f"ended in part of a line ({len(fragment)} bytes" in caplog.text
  _cut_run(path.write_bytes, b"")  # whole lines: nothing is dropped
  metrics.MetricWriter(str(tmp_path)).close()
  assert path.read_bytes().count(b"\n") == 2


def test_a_line_cut_by_a_kill_is_dropped_on_gcs_too(gcs, caplog):
  from bertjax import files

  workdir = gcs.url_of("metrics/cut")
  path = files.join(workdir, "metrics.jsonl")
  _cut_run(lambda data: files.write_bytes(path, data), b'{"step": 3, "tr')
  writer = metrics.MetricWriter(workdir)
  writer.write(3, {"loss": 2.3}, "train/")
  writer.close()
  records = [json.loads(line) for line in files.read_text(path).splitlines()]
  assert [r["step"] for r in records] == [1, 2, 3]
  assert "ended in part of a line (15 bytes" in caplog.text


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_reader_skips_and_counts_a_cut_last_line(where, tmp_path, caplog, request):
  """A run still going (or killed) leaves its last line cut: readers take the
  whole records, skip the rest and say which lines they skipped."""
  from bertjax import files

  if where == "gcs":
    path = files.join(request.getfixturevalue("gcs").url_of("metrics/read"), "metrics.jsonl")
  else:
    path = str(tmp_path / "metrics.jsonl")
  _cut_run(lambda data: files.write_bytes(path, data), b'{"step": 3, "tr')
  with caplog.at_level(logging.WARNING):
    records = metrics.read_jsonl(path)
  assert [r["step"] for r in records] == [1, 2]
  assert (f"{path}: skipped 1 line(s) that do not read as a JSON record (line 3; the last "
          "was cut off as a run stopped)") in caplog.text


def test_a_reader_skips_lines_edited_by_hand_and_takes_the_rest(tmp_path, caplog):
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(b'\xef\xbb\xbf{"step": 1}\r\n[1, 2]\r\n\r\nnot json\n{"step": 4}\n')
  with caplog.at_level(logging.WARNING):
    records = metrics.read_jsonl(str(path))
  assert [r["step"] for r in records] == [1, 4]
  assert "skipped 2 line(s) that do not read as a JSON record (line 2, 4)" in caplog.text
  assert "cut off" not in caplog.text
