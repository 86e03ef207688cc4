"""Configs for the task tests: fine-tuning sized so that tiny models learn the
small synthetic tasks in a few epochs at a high learning rate."""


def tiny_config(config, init_checkpoint: str, max_seq_length: int, **changes):
  """`config` set up for a test; `changes` are dotted names ("train.epochs")."""
  config.init_checkpoint = init_checkpoint
  config.model.dtype = "float32"
  config.max_seq_length = max_seq_length
  config.train.learning_rate = 2e-3
  config.train.epochs = 6.0
  config.train.batch_size = config.train.eval_batch_size = 32
  config.log_every_steps = 20
  return set_fields(config, changes)


def set_fields(config, changes):
  """Sets dotted config fields ("train.epochs") to values; returns the config."""
  for name, value in changes.items():
    *parents, leaf = name.split(".")
    target = config
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config
