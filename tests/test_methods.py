"""Method switches (SAM, entmax, DrLoc, mimetic/impulse init, CNN baselines) in the step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.config_files import load_config
from vitboot_jax import kernel_sets, optim
from vitboot_jax.data import step_preprocess
from vitboot_jax.method import steps
from vitboot_jax.models import sharing
from vitboot_jax.models.build import build_models
from vitboot_jax.state import create_state


def jitted_gradients(config, models, variables, batch, rng, weight):
  """steps.model_gradients under jit (op-by-op it is many times slower)."""
  fn = jax.jit(lambda v, b, r, w: steps.model_gradients(config, models, v, b, r, w))
  return fn(variables, batch, rng, weight)


def batch_of(n=8, size=32, classes=10, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "image": jnp.asarray(rng.normal(size=(n, size, size, 3)), jnp.float32),
    "label": jnp.asarray(rng.integers(0, classes, size=(n,)), jnp.int32),
  }


def make(config):
  models = build_models(config, kernel_sets.for_config(config))
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=4)
  image_shape = (config.image_size, config.image_size, 3)
  state = create_state(models, tx, jax.random.key(0), image_shape)
  state = state.replace(params=models.init_on_host(state.params, jax.random.key(0)))
  step = steps.make_train_step(
    config, models, tx, schedule, 4, step_preprocess.make_prepare(config)
  )
  return models, tx, state, step


@pytest.mark.parametrize(
  "switch", ["sam=1", "attention=entmax", "drloc=0.1", "init=mimetic", "init=impulse3"]
)
@pytest.mark.slow
def test_switch_trains_in_shared_mode(switch):
  config = load_config("tiny_config", f"mode=shared,{switch}")
  models, _, state, step = make(config)
  jitted = jax.jit(step)
  for _ in range(2):
    state, metrics = jitted(state, batch_of())
  for key in ("train/loss_vit", "train/loss_agent", "train/grad_norm"):
    assert np.isfinite(float(metrics[key])), key
  if switch == "drloc=0.1":
    assert float(metrics["train/drloc_vit"]) > 0
  if switch == "sam=1":
    assert float(metrics["train/sam_grad_norm"]) > 0


@pytest.mark.slow
def test_sam_ascends_rho_and_updates_with_the_perturbed_gradient():
  config = load_config("tiny_config", "mode=vit,sam=0.05")
  config.optim.eps = 1e-3  # Keeps AdamW's first step smooth in g (see test_steps).
  models, tx, state, step = make(config)
  batch = batch_of()
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 0)
  variables = {"params": state.params, "batch_stats": state.batch_stats}

  def gradient(params):
    grads, _, _ = jitted_gradients(
      config, models, {**variables, "params": params}, batch, rng, jnp.float32(1.0)
    )
    return grads["vit"]

  g = gradient(state.params)
  e = jax.tree.map(lambda x: 0.05 * x / optax.global_norm(g), g)
  assert float(optax.global_norm(e)) == pytest.approx(0.05, rel=1e-5)  # Ascent of norm rho.
  g_sam = gradient(jax.tree.map(jnp.add, state.params, e))
  updates, _ = tx.update(g_sam, state.opt_state, state.params)
  want = optax.apply_updates(state.params, updates)
  new_state, metrics = jax.jit(step)(state, batch)
  for got, exp in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-7)
  assert float(metrics["train/sam_grad_norm"]) == pytest.approx(
    float(optax.global_norm(g_sam)), rel=1e-4
  )
  # And it is not the plain step: the gradient at w + e differs from the one at w.
  assert not np.allclose(jax.tree.leaves(g_sam)[0], jax.tree.leaves(g)[0])


@pytest.mark.slow
def test_drloc_head_is_trained_and_private_to_its_model():
  config = load_config("tiny_config", "mode=shared,drloc=0.5")
  config.drloc.models = ("vit", "agent")
  models, _, state, _ = make(config)
  assert {"drloc_vit", "drloc_agent"} <= set(state.params)
  variables = {"params": state.params, "batch_stats": state.batch_stats}
  grads, _, terms = jitted_gradients(
    config, models, variables, batch_of(), jax.random.key(0), jnp.float32(1.0)
  )
  assert float(terms["drloc_vit"]) > 0 and float(terms["drloc_agent"]) > 0
  norm = lambda t: float(optax.global_norm(t))
  assert norm(grads["vit"]["drloc_vit"]) > 0 and norm(grads["agent"]["drloc_vit"]) == 0
  assert norm(grads["agent"]["drloc_agent"]) > 0 and norm(grads["vit"]["drloc_agent"]) == 0
  mask = sharing.shared_mask(state.params)
  assert max(float(m.max()) for m in jax.tree.leaves(mask["drloc_vit"])) == 0.0


@pytest.mark.slow
def test_drloc_in_joint_mode_steps_each_head_with_its_model():
  config = load_config("tiny_config", "mode=joint,drloc=0.5")
  config.drloc.models = ("vit", "agent")
  _, _, state, step = make(config)
  new_state, metrics = jax.jit(step)(state, batch_of())
  assert float(metrics["train/drloc_vit"]) > 0 and float(metrics["train/drloc_agent"]) > 0
  for head in ("drloc_vit", "drloc_agent"):
    moved = jax.tree.map(
      lambda a, b: float(jnp.abs(a - b).max()), state.params[head], new_state.params[head]
    )
    assert max(jax.tree.leaves(moved)) > 0, head


def test_drloc_on_unknown_model_names_the_field():
  config = load_config("tiny_config", "mode=vit,drloc=0.1")
  config.drloc.models = ("agent",)
  with pytest.raises(ValueError, match="config.drloc.models"):
    build_models(config, kernel_sets.for_config(config))


@pytest.mark.parametrize("name", ["resnet50", "efficientnet_b2"])
@pytest.mark.slow
def test_cnn_baseline_configs_build_a_train_step(name):
  config = load_config("cnn_baselines", f"model={name},dataset=cifar10")
  assert config.optim.name == "sgd" and config.optim.momentum == 0.0 and config.optim.lr == 0.05
  models = build_models(config, kernel_sets.for_config(config))
  assert models.names == ("cnn",)
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=10)
  step = steps.make_train_step(
    config, models, tx, schedule, 10, step_preprocess.make_prepare(config)
  )
  image_shape = (config.image_size, config.image_size, 3)
  state = jax.eval_shape(lambda r: create_state(models, tx, r, image_shape), jax.random.key(0))
  batch = {
    "image": jax.ShapeDtypeStruct((2, *image_shape), jnp.float32),
    "label": jax.ShapeDtypeStruct((2,), jnp.int32),
  }
  _, metrics = jax.eval_shape(step, state, batch)  # Traces the whole step at 224 px.
  assert "train/ce_cnn" in metrics and "train/kd_cnn" not in metrics


@pytest.mark.parametrize(
  "switch", ["sam=1", "attention=entmax", "drloc=0.01", "init=mimetic", "decay=none,kd=0"]
)
@pytest.mark.slow
def test_paper_configs_build_with_switches(switch):
  config = load_config("vits_cifar100", f"mode=shared,{switch}")
  models = build_models(config, kernel_sets.for_config(config))
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=10)
  step = steps.make_train_step(
    config, models, tx, schedule, 10, step_preprocess.make_prepare(config)
  )
  state = jax.eval_shape(lambda r: create_state(models, tx, r, (224, 224, 3)), jax.random.key(0))
  batch = {
    "image": jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.float32),
    "label": jax.ShapeDtypeStruct((2,), jnp.int32),
  }
  new_state, metrics = jax.eval_shape(step, state, batch)
  assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_sparse_vitb_config_builds_vitb():
  # The official ViT-B-Sparse yaml builds ViT-S by mistake; ours builds what it says.
  config = load_config("vitb_cifar100", "mode=vit,attention=entmax")
  models = build_models(config, kernel_sets.for_config(config))
  assert models.vit.embed_dim == 384 and models.vit.depth == 12 and models.vit.attention == "entmax"


def test_drloc_classification_variant_sizes_its_heads_from_the_grids():
  # "ce"/"reg" heads need the pooled grid size; the shared agent's grid is probed with the ViT.
  config = load_config("tiny_config", "mode=shared,drloc=0.1")
  config.drloc.models = ("vit", "agent")
  config.drloc.variant = "ce"
  models = build_models(config, kernel_sets.for_config(config))
  variables = jax.eval_shape(models.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  # abs offsets: k classes; ViT 4x4 tokens, agent's last map 8x8 (no pooling below 14).
  assert variables["params"]["drloc_vit"]["out_u"]["kernel"].shape == (512, 4)
  assert variables["params"]["drloc_agent"]["out_u"]["kernel"].shape == (512, 8)
