"""Experiment trackers people already use: Weights & Biases, fed what the
metrics writer writes (`bertjax.metrics.MetricWriter`).

Set `config.wandb.project` (the `[wandb]` extra installs the client) and
process 0 sends W&B the run's config and every metric it writes to
`metrics.jsonl`, at the training step it writes it at. A pre-training run
keeps its W&B run's id in `<workdir>/wandb_run.json`, so a rerun that resumes
from a checkpoint, after a preemption or a `kill -9`, goes on as the same W&B
run; a fine-tuning run, which starts afresh on every rerun, is a new W&B run
each time.

W&B takes each run's steps in increasing order and refuses a step below the
last it holds, so each step goes to W&B once, with its first values. A
resumed run first sends what `metrics.jsonl` holds after the last step W&B
holds (a run killed with `kill -9` may leave W&B without its last steps,
which a resume from an earlier checkpoint does not repeat), then its own
steps after that: the steps it repeats keep their first values in W&B, and
`metrics.jsonl` holds both. (A run that trained without W&B so far sends all
of `metrics.jsonl` first.) What W&B holds is what its server says (online),
or what the earlier offline files of the run in W&B's directory hold
(offline: `wandb sync --id <id>` uploads them in the order they started, as
one run; docs/training.md gives the command).

W&B records each run's exit status (`exit_status`): a failed run is a failed
W&B run, and a preempted one is marked preempting before it finishes.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import secrets
import signal
import struct
from typing import Any, Iterator, Mapping

from absl import logging

from bertjax import errors, files, metrics, preemption

# The exit status of a run stopped by SIGTERM (`bertjax.tasks.pretrain_stop`).
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
# Seconds the end of a run waits for W&B's upload, a preempted one's too
# (SIGKILL follows SIGTERM within the grace): what is left, `wandb sync` uploads.
FINISH_TIMEOUT_S = 20.0
RUN_FILE = "wandb_run.json"  # in the workdir: the W&B run a resumed pre-training run goes on
MODES = ("online", "offline", "disabled")
INSTALL = "pip install 'bertjax[wandb]'"


def _settings(config: Any) -> Any:
  """`config.wandb`, or None where the config has no such block or no project."""
  settings = config.get("wandb") if hasattr(config, "get") else None
  return settings if settings is not None and settings.get("project") else None


def wanted(config: Any) -> bool:
  """Whether `config` asks for a W&B run (a project, a mode other than disabled)."""
  settings = _settings(config)
  return settings is not None and settings.mode != "disabled"


def check(config: Any) -> None:
  """Refuses W&B settings that cannot run, before anything starts or is written.

  Raises:
    UsageError: `wandb.mode` is not one of `MODES`.
    MissingDependencyError: `wandb.project` is set and the client is not installed.
  """
  settings = _settings(config)
  if settings is None:
    return
  if settings.mode not in MODES:
    raise errors.UsageError(f"--config.wandb.mode={settings.mode!r}: give one of "
                            f"{', '.join(MODES)}")
  if settings.mode != "disabled" and importlib.util.find_spec("wandb") is None:
    raise errors.MissingDependencyError(
        f"--config.wandb.project is set but wandb is not installed: {INSTALL}, or leave "
        "out --config.wandb.project")


class WandbSink:
  """One W&B run, fed the metrics of `MetricWriter.write`.

  Args:
    run: The started `wandb` run.
    held: The last step W&B holds of this run already (-1: none): steps up
      to it are not sent again.
  """

  def __init__(self, run: Any, held: int = -1):
    self.run = run
    self.held = held
    self.last = held  # the last step sent
    self.skipped = 0  # writes of steps W&B holds already

  def replay(self, workdir: str, held: int) -> int:
    """Sends the steps after `held` that the workdir's `metrics.jsonl` holds
    (a run killed before W&B took its last steps, which a resume from an
    earlier checkpoint does not repeat); returns how many steps it sent.

    Each step goes once, with its first values: the lines of a step that a
    resumed run repeated are not sent again.
    """
    path = files.join(workdir, "metrics.jsonl")
    if not files.isfile(path):
      self.held = self.last = held
      return 0
    sent, last, repeating = 0, held, False
    for record in metrics.read_jsonl(path):
      step = record.pop("step", None)
      if not isinstance(step, int) or step <= held:
        continue
      if step < last or step == last and repeating:  # a resumed run repeats these
        repeating = True
        continue
      sent += step > last
      repeating = False
      self.run.log(record, step=step)
      last = step
    self.held = self.last = last
    return sent

  def write(self, step: int, values: Mapping[str, Any]) -> None:
    """Sends a step's metrics (names as in `metrics.jsonl`)."""
    if step <= self.held or step < self.last:  # W&B holds it (or a later step) already
      self.skipped += 1
      return
    self.run.log(dict(values), step=step)
    self.last = step

  def close(self, error: BaseException | None = None) -> None:
    """Finishes the W&B run; never raises (the run's own error stays the one
    it ends with).

    Args:
      error: What ends the run, if it fails or is stopped: W&B records its
        exit status (a failed run), and a preemption marks the run preempting
        at once, before the upload that `finish` waits for (at most
        `FINISH_TIMEOUT_S`; online, not at all where the run must end at
        once, `preemption.ExitAtOnce`).
    """
    if self.skipped:
      logging.info("W&B: %d writes of steps up to %d, which the run already held, were not "
                   "sent again", self.skipped, self.held)
    status = exit_status(error)
    try:
      if status == PREEMPTED_EXIT_CODE:
        self.run.mark_preempting()
      if isinstance(error, preemption.ExitAtOnce) and not self.run.offline:
        return  # no time to wait for an upload: the process ends now (offline: its files)
      self.run.finish(exit_code=status)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("W&B could not finish its run (%s); `wandb sync` uploads what it "
                      "kept in its directory", (str(e).strip().splitlines() or
                                                [type(e).__name__])[0])


