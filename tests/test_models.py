"""Models: sizes of the paper, CONV semantics, literal weight sharing, official initialisation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from tests import jaxprs
from tests.config_files import load_config
from vitboot_jax import configlib, kernel_sets
from vitboot_jax.cpu import kernels as cpu_kernels
from vitboot_jax.models import agent as agent_lib
from vitboot_jax.models import kernels as kernels_lib
from vitboot_jax.models import sharing
from vitboot_jax.models.build import build_models
from vitboot_jax.models.vit import Attention
from vitboot_jax.tools.summary import summarise


@pytest.mark.parametrize(
  "config_name, vit_params, agent_private, vit_macs, agent_macs",
  [
    # Official counts (docs/reference/official_state_dict_keys.md); paper Table 2 MACs (1.37G,
    # 4.62G); shared res-like Agent-S ~1.22G: its CONV in factored form costs 2 D^2 per pixel
    # (1.9G as a real 3x3 convolution, 9 D^2).
    ("vits_cifar100", 6_302_404, 212_100, 1.37e9, 1.22e9),
    pytest.param("vitb_cifar100", 21_704_164, 288_804, 4.62e9, None, marks=pytest.mark.slow),
  ],
)
def test_paper_model_sizes(config_name, vit_params, agent_private, vit_macs, agent_macs):
  summary = summarise(load_config(config_name))
  assert summary["vit"]["params"] == vit_params
  assert summary["agent"]["params_private"] == agent_private
  assert abs(summary["vit"]["macs_per_image"] / vit_macs - 1) < 0.03
  if agent_macs:
    assert abs(summary["agent"]["macs_per_image"] / agent_macs - 1) < 0.05
  # The shared agent reads the ViT's W_V, W_O, b_O and MLP: params = private + shared entries.
  d, depth, f = (288, 6, 1152) if config_name.startswith("vits") else (384, 12, 1536)
  shared = depth * (d * d + d * d + d + 2 * d * f + f + d)
  assert summary["agent"]["params"] == agent_private + shared
  assert summary["vit"]["params_private"] == vit_params - shared


def test_standalone_agent_sizes():
  # Official standalone agents (C=100): agent-small-res_like 8,682,756, agent-base-res_like
  # 25,089,060 (official_state_dict_keys.md).
  assert summarise(load_config("vits_cifar100", "mode=agent"))["agent"]["params"] == 8_682_756
  assert summarise(load_config("vitb_cifar100", "mode=agent"))["agent"]["params"] == 25_089_060


def _loop_conv(x, taps, bias, positions, k):
  """Independent reference: y[i, j] = sum_h x[i + dr_h, j + dc_h] @ W_h + b, zero padding."""
  b, h, w, _ = x.shape
  c = (k - 1) // 2
  y = np.zeros((b, h, w, taps.shape[-1]))
  for tap, (r, col) in zip(taps, positions):
    dr, dc = r - c, col - c
    shifted = np.zeros_like(x)
    src_r = slice(max(dr, 0), h + min(dr, 0))
    dst_r = slice(max(-dr, 0), h + min(-dr, 0))
    src_c = slice(max(dc, 0), w + min(dc, 0))
    dst_c = slice(max(-dc, 0), w + min(-dc, 0))
    shifted[:, dst_r, dst_c] = x[:, src_r, src_c]
    y += shifted @ tap
  return y + bias


@pytest.mark.parametrize("heads", [6, 9, 12, 3, 4, 16])
@pytest.mark.parametrize("scheme", ["official", "centered"])
@pytest.mark.parametrize("kernels", [kernels_lib.XLA, cpu_kernels.CPU], ids=["xla", "cpu"])
def test_conv_equals_shifted_sum(heads, scheme, kernels):
  rng = np.random.default_rng(heads)
  x = rng.normal(size=(2, 7, 6, 5)).astype(np.float32)
  taps = rng.normal(size=(heads, 5, 4)).astype(np.float32)
  bias = rng.normal(size=(4,)).astype(np.float32)
  if scheme == "official" and heads in (3, 4, 12, 16):
    with pytest.raises(ValueError, match="taps=centered"):
      agent_lib.tap_positions(heads, scheme)
    return
  k, positions = agent_lib.tap_positions(heads, scheme)
  got = agent_lib.generalised_conv(
    jnp.asarray(x), jnp.asarray(taps), jnp.asarray(bias), scheme=scheme, kernels=kernels
  )
  np.testing.assert_allclose(got, _loop_conv(x, taps, bias, positions, k), rtol=1e-4, atol=1e-4)
  # Same as a standard lax convolution whose kernel holds W_h at tap h and zeros elsewhere.
  kernel = np.zeros((k, k, 5, 4), np.float32)
  for tap, (r, c) in zip(taps, positions):
    kernel[r, c] = tap
  ref = jax.lax.conv_general_dilated(
    x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  np.testing.assert_allclose(got, ref + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "heads, scheme",
  [
    (9, "official"),
    (6, "official"),
    pytest.param(4, "centered", marks=pytest.mark.slow),
    pytest.param(12, "centered", marks=pytest.mark.slow),
  ],
)
@pytest.mark.parametrize("kernels", [kernels_lib.XLA, cpu_kernels.CPU], ids=["xla", "cpu"])
def test_shared_conv_equals_conv_over_product_taps(heads, scheme, kernels):
  rng = np.random.default_rng(heads)
  d = 4 * heads
  x = jnp.asarray(rng.normal(size=(2, 7, 6, d)), jnp.float32)
  qkv = jnp.asarray(rng.normal(size=(d, 3 * d)), jnp.float32)
  w_o = jnp.asarray(rng.normal(size=(d, d)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(d,)), jnp.float32)
  taps = sharing.shared_taps(qkv, w_o, heads)
  want = agent_lib.generalised_conv(x, taps, bias, scheme=scheme, kernels=kernels)
  shared = lambda x, w_v, w_o: agent_lib.shared_conv(
    x, w_v, w_o, bias, num_heads=heads, scheme=scheme, kernels=kernels
  )
  w_v = sharing.value_kernel(qkv)
  np.testing.assert_allclose(shared(x, w_v, w_o), want, rtol=1e-5, atol=1e-4)
  # Gradients reach W_V and W_O as through the product taps.
  conv = lambda x, w_v, w_o: agent_lib.generalised_conv(
    x,
    sharing.shared_taps(jnp.concatenate([qkv[:, : 2 * d], w_v], 1), w_o, heads),
    bias,
    scheme=scheme,
    kernels=kernels,
  )
  loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
  got = jax.grad(loss(shared), argnums=(0, 1, 2))(x, w_v, w_o)
  ref = jax.grad(loss(conv), argnums=(0, 1, 2))(x, w_v, w_o)
  for g, r in zip(got, ref):
    # sin of outputs up to ~170 amplifies float32 rounding: tolerance scaled to the gradient.
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
  # Two matmuls, no convolution.
  jaxpr = str(jax.make_jaxpr(shared)(x, w_v, w_o))
  assert "conv_general_dilated" not in jaxpr and jaxpr.count("dot_general") == 2


@pytest.mark.parametrize("heads, scheme", [(9, "official"), (6, "official"), (12, "centered")])
def test_shift_heads_backward_is_autodiffs_transpose_exactly(heads, scheme):
  k, positions = agent_lib.tap_positions(heads, scheme)
  rng = np.random.default_rng(heads)
  values, cotangent = (
    jnp.asarray(rng.normal(size=(2, 7, 6, 3 * heads)), jnp.float32) for _ in "ab"
  )
  custom = jax.jit(lambda v: agent_lib.shift_heads(v, positions, (k - 1) // 2))
  plain = jax.jit(lambda v: agent_lib.shift_heads.fun(v, positions, (k - 1) // 2))
  np.testing.assert_array_equal(custom(values), plain(values))
  got = jax.vjp(custom, values)[1](cotangent)[0]
  np.testing.assert_array_equal(got, jax.vjp(plain, values)[1](cotangent)[0])
  assert np.count_nonzero(got) < got.size  # Border entries that no tap reads get zero.


def test_tap_positions():
  # Official H=6: the first six raster positions, so the bottom row is missing.
  assert agent_lib.tap_positions(6, "official") == (
    3,
    ((0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)),
  )
  assert agent_lib.tap_positions(9, "centered") == agent_lib.tap_positions(9, "official")
  k, pos = agent_lib.tap_positions(4, "centered")
  assert k == 3 and (1, 1) in pos and len(set(pos)) == 4
  assert all(abs(r - 1) + abs(c - 1) <= 1 for r, c in pos)  # Centre + 3 of its 4 neighbours.
  k, pos = agent_lib.tap_positions(12, "centered")
  assert k == 5 and len(set(pos)) == 12
  assert all((r - 2) ** 2 + (c - 2) ** 2 <= 4 for r, c in pos)


def _tiny(mode="shared", **overrides):
  config = load_config("tiny_config", f"mode={mode}")
  for key, value in overrides.items():
    group, field = key.split(".") if "." in key else (None, key)
    (config[group] if group else config)[field] = value
  models = build_models(config, kernel_sets.for_config(config))
  images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  variables = models.init(jax.random.key(0), images)
  return models, variables, images


def _agent_logits(models, variables, images):
  return models.apply(variables, images, train=False, names=("agent",))[0]["agent"][0]


@pytest.mark.slow
def test_sharing_is_literal():
  models, variables, images = _tiny()
  agent_leaves = jax.tree_util.tree_leaves_with_path(variables["params"]["agent"])
  agent_keys = {jax.tree_util.keystr(p) for p, _ in agent_leaves}
  # The shared agent owns no CONV or MLP weights ...
  assert not any("conv_taps" in k or "fc1" in k or "fc2" in k for k in agent_keys), agent_keys
  # ... and none of its leaves duplicates a ViT leaf (constant-initialised norms aside: all
  # BatchNorm and LayerNorm scales start at 1).
  vit_leaves = [v for v in jax.tree.leaves(variables["params"]["vit"]) if np.ptp(v) > 0]
  for _, leaf in agent_leaves:
    assert not any(v.shape == leaf.shape and np.array_equal(v, leaf) for v in vit_leaves)
  base = _agent_logits(models, variables, images)

  def perturbed(path, fn):
    params = jax.tree.map(lambda x: x, variables["params"])
    node = params["vit"]["block_0"]
    for key in path[:-1]:
      node = node[key]
    node[path[-1]] = fn(node[path[-1]])
    return _agent_logits(models, {**variables, "params": params}, images)

  d = 36
  bump_v = lambda k: k.at[:, 2 * d :].add(0.1)
  bump_qk = lambda k: k.at[:, : 2 * d].add(0.1)
  for path, fn in [
    (("attn", "qkv", "kernel"), bump_v),
    (("attn", "out", "kernel"), lambda k: k + 0.1),
    (("attn", "out", "bias"), lambda k: k + 0.1),
    (("mlp", "fc1", "kernel"), lambda k: k + 0.1),
    (("mlp", "fc2", "bias"), lambda k: k + 0.1),
  ]:
    assert not np.allclose(perturbed(path, fn), base), path
  # Q/K and b_V are the ViT's alone.
  np.testing.assert_allclose(perturbed(("attn", "qkv", "kernel"), bump_qk), base, rtol=1e-6)
  np.testing.assert_allclose(perturbed(("attn", "qkv", "bias"), lambda b: b + 0.1), base, rtol=1e-6)


@pytest.mark.slow
def test_shared_mask_marks_exactly_the_tied_entries():
  models, variables, _ = _tiny()
  mask = sharing.shared_mask(variables["params"])
  qkv = mask["vit"]["block_0"]["attn"]["qkv"]
  np.testing.assert_array_equal(np.asarray(qkv["kernel"])[0], np.repeat([0.0, 0.0, 1.0], 36))
  assert float(qkv["bias"].sum()) == 0.0
  assert float(mask["vit"]["block_1"]["mlp"]["fc2"]["bias"].min()) == 1.0
  assert float(mask["vit"]["cls"].max()) == 0.0
  assert all(float(m.max()) == 0.0 for m in jax.tree.leaves(mask["agent"]))


@pytest.mark.slow
def test_shared_mask_is_what_the_agent_reads():
  # The mask (models/sharing.py) and the agent's reads of the ViT's tree must name the same
  # entries: a rename in vit.py that only one of them follows fails here.
  models, variables, images = _tiny()

  def agent_output(vit_params):
    params = {**variables["params"], "vit": vit_params}
    return jnp.sum(_agent_logits(models, {**variables, "params": params}, images) ** 2)

  grad = jax.grad(agent_output)(variables["params"]["vit"])
  mask = sharing.shared_mask(variables["params"])["vit"]
  paths = jax.tree_util.tree_leaves_with_path(grad)
  for (path, g), m in zip(paths, jax.tree.leaves(mask)):
    read = np.abs(np.asarray(g)) > 0
    marked = np.broadcast_to(np.asarray(m), g.shape) > 0
    name = jax.tree_util.keystr(path)
    assert not (read & ~marked).any(), f"the agent reads {name} outside the mask"
    assert read[marked].any() if marked.any() else True, f"the mask marks {name}, never read"
  assert any(float(np.max(m)) > 0 for m in jax.tree.leaves(mask))


def test_joint_agent_is_independent():
  models, variables, images = _tiny("joint")
  assert "conv_taps" in variables["params"]["agent"]["block_0"]
  base = _agent_logits(models, variables, images)
  params = jax.tree.map(lambda x: x + 1.0, variables["params"]["vit"])
  other = _agent_logits(
    models, {**variables, "params": {**variables["params"], "vit": params}}, images
  )
  np.testing.assert_array_equal(base, other)


def test_features_and_shapes():
  models, variables, images = _tiny()
  outputs, _ = models.apply(variables, images, train=False)
  vit_logits, vit_out = outputs["vit"]
  agent_logits, agent_out = outputs["agent"]
  assert vit_logits.shape == agent_logits.shape == (2, 10)
  assert [f.shape for f in vit_out["features"]] == [(2, 17, 36)] * 2
  # Small stem: 32 -> 16; down-sampled after block 0 (features are taken before the pool).
  assert [f.shape for f in agent_out["features"]] == [(2, 16, 16, 36), (2, 8, 8, 36)]


@pytest.mark.slow
def test_official_init_quirks():
  config = load_config("vits_cifar100")
  models = build_models(config, kernel_sets.for_config(config))
  params = models.init(jax.random.key(0), jnp.zeros((1, 224, 224, 3)))["params"]
  # N(0, 1) patch embedding, N(1e-6, 1) MLP biases (the official bug), xavier qkv.
  assert abs(float(params["vit"]["patch_embed"]["kernel"].std()) - 1.0) < 0.02
  assert abs(float(params["vit"]["block_0"]["mlp"]["fc1"]["bias"].std()) - 1.0) < 0.1
  qkv = params["vit"]["block_0"]["attn"]["qkv"]["kernel"]
  bound = np.sqrt(6 / (288 + 864))
  assert float(jnp.abs(qkv).max()) <= bound and float(jnp.abs(qkv).max()) > 0.95 * bound
  config.model.init = "standard"
  params = build_models(config, kernel_sets.for_config(config)).init(
    jax.random.key(0), jnp.zeros((1, 224, 224, 3))
  )["params"]
  assert float(params["vit"]["patch_embed"]["kernel"].std()) < 0.1
  assert float(jnp.abs(params["vit"]["block_0"]["mlp"]["fc1"]["bias"]).max()) < 1e-4


@pytest.mark.slow
def test_dropout_only_in_train_mode():
  models, variables, images = _tiny("shared", **{"model.dropout": 0.5, "agent.mlp_dropout": 0.5})
  eval1 = models.apply(variables, images, train=False)[0]["vit"][0]
  eval2 = models.apply(variables, images, train=False)[0]["vit"][0]
  np.testing.assert_array_equal(eval1, eval2)
  train1 = models.apply(variables, images, train=True, rng=jax.random.key(1))[0]["vit"][0]
  train2 = models.apply(variables, images, train=True, rng=jax.random.key(2))[0]["vit"][0]
  assert not np.allclose(train1, train2)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("image_size", 30, "not divisible by config.model.patch_size"),
    ("mode", "bootstrap", "config.mode"),
    ("agent.stem", "resnet", "config.agent.stem"),
    ("agent.taps", "spiral", "config.agent.taps"),
    ("model.init", "xavier", "config.model.init"),
  ],
)
def test_bad_config_names_the_field(field, value, message):
  config = load_config("tiny_config")
  group, key = field.split(".") if "." in field else (None, field)
  (config[group] if group else config)[key] = value
  with pytest.raises(ValueError, match=message):
    configlib.validate(config)  # Once, at the entry point (train.py, the tools).


@pytest.mark.slow
def test_even_window_heads_need_centered_taps():
  config = load_config("tiny_config")
  config.model.num_heads = 4
  config.model.embed_dim = 32
  with pytest.raises(ValueError, match="taps=centered"):
    models = build_models(config, kernel_sets.for_config(config))
    models.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  config.agent.taps = "centered"
  models = build_models(config, kernel_sets.for_config(config))
  variables = models.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert np.isfinite(_agent_logits(models, variables, jnp.ones((1, 32, 32, 3)))).all()


@pytest.mark.parametrize("name", ["vits_cifar100", "vitb_cifar100", "quickstart"])
@pytest.mark.parametrize("arg", ["", "mode=joint", "mode=vit", "mode=agent", "agent=base"])
def test_configs_build(name, arg):
  if name == "quickstart" and arg == "agent=base":
    pytest.skip("quickstart has a single agent stem")
  config = load_config(name, arg)
  configlib.validate(config)
  models = build_models(config, kernel_sets.for_config(config))
  size = config.image_size
  variables = jax.eval_shape(models.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  assert set(variables["params"]) == set(models.names)


def test_hashed_dropout_statistics():
  from vitboot_jax.models.common import Dropout

  x = jnp.ones((4, 101, 37))
  drop = Dropout(0.1)
  y = drop.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  kept = np.asarray(y) != 0
  assert abs(kept.mean() - 0.9) < 0.012  # 14,948 draws: 5 sigma ~ 0.012.
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / 0.9, rtol=1e-6)
  assert abs(float(y.mean()) - 1.0) < 0.02  # Inverted dropout keeps the expectation.
  y2 = drop.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert not np.array_equal(np.asarray(y2) != 0, kept)  # Fresh masks per key.
  assert drop.apply({}, x, deterministic=True) is x
  assert float(Dropout(1.0).apply({}, x, deterministic=False).max()) == 0.0
  np.testing.assert_array_equal(Dropout(0.0).apply({}, x, deterministic=False), x)


@pytest.mark.slow
def test_hashed_bits_look_independent():
  """Every bit is fair, and neighbours, rows and masks of other keys are uncorrelated."""
  from vitboot_jax.models.common import hashed_bits

  n = 1 << 20
  five_sigma = 5 * 0.5 / np.sqrt(n)
  bits = np.asarray(hashed_bits(jax.random.key(3), (n,)))
  per_bit = (bits[:, None] >> np.arange(32, dtype=np.uint32)) & 1
  assert np.abs(per_bit.mean(0) - 0.5).max() < five_sigma
  # A 10% mask, the dropout use: its neighbours (index +1, +stride of a 197-wide row) and the
  # mask of a key that differs by one fold_in are independent of it.
  drop = bits < np.uint32(0.1 * 2**32)
  other = np.asarray(hashed_bits(jax.random.fold_in(jax.random.key(3), 1), (n,))) < np.uint32(
    0.1 * 2**32
  )
  corr = lambda a, b: np.corrcoef(a.astype(np.float64), b.astype(np.float64))[0, 1]
  for a, b in [(drop[1:], drop[:-1]), (drop[197:], drop[:-197]), (drop, other)]:
    assert abs(corr(a, b)) < 5 / np.sqrt(n), corr(a, b)
  # Keys that differ only in their seed words must not give shifted copies of one mask.
  shifted = max(abs(corr(other[s:], drop[:-s])) for s in range(1, 64))
  assert shifted < 5 / np.sqrt(n)
  # The hash is a pure function of (key, index): the same key gives the same bits.
  np.testing.assert_array_equal(np.asarray(hashed_bits(jax.random.key(3), (n,))), bits)


def test_gelu_is_exact_in_value_and_derivative():
  """The erf form (torch's) against the exact x Phi(x) and Phi(x) + x phi(x) in float64."""
  import math

  from vitboot_jax.cpu.kernels import gelu

  xs = np.linspace(-12, 12, 4001).astype(np.float32)
  x64 = xs.astype(np.float64)
  phi_cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x64])
  exact = x64 * phi_cdf
  exact_grad = phi_cdf + x64 * np.exp(-0.5 * x64**2) / math.sqrt(2 * math.pi)
  np.testing.assert_allclose(np.asarray(gelu(xs)), exact, atol=2e-6, rtol=1e-6)
  grads = np.asarray(jax.jit(jax.vmap(jax.grad(gelu)))(xs))
  np.testing.assert_allclose(grads, exact_grad, atol=2e-6, rtol=1e-6)
  assert gelu(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16  # No promotion to float32.


@pytest.mark.parametrize("kernels", [kernels_lib.XLA, cpu_kernels.CPU])
def test_attention_gradient_concatenates_query_key_value(kernels):
  """dQKV is one concatenation of dQ, dK and dV, not a sum of three zero-padded stacks."""
  dense = functools.partial(nn.Dense, dot_general=kernels.dot_general)
  module = Attention(num_heads=3, dense=dense, kernels=kernels)
  x = jnp.ones((2, 5, 12))
  params = module.init(jax.random.key(0), x, train=False)
  grad = jax.grad(lambda x: module.apply(params, x, train=True).sum())
  names = [eqn.primitive.name for eqn in jaxprs.equations(jax.make_jaxpr(grad)(x))]
  assert "concatenate" in names
  assert "pad" not in names
