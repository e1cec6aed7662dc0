"""In-process train steps of the tiny test config (tests/tiny_config.py), for the tests of the
step, the hint's variants and what reads a trained state: its config, a random batch, the built
models with their step, the models' gradients, and a few cached steps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tests.config_files import load_config
from vitboot_jax import configlib, kernel_sets, optim
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.data import step_preprocess
from vitboot_jax.method import steps
from vitboot_jax.models.build import build_models


def jitted_gradients(config, models, variables, batch, rng, weight):
  """steps.model_gradients under jit (op-by-op it is many times slower)."""
  fn = jax.jit(lambda v, b, r, w: steps.model_gradients(config, models, v, b, r, w))
  return fn(variables, batch, rng, weight)


def tiny_config(mode="shared", **updates):
  """tests/tiny_config.py's config of `mode` for two epochs, with `updates` ("group.field")."""
  config = load_config("tiny_config", f"mode={mode}")
  config.num_epochs = 2
  for key, value in updates.items():
    group, field = key.split(".") if "." in key else (None, key)
    (config[group] if group else config)[field] = value
  return config


def batch_of(n=8, seed=0, size=32, classes=10):
  rng = np.random.default_rng(seed)
  return {
    "image": jnp.asarray(rng.normal(size=(n, size, size, 3)), jnp.float32),
    "label": jnp.asarray(rng.integers(0, classes, size=(n,)), jnp.int32),
  }


def setup(mode="shared", **updates):
  config = tiny_config(mode, **updates)
  models = build_models(config, kernel_sets.for_config(config))
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=4)
  init, step = trainer_lib.make_steps(
    config,
    models,
    tx,
    schedule,
    steps_per_epoch=4,
    total_steps=configlib.total_steps(config, 4),
    prepare=step_preprocess.make_prepare(config),
  )
  return config, models, tx, init(jax.random.key(0)), step


def gradients(config, models, state, batch, weight=1.0):
  variables = {"params": state.params, "batch_stats": state.batch_stats}
  return jitted_gradients(config, models, variables, batch, jax.random.key(3), jnp.float32(weight))


def run(mode, n=4, **updates):
  """n train steps of the tiny config; the state and every step's metrics (cached: compiling
  the steps is what these tests cost)."""
  return _run(mode, n, tuple(sorted(updates.items())))


@functools.cache
def _run(mode, n, updates):
  _, _, _, state, step = setup(mode, **dict(updates))
  step = jax.jit(step)
  history = []
  for i in range(n):
    state, metrics = step(state, batch_of(seed=i))
    history.append({k: float(v) for k, v in metrics.items()})
  return state, history
