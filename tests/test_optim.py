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
