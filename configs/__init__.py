"""The shipped configs, installed as `bertjax.configs`.

Each file is a config for `--config=configs/NAME.py[:ARG]` (its docstring is
its command) and a module: `from bertjax.configs import base_pretrain, common`
works from any directory, so a config file of your own can start from one of
these (docs/configs.md).
"""
