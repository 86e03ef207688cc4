"""The schedule and optimizers of the paper."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import errors, optim
from bertjax.models import EncoderConfig, BertForPreTraining, init_params


def test_schedule_is_the_original():
  schedule = optim.learning_rate_schedule(1e-4, 10_000, 1_000_000)
  for step in (0, 1, 5_000, 9_999, 10_000, 500_000, 999_999, 1_000_000, 1_200_000):
    # optimization.py: polynomial (power 1) decay from step 0, linear warmup on top.
    expected = 1e-4 * step / 10_000 if step < 10_000 else 1e-4 * max(0.0, 1 - step / 1_000_000)
    # float32: 1 - step / total loses digits near the end (1e-12 absolute).
    np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6, atol=1e-11)
  with pytest.raises(ValueError, match="warmup_steps"):
    optim.learning_rate_schedule(1e-4, 20, 10)


def test_weight_decay_skips_layer_norm_and_biases():
  config = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                      intermediate_size=32)
  boxed = init_params(BertForPreTraining(config), jax.random.key(0))
  for params in (boxed, nn.meta.unbox(boxed)):
    mask = optim.decay_mask(params)
    leaves = [([p.key for p in path if isinstance(p, jax.tree_util.DictKey)], decays)
              for path, decays in jax.tree_util.tree_leaves_with_path(mask)]
    assert all(decays == (keys[-1] in ("kernel", "embedding")) for keys, decays in leaves)
    assert any("layer_norm" in keys[-2] and not decays for keys, decays in leaves)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_decay_applies_only_where_masked(name):
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
            "norm": {"scale": jnp.ones(2)}}
  optimizer = optim.create_optimizer(name, 0.1, weight_decay=0.5, max_grad_norm=None)
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = optimizer.update(zero, optimizer.init(params), params)
  assert float(jnp.abs(updates["dense"]["kernel"]).sum()) > 0  # decay alone moves it
  assert float(jnp.abs(updates["dense"]["bias"]).sum()) == 0
  assert float(jnp.abs(updates["norm"]["scale"]).sum()) == 0
  with pytest.raises(ValueError, match="optimizer must be one of"):
    optim.create_optimizer("sgd", 0.1)


def test_clipping_by_global_norm():
  # With a huge epsilon Adam's update is proportional to the gradient, so the
  # clipping shows in the update.
  params = {"w": jnp.zeros(4)}
  grads = {"w": jnp.full(4, 100.0)}  # global norm 200
  sizes = {}
  for clip in (None, 1.0):
    optimizer = optim.create_optimizer("adamw", 1.0, weight_decay=0.0, eps=1e6,
                                       max_grad_norm=clip)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    sizes[clip] = float(optax.global_norm(updates))
  np.testing.assert_allclose(sizes[None] / sizes[1.0], 200.0, rtol=1e-3)


def test_lamb_trust_ratio_leaves_biases_and_layer_norm_out():
  params = {"dense": {"kernel": jnp.full((2, 2), 3.0), "bias": jnp.full(2, 3.0)},
            "norm": {"scale": jnp.full(2, 3.0)}}
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  optimizer = optim.create_optimizer("lamb", 1.0, weight_decay=0.0, max_grad_norm=None)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  adam_step = float(jnp.abs(updates["dense"]["bias"][0]))
  np.testing.assert_allclose(adam_step, 1.0, rtol=1e-4)  # plain Adam's first step
  np.testing.assert_allclose(float(jnp.abs(updates["norm"]["scale"][0])), 1.0, rtol=1e-4)
  # The kernel's step is scaled by ||w|| / ||update|| = 6 / 2.
  np.testing.assert_allclose(float(jnp.abs(updates["dense"]["kernel"][0, 0])), 3.0, rtol=1e-4)


def _original_adam_weight_decay(params, grads_per_step, learning_rates, weight_decay=0.01,
                                b1=0.9, b2=0.999, eps=1e-6, clip=1.0):
  """google-research/bert optimization.py, in numpy: clip_by_global_norm, then
  AdamWeightDecayOptimizer (no bias correction, decay off `bias`/LayerNorm)."""
  params = {k: np.array(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  for grads, lr in zip(grads_per_step, learning_rates):
    norm = np.sqrt(sum(np.sum(np.square(g)) for g in grads.values()))
    scale = clip / max(norm, clip)  # tf.clip_by_global_norm
    for name, grad in grads.items():
      grad = np.asarray(grad, np.float64) * scale
      m[name] = b1 * m[name] + (1 - b1) * grad
      v[name] = b2 * v[name] + (1 - b2) * np.square(grad)
      update = m[name] / (np.sqrt(v[name]) + eps)
      if not name.endswith("bias"):
        update += weight_decay * params[name]
      params[name] = params[name] - lr * update
  return params


def test_adam_without_bias_correction_is_the_original_optimizer():
  rng = np.random.default_rng(0)
  params = {"kernel": rng.normal(size=(3, 4)).astype(np.float32),
            "bias": rng.normal(size=4).astype(np.float32)}
  grads = [{k: (rng.normal(size=p.shape) * 0.7).astype(np.float32) for k, p in params.items()}
           for _ in range(6)]
  schedule = optim.learning_rate_schedule(1e-2, 2, 6)
  lrs = [float(schedule(step)) for step in range(6)]
  expected = _original_adam_weight_decay(params, grads, lrs)
  optimizer = optim.create_optimizer("adamw", schedule, bias_correction=False)
  state = {k: jnp.asarray(p) for k, p in params.items()}
  opt_state = optimizer.init(state)
  for step_grads in grads:
    updates, opt_state = optimizer.update(
        {k: jnp.asarray(g) for k, g in step_grads.items()}, opt_state, state)
    state = optax.apply_updates(state, updates)
  for name in params:
    np.testing.assert_allclose(np.asarray(state[name]), expected[name], rtol=1e-5, atol=1e-6)


def test_bias_correction_sizes_the_first_steps():
  """Against textbook Adam, the original's step 1 is (1-b1)/sqrt(1-b2) = 3.16x
  larger, step 1,000 (1-0.9^1000)/sqrt(1-0.999^1000) = 1.26x, with the same
  (constant) gradient."""
  params = {"w": jnp.zeros(2)}
  ratios = {}
  for correction in (True, False):
    optimizer = optim.create_optimizer("adamw", 1.0, weight_decay=0.0, max_grad_norm=None,
                                       bias_correction=correction)
    state, sizes = optimizer.init(params), []
    for _ in range(1000):
      updates, state = optimizer.update({"w": jnp.full(2, 0.5)}, state, params)
      sizes.append(float(jnp.abs(updates["w"][0])))
    ratios[correction] = np.array(sizes)
  ratio = ratios[False] / ratios[True]
  np.testing.assert_allclose(ratio[0], 0.1 / np.sqrt(0.001), rtol=1e-3)
  np.testing.assert_allclose(ratio[999], (1 - 0.9**1000) / np.sqrt(1 - 0.999**1000), rtol=1e-3)
  # Both keep optax's Adam state, so a checkpoint restores under either.
  with_, without = (jax.tree.structure(optim.create_optimizer(
      "adamw", 1.0, bias_correction=c).init(params)) for c in (True, False))
  assert with_ == without


def test_the_papers_configs_use_the_original_optimizer():
  from bertjax.configs import base_pretrain, glue, large_pretrain, squad

  assert not base_pretrain.get_config().optimizer.bias_correction
  assert not large_pretrain.get_config().optimizer.bias_correction
  assert base_pretrain.get_config("lamb").optimizer.bias_correction  # LAMB's own
  assert not glue.get_config("mrpc").train.bias_correction
  assert not squad.get_config("v1.1").train.bias_correction


def _updates(optimizer, steps=3):
  params = {"kernel": jnp.ones((3, 4)), "bias": jnp.zeros(4)}
  state, sizes = optimizer.init(params), []
  for step in range(steps):
    grads = {"kernel": jnp.full((3, 4), 0.3 + 0.1 * step), "bias": jnp.full(4, -0.2)}
    updates, state = optimizer.update(grads, state, params)
    sizes.append(np.asarray(updates["kernel"]))
  return np.stack(sizes)


def test_a_pretraining_run_builds_the_optimizer_its_config_names():
  """`make_optimizer` follows config.optimizer.bias_correction (the paper's
  configs: the original's Adam, no correction), and a config without the key
  is an error, not optax's corrected Adam."""
  from bertjax import errors
  from bertjax.configs import base_pretrain

  config = base_pretrain.get_config()
  config.train.total_steps, config.optimizer.warmup_steps = 100, 2
  opt = config.optimizer
  optimizer, _ = optim.make_optimizer(config)
  schedule = optim.learning_rate_schedule(opt.learning_rate, 2, 100)
  same = dict(weight_decay=opt.weight_decay, b1=opt.b1, b2=opt.b2, eps=opt.eps,
              max_grad_norm=opt.max_grad_norm)
  original = optim.create_optimizer(opt.name, schedule, bias_correction=False, **same)
  corrected = optim.create_optimizer(opt.name, schedule, bias_correction=True, **same)
  np.testing.assert_array_equal(_updates(optimizer), _updates(original))
  assert not np.allclose(_updates(optimizer), _updates(corrected))
  with config.unlocked():  # a config of its own, built without the key
    del config.optimizer.bias_correction
  with pytest.raises(errors.UsageError, match="config.optimizer.bias_correction is missing"):
    optim.make_optimizer(config)


def test_a_fine_tuning_recipe_takes_every_setting_from_its_config():
  from bertjax import errors
  from bertjax.configs import glue
  from bertjax.tasks import finetune

  config = glue.get_config("mrpc")
  assert finetune.Recipe.from_config(config).bias_correction is False
  config.train.bias_correction = True
  assert finetune.Recipe.from_config(config).bias_correction is True
  with config.unlocked():
    del config.train.bias_correction
  with pytest.raises(errors.UsageError, match="config.train is missing bias_correction"):
    finetune.Recipe.from_config(config)


def _stable_adamw_reference(params, grads_per_step, lrs, peak, wd, decays, b1=0.9, b2=0.98,
                            eps=1e-6):
  """ModernBERT's StableAdamW (optimi's algorithm, `decouple_lr=True`), one
  tensor at a time, in float64 numpy."""
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(v) for k, v in params.items()}
  for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), 1):
    b1_t, b2_t = (b1 ** t - b1) / (b1 ** t - 1), (b2 ** t - b2) / (b2 ** t - 1)
    for k in params:
      g = np.asarray(grads[k], np.float64)
      m[k] = m[k] + (1 - b1_t) * (g - m[k])  # torch.lerp
      v[k] = b2_t * v[k] + (1 - b2_t) * g * g
      rms = np.sqrt(np.mean(g * g / np.maximum(v[k], eps * eps)))
      lr_t = lr / max(1.0, rms)
      if decays[k]:
        params[k] = params[k] * (1 - lr_t / peak * wd)
      params[k] = params[k] - lr_t * m[k] / (np.sqrt(v[k]) + eps)
  return params


