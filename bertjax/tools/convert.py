r"""Convert BERT checkpoints between bertjax, Hugging Face and Google TF formats.

  # Hugging Face or Google TF directory -> bertjax model directory
  python -m bertjax.tools.convert --input=uncased_L-12_H-768_A-12 --output=bert_base
  # bertjax model directory -> Hugging Face directory (transformers loads it)
  python -m bertjax.tools.convert --input=bert_base --output=bert_base_hf

The format of --input is detected; --to defaults to the other side (hf for a
bertjax input, bertjax otherwise). The output is written under a temporary name
and renamed when complete: a failed conversion leaves nothing behind.
"""

from __future__ import annotations

from absl import flags

from bertjax import errors, files, paths, usage

_INPUT = paths.DEFINE_path("input", None, "Model directory (or TF checkpoint prefix), a "
                           "pre-training workdir or a Hugging Face Hub id.", kind="model",
                           required=True)
_OUTPUT = paths.DEFINE_path("output", None, "Directory to write.", required=True)
_TO = flags.DEFINE_enum("to", None, ["hf", "bertjax"],
                        "Output format (default: hf for a bertjax input, else bertjax).")
_TASK = flags.DEFINE_string("task", None, "Load into this task model (see "
                            "bertjax.models.TASK_MODELS); default: the checkpoint's.")
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", None,
                                   "Tokenizer casing, for checkpoints that do not say.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing --output.")


def main(argv):
  del argv
  with usage.signals_held():  # JAX and Flax: not for --help or a flag mistake
    from bertjax import pretrained

  files.check_directory(_OUTPUT.value, "--output")
  if files.exists(_OUTPUT.value) and not _OVERWRITE.value:  # before the model is read
    raise errors.OutputExistsError(f"{_OUTPUT.value} already exists; pass --overwrite to "
                                   "replace it, or choose another --output")
  source_is_bertjax = files.isfile(files.join(_INPUT.value, pretrained.BERTJAX_FILE))
  target = _TO.value or ("hf" if source_is_bertjax else "bertjax")
  bundle = pretrained.load_pretrained(_INPUT.value, task=_TASK.value,
                                      do_lower_case=_DO_LOWER_CASE.value)
  if target == "hf":
    pretrained.export_hf(bundle, _OUTPUT.value, overwrite=_OVERWRITE.value)
  else:
    pretrained.save_pretrained(bundle, _OUTPUT.value, overwrite=_OVERWRITE.value)
  c = bundle.config
  print(f"Wrote {_OUTPUT.value} ({target} format): {bundle.task} model, "
        f"L={c.num_layers} H={c.hidden_size} A={c.num_heads}, vocab {c.vocab_size}")


if __name__ == "__main__":
  usage.run_main(main, interrupted="nothing was written")
