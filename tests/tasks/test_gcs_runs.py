"""The Cloud TPU user's path with every path on gs://, against a real GCS API
server (fake-gcs-server on 127.0.0.1, see tests/gcs.py).

Data prepared straight into a bucket; pre-training with its workdir there,
killed with -9 and rerun, and through a storage outage; the run read back by
`load_pretrained`; fine-tuning from it and from a Hugging Face directory on
gs://, with the data and the workdir on gs://. Losses must equal a local run's
bit for bit: the storage changes nothing that is computed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bertjax import files
from tests.tasks.test_glue import write_sst2
from tests.tasks.test_pretrain import ROOT, _args, _env

TOTAL, SWITCH = 90, 50
RUN = {"train.total_steps": TOTAL, "train.long_from_step": SWITCH,
       "checkpoint.every_steps": 10, "eval.every_steps": 45}


def _run(args, env, check=True):
  result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
  if check:
    assert result.returncode == 0, result.stderr[-4000:]
  return result


def _metric_lines(workdir):
  path = files.join(workdir, "metrics.jsonl")
  if not files.exists(path):
    return []
  return [json.loads(line) for line in files.read_text(path).splitlines()]


def _losses(workdir):
  """step -> every logged training loss of that step (reruns log a step again)."""
  losses = {}
  for record in _metric_lines(workdir):
    if "train/loss" in record:
      losses.setdefault(record["step"], []).append(record["train/loss"])
  return losses


def _start_until(args, env, workdir, at_step):
  """Starts a run; returns the process once gs:// metrics show `at_step`."""
  process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 600
  while time.time() < deadline and process.poll() is None:
    if max(_losses(workdir), default=0) >= at_step:
      return process
    time.sleep(0.2)
  process.kill()
  pytest.fail(f"the run did not reach step {at_step}: {process.communicate()[1][-3000:]}")


@pytest.fixture(scope="module")
def gcs_data(gcs, prepared_dir):
  """`prepared_dir`'s corpus prepared by the tool into the bucket, with the
  vocabulary read from the bucket too."""
  root = os.path.dirname(prepared_dir)
  vocab = gcs.url_of("runs/vocab.txt")
  files.upload(os.path.join(root, "vocab.txt"), vocab)
  data = gcs.url_of("runs/data")
  _run([sys.executable, "-m", "bertjax.tools.prepare_pretraining_data",
        f"--input={os.path.join(root, 'corpus.txt')}", f"--vocab={vocab}",
        f"--output_dir={data}", "--num_shards=3", "--num_workers=1"], _env())
  return data


@pytest.fixture(scope="module")
def local_run(prepared_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("local_run"))
  _run(_args(workdir, prepared_dir, **RUN), _env())
  return workdir


def _env_with(gcs):
  return {**_env(), **gcs.env, "BERTJAX_CACHE_DIR": os.environ["BERTJAX_CACHE_DIR"]}


def test_prepared_data_in_the_bucket_is_the_local_data(gcs_data, prepared_dir):
  names = sorted(n for n in os.listdir(prepared_dir) if not n.startswith("."))
  assert files.listdir(gcs_data) == names
  for name in names:
    if name.endswith(".array_record"):
      assert files.read_bytes(files.join(gcs_data, name)) == open(
          os.path.join(prepared_dir, name), "rb").read(), name


@pytest.fixture(scope="module")
def killed_run(gcs, gcs_data):
  """A run on gs:// killed with -9 after step 30, then rerun to the end:
  (workdir, the step the first run's metrics reached)."""
  workdir = gcs.url_of("runs/killed")
  args = _args(workdir, gcs_data, **RUN)
  process = _start_until(args, _env_with(gcs), workdir, 30)
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=60)
  killed_at = max(_losses(workdir))
  _run(args, _env_with(gcs))
  return workdir, killed_at


