"""What `python -m bertjax.main` runs, by `config.task`."""


# config.task -> the module of bertjax.tasks whose `run(config, workdir)` does it.
TASKS = {"pretrain": "pretrain", "glue": "glue", "squad": "squad", "swag": "swag",
         "ner": "ner", "ner_features": "features"}


def task_module(name: str):
  """The module that runs `config.task == name`."""
  import importlib

  if name not in TASKS:
    raise ValueError(f"Unknown config.task {name!r}; known: {', '.join(TASKS)}")
  return importlib.import_module(f"bertjax.tasks.{TASKS[name]}")
