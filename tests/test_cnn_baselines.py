"""The paper's CNN baselines: ResNet-50 (cvlib/torchvision) and EfficientNet-B2 (timm).

Sizes are checked against the exact PyTorch counts, so an architectural slip (a missing bias, a
wrong rounding, one block too many) fails loudly. Full-resolution checks use `jax.eval_shape`
only; real forwards run at 64 px to stay fast.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import tolerances
from vitboot_jax.models import build, choices, efficientnet, resnet

count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
dtypes = lambda tree: {x.dtype for x in jax.tree.leaves(tree)}

SMALL = 64


def abstract_variables(model, size=SMALL):
  return jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3))))


def images(n=2, size=SMALL, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(n, size, size, 3)), jnp.float32)


# Real forwards use scaled-down models built from the same modules (every block kind, shortcut
# kind and stride appears): compiling full ResNet-50 / B2 on CPU would dominate the suite.
def tiny_resnet(**kwargs):
  return resnet.ResNet(10, stage_sizes=(2, 1, 1, 1), stem_width=8, **kwargs)


def tiny_effnet(**kwargs):
  stages = (
    efficientnet.StageDef("ds", 2, 3, 1, 1, 16),
    efficientnet.StageDef("ir", 2, 5, 2, 6, 24),
  )
  return efficientnet.EfficientNet(10, 0.5, 1.0, stages, num_features=64, **kwargs)


def filled_variables(model, seed=0):
  """Variables with the model's structure, filled by numpy: compiling `init` costs ~10 s on CPU."""
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = path[-1].key
    if name == "kernel":
      fan_in = math.prod(leaf.shape[:-1])
      return jnp.asarray(rng.normal(size=leaf.shape) / math.sqrt(fan_in), leaf.dtype)
    if name in ("scale", "var"):
      return jnp.ones(leaf.shape, leaf.dtype)
    if name == "mean":
      return jnp.zeros(leaf.shape, leaf.dtype)
    return jnp.asarray(0.1 * rng.normal(size=leaf.shape), leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, abstract_variables(model))


def compiled_step(model):
  """One program for a train-mode and an eval-mode forward: compiles dominate this file's time."""

  def step(variables, x_train, x_eval, rng):
    train = model.apply(
      variables, x_train, train=True, mutable=["batch_stats"], rngs={"dropout": rng}
    )
    return train, model.apply(variables, x_eval, train=False)[0]  # Eval takes no rngs.

  return jax.jit(step)


@pytest.fixture(scope="module")
def resnet_setup():
  model = tiny_resnet()
  return model, filled_variables(model), compiled_step(model)


@pytest.fixture(scope="module")
def effnet_setup():
  model = tiny_effnet(drop_rate=0.3, drop_path_rate=0.2)
  return model, filled_variables(model), compiled_step(model)


def test_the_config_check_allows_exactly_the_baselines_built():
  assert tuple(build.CNN_BASELINES) == choices.CNNS


# -- sizes -----------------------------------------------------------------------------------------


def test_resnet50_parameter_count():
  # torchvision resnet50: 25,557,032 with 1000 classes; the head is 2048 * C + C.
  expected = 25_557_032 - (2048 * 1000 + 1000) + (2048 * 10 + 10)
  assert expected == 23_528_522  # Paper Table 1: 23.53M.
  assert count(abstract_variables(resnet.resnet50(10))["params"]) == expected
  assert count(abstract_variables(resnet.resnet50(1000))["params"]) == 25_557_032


@pytest.mark.slow
def test_efficientnet_b2_parameter_count():
  # timm efficientnet_b2: 9,109,994 with 1000 classes (9.11M); the head is 1408 * C + C.
  expected = 9_109_994 - (1408 * 1000 + 1000) + (1408 * 10 + 10)
  assert expected == 7_715_084
  n = count(abstract_variables(efficientnet.efficientnet_b2(10))["params"])
  assert n == expected
  assert abs(n / 7.71e6 - 1) < 0.01  # Paper Table 1: 7.71M.
  assert count(abstract_variables(efficientnet.efficientnet_b2(1000))["params"]) == 9_109_994