def test_killed_and_rerun_on_gcs_matches_a_local_run(killed_run, local_run):
  expected = {step: values[0] for step, values in _losses(local_run).items()}
  workdir, killed_at = killed_run
  assert 30 <= killed_at < TOTAL
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL + 1))  # every step, the first run's kept
  for step, values in losses.items():
    assert values == [expected[step]] * len(values), step  # bit-identical, reruns included
  # One per run, both readable to the end; a part of an append the kill cut
  # short is not taken for an event file.
  events = [name for name in files.listdir(files.join(workdir, "tensorboard"))
            if "tfevents" in name]
  assert len(events) == 2
  from tests.test_metrics import _read_events
  steps = [len(_read_events(files.read_bytes(files.join(workdir, "tensorboard", name))))
           for name in events]
  # The killed run's file holds what its last upload stored (a kill can land
  # between the metrics' upload and the events'); every record checks out.
  assert min(steps) >= 2
  assert [r["step"] for r in _metric_lines(workdir) if "eval/mlm_accuracy" in r][-1] == TOTAL


def test_preempted_on_gcs_logs_every_step_once(gcs, gcs_data, local_run):
  """SIGTERM (a TPU VM's preemption notice): the run saves, stores the metrics
  still buffered for gs:// and exits 143; the rerun repeats no step."""
  expected = {step: values[0] for step, values in _losses(local_run).items()}
  workdir = gcs.url_of("runs/preempted")
  args = _args(workdir, gcs_data, **RUN)
  process = _start_until(args, _env_with(gcs), workdir, 25)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 143, stderr[-3000:]
  stopped = max(_losses(workdir))
  assert str(stopped) in files.listdir(files.join(workdir, "checkpoints"))  # saved there
  _run(args, _env_with(gcs))
  losses = _losses(workdir)
  assert losses == {step: [expected[step]] for step in range(1, TOTAL + 1)}


def test_a_storage_outage_mid_run_is_survived_or_resumed(gcs, gcs_data, local_run):
  expected = {step: values[0] for step, values in _losses(local_run).items()}
  workdir = gcs.url_of("runs/outage")
  args = _args(workdir, gcs_data, **RUN)
  process = _start_until(args, _env_with(gcs), workdir, 20)
  gcs.stop()
  time.sleep(4)
  gcs.start()
  _, stderr = process.communicate(timeout=600)
  if process.returncode != 0:  # failed, then it must say why, and resume
    assert "Traceback" in stderr or "rror" in stderr, stderr[-3000:]
    _run(args, _env_with(gcs))
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL + 1))
  for step, values in losses.items():
    assert values == [expected[step]] * len(values), step


def test_storage_failing_during_a_save_ends_in_one_line_and_the_rerun_resumes(
    gcs, gcs_data, local_run):
  """The workdir's bucket vanishes while the run saves (404 on every request,
  which no client retries): the run stops with one line that names the save
  that failed and the step a rerun resumes from, and the rerun, with the
  bucket back, ends as the local run did."""
  bucket = "bertjax-flaky"
  there = os.path.join(gcs.root, "storage", bucket)
  gone = os.path.join(gcs.root, f"{bucket}-gone")
  os.makedirs(there)
  workdir = f"gs://{bucket}/run"
  args = _args(workdir, gcs_data, **RUN)
  process = subprocess.Popen(args, cwd=ROOT, env=_env_with(gcs), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  steps = os.path.join(there, "run", "checkpoints")
  deadline = time.time() + 300
  while not (os.path.isdir(steps) and "20" in os.listdir(steps)) and time.time() < deadline:
    assert process.poll() is None, process.communicate()[1][-3000:]
    time.sleep(0.05)
  # The bucket goes while the server is down (the clients retry the refused
  # connections). Real GCS fails an upload whose bucket went mid-way; the fake
  # server would finish one begun before the bucket went and create the bucket
  # again for it, and the run would carry on into the new bucket. A restart
  # forgets the uploads in progress.
  gcs.stop()
  os.rename(there, gone)
  gcs.start()
  _, stderr = process.communicate(timeout=300)  # the save of step 20 (or 30) fails
  assert not os.path.exists(there), "the bucket came back during the run"
  os.rename(gone, there)
  assert process.returncode == 2, stderr[-3000:]
  assert "Traceback" not in stderr, stderr[-3000:]
  last = stderr.strip().splitlines()[-1]
  failed = re.fullmatch(
      rf"error: saving the checkpoint of step (\d+) to {workdir}/checkpoints failed "
      r"\((?:FileNotFound|Value)Error: .*\); the run stopped there: rerun the same "
      r"command to resume from step (\d+)( \(no finished checkpoint\))? "
      r"\(--verbosity=1 shows where\)", last)
  assert failed, last
  assert int(failed.group(2)) == int(failed.group(1)) - 10
  _run(args, _env_with(gcs))
  expected = {step: values[0] for step, values in _losses(local_run).items()}
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL + 1))
  for step, values in losses.items():
    assert values == [expected[step]] * len(values), step