def test_stable_adamw_is_modernberts():
  """Several steps, some of which clip (a gradient far larger than the moments
  have seen), with the schedule's learning rate and fully decoupled decay."""
  rng = np.random.default_rng(0)
  params = {"kernel": rng.normal(size=(6, 5)), "bias": rng.normal(size=5),
            "embedding": rng.normal(size=(7, 5))}
  grads = [{k: rng.normal(size=x.shape) * (30.0 if t == 3 else 1.0) for k, x in params.items()}
           for t in range(6)]
  schedule = optim.warmup_stable_decay(8e-2, 2, 6, 2, final_fraction=0.1)
  lrs = [float(schedule(t)) for t in range(6)]
  wd = 0.2
  optimizer = optim.create_optimizer("stableadamw", schedule, weight_decay=wd, b2=0.98,
                                     max_grad_norm=None, peak_learning_rate=8e-2)
  ours = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  state = optimizer.init(ours)
  for g in grads:
    updates, state = optimizer.update(jax.tree.map(jnp.float32, g), state, ours)
    ours = optax.apply_updates(ours, updates)
  expected = _stable_adamw_reference(params, grads, lrs, 8e-2, wd,
                                     {"kernel": True, "bias": False, "embedding": True})
  for k in params:
    np.testing.assert_allclose(ours[k], expected[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_stable_adamw_clips_a_scanned_stack_layer_by_layer():
  """Stacked layers (nn.scan's leading axis) update as the separate tensors."""
  rng = np.random.default_rng(1)
  layers = [rng.normal(size=(4, 3)) for _ in range(3)]
  grads = [[rng.normal(size=(4, 3)) * scale for scale in (1.0, 50.0, 0.01)] for _ in range(3)]
  optimizer = optim.create_optimizer("stableadamw", 1e-2, weight_decay=0.0, max_grad_norm=None,
                                     peak_learning_rate=1e-2)

  def run(params, grads_of_step):
    state = optimizer.init(params)
    for g in grads_of_step:
      updates, state = optimizer.update(g, state, params)
      params = optax.apply_updates(params, updates)
    return params

  stacked = run({"layers": {"kernel": jnp.asarray(np.stack(layers), jnp.float32)}},
                [{"layers": {"kernel": jnp.asarray(np.stack(g), jnp.float32)}} for g in grads])
  separate = run({f"layers_{i}": {"kernel": jnp.asarray(x, jnp.float32)}
                  for i, x in enumerate(layers)},
                 [{f"layers_{i}": {"kernel": jnp.asarray(x, jnp.float32)} for i, x in enumerate(g)}
                  for g in grads])
  for i in range(3):
    np.testing.assert_allclose(stacked["layers"]["kernel"][i], separate[f"layers_{i}"]["kernel"],
                               rtol=1e-6)


def test_warmup_stable_decay():
  schedule = optim.warmup_stable_decay(1e-3, 10, 100, 40, shape="1-sqrt", final_fraction=0.001,
                                       long_from_step=50, long_peak=4e-4)
  for step, expected in [(0, 0.0), (5, 5e-4), (10, 1e-3), (49, 1e-3), (50, 4e-4), (60, 4e-4),
                         (70, 4e-4 * (0.001 + 0.999 * (1 - np.sqrt(10 / 40)))),
                         (100, 4e-7), (130, 4e-7)]:
    np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-5, atol=1e-12,
                               err_msg=str(step))
  linear = optim.warmup_stable_decay(1.0, 0, 10, 10, shape="linear")
  np.testing.assert_allclose([float(linear(s)) for s in (0, 5, 10)], [1.0, 0.5, 0.0], atol=1e-7)
  with pytest.raises(ValueError, match="decay_steps=95 must be in"):
    optim.warmup_stable_decay(1e-3, 10, 100, 95)
  with pytest.raises(ValueError, match="decay_shape='cosine'"):
    optim.warmup_stable_decay(1e-3, 10, 100, 10, shape="cosine")


def test_a_long_phase_rate_the_schedule_would_not_read_is_refused():
  """`optimizer.long_learning_rate` is the warmup-stable-decay schedule's; with
  the paper's linear one it would be ignored without a word."""
  from bertjax.configs import base_pretrain

  config = base_pretrain.get_config()
  config.optimizer.long_learning_rate = 5e-5
  with pytest.raises(errors.UsageError, match=r"optimizer\.long_learning_rate=5e-05 is read by "
                     r"the wsd schedule only; with optimizer\.schedule='linear'"):
    optim.make_optimizer(config)
  config.optimizer.schedule = "wsd"
  optim.make_optimizer(config)


def _restart_config(**optimizer):
  """A scaled-down ModernBERT schedule: warmup 2, plateau 8e-2, a restart at
  step 4, then 1-sqrt to 10% over the last 2 of 8 steps."""
  from bertjax.configs import modernbert_pretrain

  config = modernbert_pretrain.get_config()
  config.train.total_steps = 8
  config.train.long_from_step = -1
  config.optimizer.update({**dict(learning_rate=8e-2, long_learning_rate=-1.0, warmup_steps=2,
                                 decay_steps=2, final_fraction=0.1, weight_decay=0.2,
                                 restarts=((4, 3e-2, 0.05),)), **optimizer})
  return config


@pytest.mark.filterwarnings("ignore:You are using weight_decay")  # large, to be seen
def test_a_restart_is_modernberts_restart_override():
  """bertjax's StableAdamW through a restart against the optimizer
  ModernBERT's training code runs (`optimi.StableAdamW`, decoupled decay),
  restarted as that code restarts: its state saved and loaded into one built
  with the new learning rate (torch's `set_optimizer_state_dict`, as Composer
  loads it), then `restart_override`'s new learning rate and weight decay on
  the groups that decay. The moments go on, and the decay stays measured
  against the first peak (`max_lr` comes back with the checkpoint)."""
  torch = pytest.importorskip("torch")
  optimi = pytest.importorskip("optimi")
  from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                       set_optimizer_state_dict)

  rng = np.random.default_rng(2)
  params = {"kernel": rng.normal(size=(6, 5)), "bias": rng.normal(size=5),
            "embedding": rng.normal(size=(7, 5))}
  grads = [{k: rng.normal(size=x.shape) * (30.0 if t == 5 else 1.0) for k, x in params.items()}
           for t in range(8)]

  # Composer's warmup-stable-decay, written out: the restart's rate from step 4.
  def rate(t):
    if t < 2:
      return 8e-2 * t / 2
    return 8e-2 if t < 4 else 3e-2 if t < 6 else 3e-2 * (0.1 + 0.9 * (1 - np.sqrt((t - 6) / 2)))

  model = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32))
                                  for k, v in params.items()})

  def build(lr, weight_decay):
    groups = [{"params": [model["kernel"], model["embedding"]]},
              {"params": [model["bias"]], "weight_decay": 0.0}]
    return optimi.StableAdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-6,
                              weight_decay=weight_decay, decouple_lr=True)

  reference = build(8e-2, 0.2)
  for t, g in enumerate(grads):
    if t == 4:  # the restart: resume a checkpoint with the next stage's settings
      saved = get_optimizer_state_dict(model, reference)
      reference = build(3e-2, 0.05)
      set_optimizer_state_dict(model, reference, optim_state_dict=saved)
      for group in reference.param_groups:
        group["lr"] = 3e-2
        group["weight_decay"] = 0.05 if group["weight_decay"] > 0 else 0.0
    for group in reference.param_groups:
      group["lr"] = rate(t)
    for k, p in model.items():
      p.grad = torch.tensor(g[k], dtype=torch.float32)
    reference.step()
  assert reference.param_groups[0]["max_lr"] == 8e-2  # the first peak, restored

  optimizer, schedule = optim.make_optimizer(_restart_config())
  np.testing.assert_allclose([float(schedule(t)) for t in range(8)],
                             [rate(t) for t in range(8)], rtol=1e-6)
  ours = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  state = optimizer.init(ours)
  for g in grads:
    updates, state = optimizer.update(jax.tree.map(jnp.float32, g), state, ours)
    ours = optax.apply_updates(ours, updates)
  for k, p in model.items():
    np.testing.assert_allclose(ours[k], p.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=k)