def exit_status(error: BaseException | None) -> int:
  """The exit status a run ending with `error` ends its command with (0: none)."""
  if error is None:
    return 0
  if isinstance(error, SystemExit):
    return error.code if isinstance(error.code, int) else int(error.code is not None)
  if isinstance(error, KeyboardInterrupt):
    return 128 + signal.SIGINT
  return errors.exit_status(error) or 1


def open_wandb(config: Any, workdir: str) -> WandbSink | None:
  """Starts (or, for a resumed pre-training run, resumes) the W&B run the
  config asks for; None where it asks for none. Process 0 only.

  Raises:
    MissingDependencyError: the client is not installed.
    UsageError: W&B could not start the run (not logged in, say).
  """
  settings = _settings(config)
  if settings is None or settings.mode == "disabled":
    return None
  check(config)
  import wandb  # pylint: disable=import-outside-toplevel

  resumable = config.get("task") == "pretrain"  # fine-tuning runs start afresh
  known = read_run_id(workdir) if resumable else None
  run_id = known or secrets.token_hex(6)  # W&B's ids: letters and digits
  directory = settings.dir or (None if files.is_remote(workdir) else workdir)
  if directory:
    os.makedirs(directory, exist_ok=True)
  try:
    run = wandb.init(
        project=settings.project, entity=settings.entity or None, name=settings.name or None,
        group=settings.group or None, tags=list(settings.tags) or None,
        notes=settings.notes or None, mode=settings.mode, dir=directory, id=run_id,
        resume="allow",
        settings=wandb.Settings(console="off", finish_timeout=FINISH_TIMEOUT_S))
  except Exception as e:  # pylint: disable=broad-except  # the client's own kinds
    message = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise errors.UsageError(
        f"W&B could not start the run ({message}): log in (`wandb login`, or WANDB_API_KEY), "
        "or set --config.wandb.mode=offline") from None
  sink = WandbSink(run)
  try:
    return _started(sink, config, workdir, resumable, known)
  except BaseException as e:
    sink.close(e)
    raise


