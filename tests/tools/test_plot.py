"""`python -m bertjax.tools.plot`: runs' curves from their metrics.jsonl."""

import json
import subprocess
import sys

import pytest

from bertjax import errors
from bertjax.tools import plot

matplotlib = pytest.importorskip("matplotlib")


def _write(path, records, tail=""):
  path.mkdir(parents=True, exist_ok=True)
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
  return str(path)


def _pretraining(path, shift=0.0):
  records = [{"step": s, "train/loss": 5.0 - s / 100 + shift, "train/mlm_accuracy": s / 1000,
              "train/learning_rate": 1e-3, "train/tokens_per_s": 1000.0} for s in (10, 20, 30)]
  records += [{"step": 20, "eval/mlm_accuracy": 0.3, "eval/mlm_perplexity": 30.0},
              {"step": 30, "train/loss": 9.0},  # the same step again, from a rerun
              {"step": 30, "eval/mlm_accuracy": 0.4}]
  return _write(path, records, tail='{"step": 40, "train/lo')  # cut short by a kill


def test_a_run_reads_as_its_last_value_each_step(tmp_path):
  series = plot.read_run(_pretraining(tmp_path / "a"))
  assert series["train/loss"] == {10: 4.9, 20: 4.8, 30: 9.0}
  assert series["eval/mlm_accuracy"] == {20: 0.3, 30: 0.4}
  with pytest.raises(errors.MissingFileError, match="metrics.jsonl not found"):
    plot.read_run(str(tmp_path / "none"))


def test_panels_are_the_usual_ones_a_run_has_and_its_dev_figures(tmp_path):
  pretraining = plot.read_run(_pretraining(tmp_path / "a"))
  assert plot.panels([pretraining], None) == ["loss", "mlm_accuracy", "learning_rate",
                                               "tokens_per_s"]
  glue = plot.read_run(_write(tmp_path / "g", [
      {"step": 5, "train/loss": 0.7, "train/examples_per_s": 10.0},
      {"step": 5, "dev/matthews_corr": 0.2, "dev/accuracy": 0.6}]))
  assert plot.panels([glue], None) == ["loss", "matthews_corr", "accuracy", "examples_per_s"]
  assert plot.panels([pretraining], ["learning_rate"]) == ["learning_rate"]
  with pytest.raises(errors.UsageError, match="no run has nsp_accuracy; they have"):
    plot.panels([pretraining], ["nsp_accuracy"])


def test_every_run_is_drawn_in_every_panel(tmp_path):
  runs = {"a": plot.read_run(_pretraining(tmp_path / "a")),
          "b": plot.read_run(_pretraining(tmp_path / "b", shift=1.0))}
  figure = plot.draw(runs, ["loss", "mlm_accuracy"])
  loss, accuracy = figure.axes[:2]
  assert [line.get_label() for line in loss.get_lines()] == ["a train", "b train"]
  assert sorted(line.get_label() for line in accuracy.get_lines()) == [
      "a eval", "a train", "b eval", "b train"]
  b_loss = loss.get_lines()[1]
  assert list(b_loss.get_xdata()) == [10, 20, 30] and b_loss.get_ydata()[0] == 5.9


def test_the_command_writes_a_png(tmp_path):
  run = _pretraining(tmp_path / "my run")
  out = tmp_path / "plots" / "curves.png"
  result = subprocess.run([sys.executable, "-m", "bertjax.tools.plot", f"--runs={run}",
                           f"--output={out}"], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "loss, mlm_accuracy, learning_rate, tokens_per_s of my run" in result.stdout
