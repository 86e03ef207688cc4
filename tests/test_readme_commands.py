"""The README's data-preparation commands run as written (on the demo corpus)."""

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_prepare_data_commands_run(tmp_path):
  text = open(README, encoding="utf-8").read()
  block = re.search(r"## Pre-train on your corpus\n.*?```bash\n(.*?)```", text, re.S).group(1)
  commands = [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
  assert len(commands) == 2
  for command in commands:
    args = command.split()
    assert args[:2] == ["python", "-m"]
    result = subprocess.run([sys.executable, *args[1:]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
  assert "documents:" in result.stdout
  assert os.path.isfile(tmp_path / "data" / "demo" / "dataset_info.json")