def test_timm_channel_and_depth_rounding():
  chs = lambda c: efficientnet.round_channels(c, 1.1)
  assert [chs(c) for c in (32, 16, 24, 40, 80, 112, 192, 320, 1280)] == [
    32,
    16,
    24,
    48,
    88,
    120,
    208,
    352,
    1408,
  ]
  repeats = [efficientnet.round_repeats(s.repeats, 1.2) for s in efficientnet.B0_STAGES]
  assert repeats == [2, 3, 3, 4, 4, 5, 2]  # 23 blocks.
  params = abstract_variables(efficientnet.efficientnet_b2(10))["params"]
  assert sum(k.startswith("blocks_") for k in params) == 23
  # SE width comes from the block input: 16 -> 4 in the first inverted residual (not 96 / 4).
  assert params["blocks_1_0"]["se"]["conv_reduce"]["kernel"].shape == (1, 1, 96, 4)


# -- shapes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "build, feature_shapes, pooled",
  [
    (
      resnet.resnet50,
      [(2, 56, 56, 256), (2, 28, 28, 512), (2, 14, 14, 1024), (2, 7, 7, 2048)],
      2048,
    ),
    (
      efficientnet.efficientnet_b2,
      [
        (2, 112, 112, 16),
        (2, 56, 56, 24),
        (2, 28, 28, 48),
        (2, 14, 14, 88),
        (2, 14, 14, 120),
        (2, 7, 7, 208),
        (2, 7, 7, 352),
      ],
      1408,
    ),
  ],
)
def test_shapes_at_224(build, feature_shapes, pooled):
  model = build(10)
  variables = abstract_variables(model)
  logits, out = jax.eval_shape(
    lambda v: model.apply(v, jnp.zeros((2, 224, 224, 3)), train=False), variables
  )
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  assert [f.shape for f in out["features"]] == feature_shapes
  assert out["pre_logits"].shape == (2, pooled)


@pytest.mark.parametrize(
  "build", [resnet.resnet50, pytest.param(efficientnet.efficientnet_b2, marks=pytest.mark.slow)]
)
def test_bf16_compute_keeps_float32_params_and_logits(build):
  model = build(10, jnp.bfloat16)
  variables = abstract_variables(model)
  assert dtypes(variables) == {jnp.dtype(jnp.float32)}
  (logits, out), updates = jax.eval_shape(
    lambda v: model.apply(v, jnp.zeros((2, SMALL, SMALL, 3)), train=True, mutable=["batch_stats"]),
    variables,
  )
  assert logits.dtype == jnp.float32
  assert dtypes(out["features"]) == {jnp.dtype(jnp.bfloat16)}
  assert out["pre_logits"].dtype == jnp.bfloat16
  assert dtypes(updates["batch_stats"]) == {jnp.dtype(jnp.float32)}


# -- initialisation --------------------------------------------------------------------------------


def init_params(block, block_input, model):
  """Initial params of a full-width block and of a small model, compiled once.

  The key is "rbg": threefry kernels compile several times slower on CPU.
  """
  init = lambda key: (
    block.init(key, block_input, train=False)["params"],
    model.init(key, jnp.zeros((1, 16, 16, 3)))["params"],
  )
  return jax.jit(init)(jax.random.key(0, impl="rbg"))


@pytest.mark.slow
def test_resnet_torchvision_init():
  # One full-width stage-3 block: Kaiming normal with fan_out = k * k * out.
  block = resnet.Bottleneck(256, stride=2)
  model = resnet.ResNet(10, stage_sizes=(1,), stem_width=8, zero_init_residual=True)
  p, params = init_params(block, jnp.zeros((1, 4, 4, 512)), model)
  assert abs(np.asarray(p["conv2"]["kernel"]).std() / math.sqrt(2 / (9 * 256)) - 1) < 0.02
  assert abs(np.asarray(p["conv3"]["kernel"]).std() / math.sqrt(2 / 1024) - 1) < 0.02
  assert np.all(np.asarray(p["bn3"]["scale"]) == 1)  # Zero-init residual is off by default.
  assert np.all(np.asarray(p["bn3"]["bias"]) == 0)
  # The optional zero-init of each block's last BN, and PyTorch's Linear default for the head.
  assert np.all(np.asarray(params["layer1_0"]["bn3"]["scale"]) == 0)
  fc = params["fc"]
  bound = 1 / math.sqrt(fc["kernel"].shape[0])
  assert np.abs(fc["kernel"]).max() <= bound and np.abs(fc["bias"]).max() <= bound
  assert np.abs(fc["bias"]).max() > 0


