"""Metrics files: TensorBoard events readable by TensorBoard's reader, JSONL."""

import glob
import json

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


def test_orbax_info_lines_are_quiet_at_the_default_verbosity():
  import logging as pylogging

  from absl import logging

  metrics.quiet_checkpoint_logs()
  metrics.quiet_checkpoint_logs()  # installed once
  handler = logging.get_absl_handler()
  installed = [f for f in handler.filters if isinstance(f, metrics._OrbaxInfoFilter)]
  assert len(installed) == 1

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
    logging.set_verbosity(logging.DEBUG)  # --verbosity=1
    assert installed[0].filter(record(orbax_path, pylogging.INFO))
  finally:
    logging.set_verbosity(verbosity)
