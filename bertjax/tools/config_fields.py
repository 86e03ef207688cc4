r"""Every field of a config: its value and what it does.

  python -m bertjax.tools.config_fields --config=configs/demo.py
  python -m bertjax.tools.config_fields --config=configs/glue.py:mrpc

The meanings come from the configs themselves: the comment on a field's line
or the comment block above it in the config files (`configs/`), the model's
fields from `EncoderConfig`'s docstring, the divergence guard's from
`configs/common.py`'s `divergence_config`; each number's range from
`bertjax.config_ranges`, which refuses a value outside it. docs/configs.md's
field tables are this command's `--docs` output for the shipped configs.
"""

from __future__ import annotations

from absl import flags

from bertjax import config_ranges, errors, usage
from bertjax.config_meanings import docs_tables, leaves, load, meaning, meanings

_CONFIG = flags.DEFINE_string("config", None, "configs/NAME.py[:ARG] (a shipped config), "
                              "or a config file of your own: its fields, values and meanings.")
flags.DEFINE_alias("config_path", "config")  # its earlier name
_DOCS = flags.DEFINE_bool("docs", False, "Print docs/configs.md's tables of every field instead.")


def main(argv):
  del argv
  if _DOCS.value:
    print(docs_tables(), end="")
    return
  if not _CONFIG.value:
    raise errors.UsageError("--config is required: the config whose fields to list, "
                            "configs/NAME.py[:ARG] or a file of your own (or --docs: "
                            "docs/configs.md's tables)")
  known = meanings(_CONFIG.value)
  config = load(_CONFIG.value)
  for field, value in leaves(config):
    what = meaning(field, known)
    allowed = config_ranges.range_of(field, config.get("task"))
    if allowed is not None:
      what = f"{what.rstrip('.')}; must be {allowed}" if what else f"must be {allowed}"
    print(f"{field} = {value!r}" + (f"  # {what}" if what else ""))


if __name__ == "__main__":
  usage.run_main(main)