def test_restarts_change_the_plateau_from_their_step():
  schedule = optim.warmup_stable_decay(
      1e-3, 10, 100, 20, long_from_step=50, long_peak=4e-4,
      restarts=[optim.Restart(30, 6e-4, 0.0), optim.Restart(50, 2e-4, 0.0),
                optim.Restart(90, 1e-4, 0.0)])
  for step, expected in [(29, 1e-3), (30, 6e-4), (49, 6e-4), (50, 2e-4),  # a tie: the restart's
                         (80, 2e-4), (85, 2e-4 * (1 - np.sqrt(5 / 20))),
                         (90, 1e-4 * (1 - np.sqrt(10 / 20)))]:
    np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-5, err_msg=str(step))


def test_the_setting_that_gives_a_step_its_rate():
  """What a diverged run's advice tells the user to lower."""
  from bertjax.configs import modernbert_pretrain

  config = modernbert_pretrain.get_config("large")
  restart = config.optimizer.restarts[0][0]
  assert optim.learning_rate_setting(config, restart - 1) == ("optimizer.learning_rate", 5e-4)
  assert optim.learning_rate_setting(config, restart) == (
      "optimizer.restarts[0]'s learning rate", 5e-5)
  assert optim.learning_rate_setting(config, config.train.long_from_step) == (
      "optimizer.long_learning_rate", 5e-5)


