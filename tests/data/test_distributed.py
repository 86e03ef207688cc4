"""Two real JAX processes (jax.distributed over gloo on 127.0.0.1) read disjoint
documents that together cover the data, and assemble one global batch."""

import json
import os
import socket
import subprocess
import sys

from bertjax.data import loader


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_share_the_data(prepared_dir, tmp_path):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  processes = [subprocess.Popen(
      [sys.executable, "-m", "tests.data.two_process_loader", str(i), str(port), prepared_dir,
       str(tmp_path / f"{i}.json")], cwd=root, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in processes]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output[-3000:]
  results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]

  documents = [set(r["documents"]) for r in results]
  assert not documents[0] & documents[1]
  assert documents[0] | documents[1] == set(range(len(loader.DocumentSource(prepared_dir))))
  assert sorted(results[0]["documents"]) != results[0]["documents"]  # shuffled
  assert results[0]["masks"] != results[1]["masks"]  # hosts mask differently
  for result in results:
    assert result["global_shape"] == [8, 128]  # 2 processes x 4 rows
    assert result["local_rows_match"]
    assert result["global_sum"] == results[0]["local_sum"] + results[1]["local_sum"]
