"""The Colab notebook runs top to bottom (on a CPU kernel, a tiny Hugging Face
checkpoint and a small RTE-format task), and is kept without outputs."""

import json
import os

import nbformat

from tests.tasks.test_glue import write_rte

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "launch", "colab_finetune_glue.ipynb")


def _parameters_index(notebook) -> int:
  tagged = [i for i, cell in enumerate(notebook.cells)
            if "parameters" in cell.metadata.get("tags", [])]
  assert len(tagged) == 1, "the notebook needs exactly one cell tagged 'parameters'"
  return tagged[0]


def test_notebook_is_valid_and_has_no_outputs():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(notebook)
  for cell in notebook.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:80]
  # The TPU runtime it asks Colab for: v5e-1 (Colab's name for it in the metadata).
  assert notebook.metadata["accelerator"] == "TPU"
  assert notebook.metadata["colab"]["gpuType"] == "V5E1"
  _parameters_index(notebook)


def test_notebook_fine_tunes_evaluates_and_exports(tiny_hf_checkpoint, tmp_path, monkeypatch):
  from nbclient import NotebookClient

  data = str(tmp_path / "RTE")
  write_rte(data)
  workdir, export_dir = str(tmp_path / "run"), str(tmp_path / "run_hf")
  # As papermill does: the test's values in a cell right after the defaults.
  parameters = {
      "INIT_CHECKPOINT": tiny_hf_checkpoint, "GLUE_TASK": "rte", "DATA_DIR": data,
      "WORKDIR": workdir, "EXPORT_DIR": export_dir,
      "OVERRIDES": {"model.dtype": "float32", "max_seq_length": 32,
                    "train.learning_rate": 2e-3, "train.epochs": 6.0},
      "EXAMPLES": [("the fox jump world", "a lazy hello test"),
                   ("the fox jump world", "a lazy dog test")],
  }
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  notebook.cells.insert(_parameters_index(notebook) + 1, nbformat.v4.new_code_cell(
      "\n".join(f"{name} = {value!r}" for name, value in parameters.items())))
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  # The kernel runs in a directory of its own, as on Colab: it must find the
  # repository's configs through the installed package.
  client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}})
  client.execute()

  results = json.load(open(os.path.join(workdir, "results.json")))
  assert results["dev"]["accuracy"] > 90.0, results
  outputs = "".join(output.get("text", "") for cell in notebook.cells
                    for output in cell.get("outputs", []))
  assert "backend cpu: 2 devices" in outputs
  assert "entailment (" in outputs and "not_entailment (" in outputs
  assert "largest logit difference" in outputs  # the export was checked
  assert os.path.isfile(os.path.join(export_dir, "model.safetensors"))
  assert json.load(open(os.path.join(export_dir, "config.json")))["id2label"] == {
      "0": "entailment", "1": "not_entailment"}

