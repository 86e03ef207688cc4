"""What `python -m bertjax.main` runs, by `config.task`."""