@pytest.mark.parametrize("changes, says", [
    ({"restarts": (4, 3e-2, 0.05)}, r"write each restart as \(step, learning_rate, weight_decay"),
    ({"restarts": ((4, 3e-2),)}, r"restarts\[0\]=\(4, 0.03\) is not \(step, learning_rate"),
    ({"restarts": ((4.5, 3e-2, 0.1),)}, "the step 4.5 is not a whole number"),
    ({"restarts": ((1, 3e-2, 0.1),)}, r"step 1 must be in \[warmup_steps, total_steps\) = \[2, 8\)"),
    ({"restarts": ((8, 3e-2, 0.1),)}, r"step 8 must be in \[warmup_steps"),
    ({"restarts": ((5, 3e-2, 0.1), (5, 1e-2, 0.1))}, r"restarts\[1\]: step 5 does not come after"),
    ({"restarts": ((5, 0.0, 0.1),)}, "need learning_rate > 0"),
    ({"schedule": "linear"}, "optimizer.restarts is read by the wsd schedule only"),
    ({"name": "adamw"}, r"restarts\[0\] changes the weight decay \(0.2 to 0.05\), which "
                        "stableadamw alone takes part-way"),
])
def test_restarts_that_cannot_run_are_refused(changes, says):
  with pytest.raises(errors.UsageError, match=says):
    optim.make_optimizer(_restart_config(**changes))


def test_the_large_recipe_restarts_at_900b_tokens():
  """ModernBERT-large: 5e-4 for 900B tokens (its batch-size warmup's fewer
  tokens counted), then 5e-5 with weight decay 1e-6 to the end."""
  from bertjax.configs import modernbert_pretrain
  from bertjax.phases import phases

  config = modernbert_pretrain.get_config("large")
  ((restart, rate, weight_decay),) = config.optimizer.restarts
  assert (rate, weight_decay) == (5e-5, 1e-6)
  phase = phases(config)[0]
  tokens = sum(phase.parts(step) * phase.loader_batch for step in range(restart)) * 1024
  assert tokens == pytest.approx(900e9, abs=4928 * 1024)
  assert modernbert_pretrain.get_config().optimizer.restarts == ()  # base: none
