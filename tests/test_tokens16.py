"""configs/cifar10_tokens16.py: 16x16 ViT tokens, the agent at 32x32 in block 0 then 16x16."""

import jax
import jax.numpy as jnp
import pytest

from tests.config_files import load_config
from vitboot_jax import configlib, kernel_sets
from vitboot_jax.models.build import build_models


def _config(arg=None):
  return load_config("cifar10_tokens16", arg)


@pytest.mark.parametrize("mode", ["shared", "joint"])
def test_token_grid_and_agent_geometry(mode):
  config = _config(f"mode={mode}")
  configlib.validate(config)
  assert (config.image_size, config.model.patch_size, config.num_epochs) == (32, 2, 10)
  models = build_models(config, kernel_sets.for_config(config))
  images = jnp.zeros((2, 32, 32, 3), jnp.float32)
  variables = jax.eval_shape(models.init, jax.random.key(0), images)
  outputs = jax.eval_shape(lambda v, x: models.apply(v, x, train=False)[0], variables, images)
  vit_features = outputs["vit"][1]["features"]
  agent_features = outputs["agent"][1]["features"]
  assert vit_features[0].shape == (2, 16 * 16 + 1, 144)  # 16x16 tokens and the cls token.
  assert [f.shape[1:3] for f in agent_features] == [(32, 32)] + [(16, 16)] * 5


def test_the_ablation_switches_resolve():
  assert _config("mode=joint,feature=0").loss.feature_vit == 0.0
  assert _config("mode=joint,kd=0").loss.kd_vit == 0.0
  assert _config("mode=joint,decay=none").loss.feature_decay == "none"
