r"""configs/demo.py with the fields of how a run reads gs:// data, for
benchmarks/restart_data.py:

  python -m bertjax.main --config=benchmarks/restart_config.py --workdir=/tmp/run \
      --config.data.dir=gs://BUCKET/data --config.data.read_mode=copy

`data.read_mode` ("auto", "stream" or "copy") and `data.read_ahead` (-1: the
loader's default) are added here when the shipped config does not have them.
"""

from bertjax.configs import demo


def get_config(arg: str | None = None):
  config = demo.get_config(arg)
  if "read_mode" not in config.data:
    config.data.read_mode = "auto"  # gs:// data: "stream", "copy", or "auto"
  if "read_ahead" not in config.data:
    config.data.read_ahead = -1  # documents read ahead (-1: the loader's default)
  return config
