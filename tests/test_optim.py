"""Tests for optim.py: schedules, the weight-decay mask, torch-equivalent SGD and clipping."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.config_files import load_config
from vitboot_jax import configlib, optim
from vitboot_jax.base.errors import ConfigError


def optim_cfg(**overrides):
  cfg = configlib.base_config().optim
  cfg.update(overrides)
  return cfg


def test_cosine_epoch_is_constant_inside_an_epoch():
  spe, epochs, lr = 7, 6, 1e-3
  sched = optim.lr_schedule(optim_cfg(lr=lr), spe, epochs)
  jitted = jax.jit(sched)
  for step in range(spe * epochs):
    e = step // spe
    want = lr * (1 + math.cos(math.pi * e / epochs)) / 2
    np.testing.assert_allclose(sched(step), want, rtol=1e-6)
    np.testing.assert_allclose(jitted(jnp.int32(step)), want, rtol=1e-6)
  # First epoch at full lr, no warmup; the last epoch is small but not 0.
  np.testing.assert_allclose(sched(0), lr, rtol=1e-7)
  assert 0 < float(sched(spe * epochs - 1)) < 0.1 * lr
  assert float(sched(spe * epochs)) == pytest.approx(0.0, abs=1e-12)


def test_cosine_step_with_warmup():
  spe, epochs, lr = 10, 5, 0.5
  sched = optim.lr_schedule(
    optim_cfg(lr=lr, schedule="cosine_step", warmup_epochs=1.0), spe, epochs
  )
  warmup, total = spe, spe * epochs
  lrs = np.array([float(sched(s)) for s in range(total + 1)])
  # Linear warmup reaching lr on its last step, never 0.
  np.testing.assert_allclose(lrs[:warmup], lr * np.arange(1, warmup + 1) / warmup, rtol=1e-6)
  # Then per-step cosine from lr to 0 over the remaining steps.
  t = np.arange(total + 1 - warmup)
  want = lr * 0.5 * (1 + np.cos(np.pi * t / (total - warmup)))
  np.testing.assert_allclose(lrs[warmup:], want, rtol=1e-5, atol=1e-7)
  assert np.all(np.diff(lrs[warmup:]) < 0)
  assert lrs[-1] == pytest.approx(0.0, abs=1e-7)


def test_cosine_epoch_with_warmup_and_constant():
  spe, epochs, lr = 4, 6, 1.0
  sched = optim.lr_schedule(optim_cfg(lr=lr, warmup_epochs=2.0), spe, epochs)
  np.testing.assert_allclose([sched(s) for s in range(8)], np.arange(1, 9) / 8, rtol=1e-6)
  # After warmup: per-epoch cosine over the remaining 4 epochs.
  for step in range(8, spe * epochs):
    e = (step - 8) // spe
    np.testing.assert_allclose(sched(step), (1 + math.cos(math.pi * e / 4)) / 2, rtol=1e-6)
  const = optim.lr_schedule(optim_cfg(lr=0.1, schedule="constant"), spe, epochs)
  np.testing.assert_allclose([const(s) for s in (0, 5, 100)], 0.1, rtol=1e-7)
  with pytest.raises(ValueError, match="warmup_epochs"):
    optim.lr_schedule(optim_cfg(warmup_epochs=6.0), spe, epochs)


def test_multistep_divides_the_lr_at_its_milestones():
  spe, epochs, lr = 10, 8, 0.1
  sched = optim.lr_schedule(optim_cfg(lr=lr, schedule="multistep"), spe, epochs)
  lrs = np.array([float(jax.jit(sched)(jnp.int32(s))) for s in range(spe * epochs)])
  # He et al.: lr / 10 at 50% and 75% of the steps (here 40 and 60 of 80).
  np.testing.assert_allclose(lrs[:40], lr, rtol=1e-6)
  np.testing.assert_allclose(lrs[40:60], lr * 0.1, rtol=1e-6)
  np.testing.assert_allclose(lrs[60:], lr * 0.01, rtol=1e-6)
  # After a warmup the milestones are fractions of the remaining steps.
  cfg = optim_cfg(lr=1.0, schedule="multistep", milestones=(0.5,), gamma=0.5, warmup_epochs=2.0)
  warm = optim.lr_schedule(cfg, spe, epochs)
  assert [float(warm(s)) for s in (19, 20, 49, 50)] == pytest.approx([1.0, 1.0, 1.0, 0.5])


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("milestones", (0.75, 0.5), "must be increasing fractions"),
    ("milestones", (0.5, 1.0), "must be increasing fractions"),
    ("milestones", (), "must be increasing fractions"),
    ("gamma", 0.0, "config.optim.gamma=0.0 must be in"),
  ],
)
def test_a_bad_multistep_schedule_is_refused(field, value, message):
  config = load_config("quickstart")
  config.optim.schedule = "multistep"
  config.optim[field] = value
  with pytest.raises(ConfigError, match=message):
    configlib.validate(config)


def vit_like_params():
  rng = np.random.default_rng(0)
  r = lambda *s: jnp.asarray(rng.normal(size=s) + 2.0, jnp.float32)
  return {
    "vit": {
      "patch_embed": {"kernel": r(2, 2, 3, 8), "bias": r(8)},
      "cls": r(1, 1, 8),
      "pos_embed": r(1, 5, 8),
      "block_0": {
        "ln1": {"scale": r(8), "bias": r(8)},
        "attn": {"qkv": {"kernel": r(8, 24), "bias": r(24)}},
      },
    },
    "agent": {"bn": {"scale": r(8), "bias": r(8)}, "head": {"kernel": r(8, 10)}},
  }


DECAYED = {"patch_embed/kernel", "qkv/kernel", "head/kernel"}


def leaf_names(tree):
  paths = jax.tree.leaves_with_path(tree)
  return ["/".join(str(getattr(k, "key", k)) for k in p[-2:]) for p, _ in paths]


def test_weight_decay_mask_excludes_biases_norms_and_embeddings():
  params = vit_like_params()
  mask = optim.weight_decay_mask(params)
  names = leaf_names(params)
  assert len(names) == 11
  for name, decayed in zip(names, jax.tree.leaves(mask)):
    assert decayed == (name in DECAYED), name


@pytest.mark.parametrize("decay_all", [True, False])
def test_adamw_decay_mask_in_effect(decay_all):
  params = vit_like_params()
  lr, wd = 0.1, 0.05
  cfg = optim_cfg(lr=lr, weight_decay=wd, decay_all=decay_all, schedule="constant")
  tx, sched = optim.make_optimizer(cfg, steps_per_epoch=3, num_epochs=2)
  np.testing.assert_allclose(sched(0), lr)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
  # With zero gradients the Adam part is 0, so the update is exactly the decoupled decay.
  for name, u, p in zip(leaf_names(params), jax.tree.leaves(updates), jax.tree.leaves(params)):
    decayed = decay_all or name in DECAYED
    want = -lr * wd * np.asarray(p) if decayed else np.zeros_like(p)
    np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_matches_torch_formula(momentum):
  lr, wd = 0.05, 0.1
  cfg = optim_cfg(name="sgd", lr=lr, weight_decay=wd, momentum=momentum, schedule="constant")
  tx, _ = optim.make_optimizer(cfg, steps_per_epoch=5, num_epochs=2)
  rng = np.random.default_rng(1)
  w0 = rng.normal(size=(3, 2))
  params = {"w": jnp.asarray(w0, jnp.float32)}
  state = tx.init(params)
  # torch.optim.SGD: d = g + wd*p; buf = d (first step) else momentum*buf + d; p -= lr*buf.
  ref_w, buf = w0.copy(), None
  for i in range(4):
    g = rng.normal(size=(3, 2))
    updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
    params = optax.apply_updates(params, updates)
    d = g + wd * ref_w
    buf = d if (buf is None or momentum == 0) else momentum * buf + d
    ref_w = ref_w - lr * buf
    np.testing.assert_allclose(params["w"], ref_w, rtol=1e-5, atol=1e-6, err_msg=f"step {i}")


def test_clipping_bounds_the_update():
  cfg = optim_cfg(name="sgd", lr=1.0, weight_decay=0.0, schedule="constant", clip_norm=0.5)
  tx, _ = optim.make_optimizer(cfg, steps_per_epoch=1, num_epochs=1)
  params = {"a": jnp.zeros((4,)), "b": jnp.zeros((2, 2))}
  big = {"a": jnp.full((4,), 10.0), "b": jnp.full((2, 2), -10.0)}
  updates, _ = tx.update(big, tx.init(params), params)
  norm = float(optax.global_norm(updates))
  np.testing.assert_allclose(norm, 0.5, rtol=1e-5)
  # Direction preserved: the update is -0.5 * g / |g|.
  np.testing.assert_allclose(updates["a"], -0.5 * 10 / math.sqrt(800), rtol=1e-5)
  # Small gradients pass unchanged.
  small = jax.tree.map(lambda x: x * 1e-3, big)
  updates, _ = tx.update(small, tx.init(params), params)
  np.testing.assert_allclose(updates["b"], -np.asarray(small["b"]), rtol=1e-6)
  # Without clip_norm the big gradient goes through as is.
  cfg.clip_norm = 0.0
  tx, _ = optim.make_optimizer(cfg, 1, 1)
  updates, _ = tx.update(big, tx.init(params), params)
  np.testing.assert_allclose(float(optax.global_norm(updates)), math.sqrt(800), rtol=1e-5)


def test_unknown_optimizer_and_schedule_are_refused_by_the_config_check():
  for field, value in (("name", "lamb"), ("schedule", "linear")):
    config = load_config("quickstart")
    config.optim[field] = value
    with pytest.raises(ConfigError, match=f"config.optim.{field}='{value}' is unknown"):
      configlib.validate(config)