def _started(sink: WandbSink, config: Any, workdir: str, resumable: bool,
             known: str | None) -> WandbSink:
  """`sink`, its run given the config and, for a resumed pre-training run,
  the steps W&B lacks (`WandbSink.replay`)."""
  run, settings = sink.run, _settings(config)
  # A rerun may change settings (total_steps, say): the run's config says the newest.
  run.config.update(config.to_dict(), allow_val_change=True)
  if not resumable:
    return sink
  run_id = run.id
  if known:
    held = max(run.step - 1, _offline_last_step(run.settings.wandb_dir, run_id, run.dir))
  else:  # a new W&B run (of a run that may have trained without W&B so far)
    files.write_json(files.join(workdir, RUN_FILE), {"id": run_id, "project": settings.project})
    held = -1
  sent = sink.replay(workdir, held)
  if known or sent:
    logging.info("W&B: going on with run %s, which held steps up to %d%s", run_id, held,
                 f"; sent {sent} more from metrics.jsonl" if sent else "")
  return sink


def read_run_id(workdir: str) -> str | None:
  """The W&B run a pre-training workdir goes on as, if it has one."""
  path = files.join(workdir, RUN_FILE)
  return files.read_json(path).get("id") if files.isfile(path) else None


def _offline_last_step(wandb_dir: str, run_id: str, current: str) -> int:
  """The last step the earlier offline files of W&B run `run_id` hold (-1: none)."""
  last = -1
  own = os.path.dirname(os.path.abspath(current))  # this process's run directory
  # (A second directory of one second and id gets a "-1" after the id.)
  paths = [path for pattern in (f"offline-run-*-{run_id}", f"offline-run-*-{run_id}-*")
           for path in glob.glob(os.path.join(wandb_dir, pattern, f"run-{run_id}.wandb"))]
  for path in paths:
    if os.path.dirname(os.path.abspath(path)) == own:
      continue
    try:
      last = max(last, _last_history_step(path))
    except Exception as e:  # pylint: disable=broad-except  # another client's format
      logging.warning("W&B: could not read the steps of %s (%s)", path, e)
  return last


def _last_history_step(path: str) -> int:
  """The last history step of a W&B transaction log (`run-<id>.wandb`), -1 if none."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel

  last = -1
  for data in _log_records(path):
    record = wandb_internal_pb2.Record()
    record.ParseFromString(data)
    if record.WhichOneof("record_type") == "history":
      last = max(last, record.history.step.num)
  return last


_BLOCK = 32768  # LevelDB's log format, which W&B's transaction log is written in
_HEADER = struct.Struct("<IHB")  # a record's checksum, length and type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_records(path: str) -> Iterator[bytes]:
  """The records of a W&B transaction log: its 7-byte file header (":W&B",
  magic, version), then LevelDB log blocks. A record cut short by a kill ends it."""
  with open(path, "rb") as f:
    data = f.read()
  if data[:4] != b":W&B":
    raise errors.CorruptFileError(f"{path} is not a W&B transaction log")
  position, parts = 7, b""
  while position + _HEADER.size <= len(data):
    left = _BLOCK - position % _BLOCK
    if left < _HEADER.size:  # a block's tail too short for a header is padding
      position += left
      continue
    _, length, kind = _HEADER.unpack_from(data, position)
    if kind == 0 and length == 0:  # zeros to the block's end
      position += left
      continue
    body = data[position + _HEADER.size:position + _HEADER.size + length]
    if len(body) < length:
      return
    position += _HEADER.size + length
    if kind == _FULL:
      yield body
    elif kind == _FIRST:
      parts = body
    elif kind == _MIDDLE:
      parts += body
    elif kind == _LAST:
      yield parts + body
      parts = b""