def test_load_pretrained_from_gcs_equals_the_local_run(killed_run, local_run):
  import jax

  import bertjax

  workdir, _ = killed_run  # trained on gs://, read there in place
  remote, local = bertjax.load_pretrained(workdir), bertjax.load_pretrained(local_run)
  jax.tree.map(np.testing.assert_array_equal, remote.params, local.params)
  assert remote.tokenizer.tokenize("the quick fox") == local.tokenizer.tokenize("the quick fox")


@pytest.mark.parametrize("source", ["pretraining run", "hugging face"])
def test_fine_tunes_from_gcs_into_gcs(gcs, local_run, tiny_hf_checkpoint, tmp_path, source):
  import bertjax
  from bertjax.tasks import glue
  from tests.tasks.test_glue import _glue_config
  from tests.test_pretrained import _upload_tree

  if source == "pretraining run":
    init = gcs.url_of("runs/finetune-from")
    _upload_tree(local_run, init)
  else:
    init = gcs.url_of("runs/hf")
    _upload_tree(tiny_hf_checkpoint, init)
  write_sst2(str(tmp_path / "SST-2"), train=256, dev=64, test=8)
  data = gcs.url_of(f"runs/glue-{source[:2]}/SST-2")
  _upload_tree(str(tmp_path / "SST-2"), data)
  workdir = gcs.url_of(f"runs/glue-{source[:2]}/run")
  result = glue.run(_glue_config("sst2", init, data, **{"train.epochs": 2.0}), workdir)
  assert files.read_json(files.join(workdir, "results.json"))["dev"] == result["dev"]
  assert len(files.read_text(files.join(workdir, "submission", "SST-2.tsv")).splitlines()) == 9
  assert [json.loads(line)["step"] for line in files.read_text(
      files.join(workdir, "metrics.jsonl")).splitlines() if "dev/accuracy" in line] == [8, 16]
  tuned = bertjax.load_pretrained(files.join(workdir, "model"))
  assert tuned.task == "sequence_classification" and tuned.labels == ["0", "1"]


def test_a_two_minute_storage_outage_is_waited_out(gcs, gcs_data, local_run):
  """Cloud Storage gone for two minutes: the run waits for it instead of
  ending (here the save in progress is held by tensorstore's own retries; a
  save they give up on is waited for by the run: tests/faults/
  test_storage_outage.py), and ends as the local run did, every step logged
  once."""
  expected = {step: values[0] for step, values in _losses(local_run).items()}
  workdir = gcs.url_of("runs/long-outage")
  args = _args(workdir, gcs_data, **RUN) + ["--storage_wait_s=600"]
  process = _start_until(args, _env_with(gcs), workdir, 15)
  gcs.stop()
  try:
    time.sleep(120)
    assert process.poll() is None, process.communicate()[1][-3000:]  # still waiting
  finally:
    gcs.start()
  _, stderr = process.communicate(timeout=600)
  assert process.returncode == 0, stderr[-3000:]
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, TOTAL + 1))
  for step, values in losses.items():
    assert values == [expected[step]], step