@pytest.mark.slow
def test_efficientnet_goog_init():
  # One full-width B2 stage-5 block: depthwise fan_out = k * k (timm fix_group_fanout), not k*k*C.
  block = efficientnet.MBConv(208, kernel=5, stride=2, expand_ratio=6)
  stages = (efficientnet.StageDef("ds", 1, 3, 1, 1, 16),)
  model = efficientnet.EfficientNet(10, 0.5, 1.0, stages, num_features=32)
  p, params = init_params(block, jnp.zeros((1, 4, 4, 120)), model)
  assert p["conv_dw"]["kernel"].shape == (5, 5, 1, 720)
  assert abs(np.asarray(p["conv_dw"]["kernel"]).std() / math.sqrt(2 / 25) - 1) < 0.03
  assert abs(np.asarray(p["conv_pw"]["kernel"]).std() / math.sqrt(2 / 720) - 1) < 0.03
  assert p["se"]["conv_reduce"]["kernel"].shape == (1, 1, 720, 30)  # round(120 * 0.25).
  assert np.all(np.asarray(p["se"]["conv_reduce"]["bias"]) == 0)
  # timm Linear: U(+-1/sqrt(num_classes)) weight, zero bias.
  classifier = params["classifier"]
  assert np.abs(classifier["kernel"]).max() <= 1 / math.sqrt(10)
  assert np.abs(classifier["kernel"]).max() > 1 / math.sqrt(32)  # Not fan_in-scaled.
  assert np.all(np.asarray(classifier["bias"]) == 0)


# -- train / eval behaviour ------------------------------------------------------------------------


@pytest.mark.parametrize("setup", ["resnet_setup", "effnet_setup"])
@pytest.mark.slow
def test_train_updates_batch_stats_and_eval_is_deterministic(setup, request):
  model, variables, step = request.getfixturevalue(setup)
  x = images()
  x_other = x.at[1].set(images(1, seed=5)[0])
  ((logits, out), updates), eval_a = step(variables, x, x, jax.random.key(1))
  assert logits.shape == (2, 10) and np.all(np.isfinite(logits))
  num_stages = len(model.stage_sizes if isinstance(model, resnet.ResNet) else model.stages)
  assert len(out["features"]) == num_stages
  old, new = variables["batch_stats"], updates["batch_stats"]
  assert jax.tree.structure(old) == jax.tree.structure(new)
  changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), old, new)
  assert all(jax.tree.leaves(changed))
  # Momentum 0.9 (PyTorch 0.1): running mean = 0.9 * 0 + 0.1 * batch mean of the stem conv.
  stem = "conv1" if "conv1" in variables["params"] else "conv_stem"
  conv_out = jax.lax.conv_general_dilated(
    x,
    variables["params"][stem]["kernel"],
    (2, 2),
    ((1, 1), (1, 1)) if stem == "conv_stem" else ((3, 3), (3, 3)),
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
  )
  expected_mean = 0.1 * conv_out.mean(axis=(0, 1, 2))
  tolerances.assert_close_to_scale(new["bn1"]["mean"], expected_mean, 1e-4, floor=1e-6)

  # Eval is deterministic (even across dropout keys) and uses running statistics: a sample's
  # output does not depend on the rest of the batch.
  _, eval_b = step(variables, x, x, jax.random.key(2))
  np.testing.assert_array_equal(eval_a, eval_b)
  _, eval_c = step(variables, x, x_other, jax.random.key(1))
  tolerances.assert_close_to_scale(eval_c[0], eval_a[0], 1e-5, floor=1e-6)
  assert not np.allclose(eval_c[1], eval_a[1])


@pytest.mark.slow
def test_efficientnet_dropout_only_in_train(effnet_setup):
  model, variables, step = effnet_setup
  x = images()
  train = lambda seed: step(variables, x, x, jax.random.key(seed))[0][0][0]
  a, a_again, b = train(1), train(1), train(2)
  np.testing.assert_array_equal(a, a_again)
  assert not np.allclose(a, b)

  # The official baseline (timm defaults) has no dropout and no drop-path: its train step draws
  # no random numbers at all (checked on the traced program, no compile).
  key = jax.random.key(0)

  def draws_random(m):
    jaxpr = jax.make_jaxpr(
      lambda: m.apply(variables, x, train=True, mutable=["batch_stats"], rngs={"dropout": key})
    )()
    return "random_bits" in str(jaxpr)

  assert draws_random(model)
  b2 = efficientnet.efficientnet_b2(10)
  assert b2.drop_rate == 0.0 and b2.drop_path_rate == 0.0
  assert not draws_random(tiny_effnet())
