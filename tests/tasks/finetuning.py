"""Configs for the task tests: fine-tuning sized so that tiny models learn the
small synthetic tasks in a few epochs at a high learning rate, and a tiny
in-process pre-training run."""


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


def tiny_pretrain_config(prepared_dir, **changes):
  """The demo config at L2/H32 on `prepared_dir` (the tests' prepared data):
  30 synchronous steps at 32 tokens (64 in a long phase, off unless
  `train.long_from_step` is given), a checkpoint every 10."""
  from bertjax.configs import demo

  settings = {"data.dir": prepared_dir, "data.eval_percent": 10.0, "model.vocab_size": 210,
              "model.hidden_size": 32, "model.num_heads": 2, "model.num_layers": 2,
              "model.intermediate_size": 64, "model.max_position_embeddings": 64,
              "train.batch_size": 8, "eval.batch_size": 8, "train.max_seq_length": 32,
              "train.max_predictions": 5, "train.total_steps": 30,
              "train.long_from_step": -1, "train.long_seq_length": 64,
              "train.long_max_predictions": 10, "optimizer.warmup_steps": 2,
              "checkpoint.every_steps": 10, "checkpoint.async_save": False,
              "eval.every_steps": 0, "log_every_steps": 10, **changes}
  return set_fields(demo.get_config(), settings)
