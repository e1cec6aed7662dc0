"""Fidelity to the official PyTorch code: imported weights reproduce its eval-mode outputs."""

import numpy as np
import pytest

from tests import golden
from vitboot_jax import kernel_sets
from vitboot_jax.models import convert

TOL = 1e-4  # Relative, float32 on CPU (golden/README.md).


@pytest.fixture(params=["xla", "cpu"])
def kernels(request):
  """Both kernel sets: what accelerators run (xla) and what CPUs run (cpu)."""
  return kernel_sets.for_platform(request.param, "cpu")


def test_vit_logits(golden_dir, kernels):
  data, sd, images, index = golden.load(golden_dir, "vit")
  cfg = index["config"]
  vit = golden.vit_module(cfg["transformer"], cfg["patch_embed"], index["num_classes"])
  vit = vit.clone(kernels=kernels)
  variables = convert.import_vit(sd, depth=cfg["transformer"]["num_encoder_layers"])
  logits, _ = vit.apply({"params": variables["params"]["vit"]}, images)
  assert golden.rel_err(logits, data["logits"]) < TOL


@pytest.mark.parametrize("name", ["shared_res_h9", "shared_vitstem_h9", "shared_res_h6"])
@pytest.mark.slow
def test_shared_logits_and_features(golden_dir, name, kernels):
  data, sd, images, index = golden.load(golden_dir, name)
  vit, agent = (m.clone(kernels=kernels) for m in golden.shared_modules(index))
  variables = convert.import_shared(sd, depth=vit.depth, num_heads=vit.num_heads)
  params = variables["params"]
  vit_logits, vit_out = vit.apply({"params": params["vit"]}, images)
  agent_logits, agent_out = agent.apply(
    {"params": params["agent"], "batch_stats": variables["batch_stats"]["agent"]},
    images,
    vit_params=params["vit"],
  )
  assert golden.rel_err(vit_logits, data["eval/logits_vit"]) < TOL
  assert golden.rel_err(agent_logits, data["eval/logits_cnn"]) < TOL
  for layer in range(vit.depth):
    vit_feature = data[f"eval/feature_vit_{layer}"].transpose(1, 0, 2)  # [N, B, D] -> [B, N, D]
    agent_feature = data[f"eval/feature_cnn_{layer}"].transpose(0, 2, 3, 1)  # NCHW -> NHWC
    assert golden.rel_err(vit_out["features"][layer], vit_feature) < TOL, layer
    assert golden.rel_err(agent_out["features"][layer], agent_feature) < TOL, layer


@pytest.mark.parametrize("name", ["agent_small_res_like", "agent_base_res_like"])
@pytest.mark.slow
def test_standalone_agent_logits(golden_dir, name, kernels):
  data, sd, images, index = golden.load(golden_dir, name)
  agent = golden.standalone_agent(index).clone(kernels=kernels)
  variables = convert.import_agent(sd, depth=agent.depth, num_taps=agent.num_heads)
  logits, _ = agent.apply(
    {"params": variables["params"]["agent"], "batch_stats": variables["batch_stats"]["agent"]},
    images,
  )
  assert golden.rel_err(logits, data["logits"]) < TOL
  assert not np.allclose(logits, 0)


def test_importer_rejects_wrong_depth(golden_dir):
  _, sd, _, _ = golden.load(golden_dir, "vit")
  with pytest.raises(ValueError, match="not imported"):
    convert.import_vit(sd, depth=2)
  with pytest.raises(KeyError, match="transformer.layers.3"):
    convert.import_vit(sd, depth=4)
