"""alpha-entmax: numpy references, limits and finite-difference gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.config_files import load_config
from vitboot_jax import configlib, kernel_sets
from vitboot_jax.base.errors import ConfigError
from vitboot_jax.models.build import build_models
from vitboot_jax.models.entmax import entmax_bisect
from vitboot_jax.models.vit import ViT


def _np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_sparsemax(x: np.ndarray) -> np.ndarray:
  """Sort-based sparsemax (Martins & Astudillo 2016), row by row."""
  out = np.zeros_like(x, dtype=np.float64)
  for idx in np.ndindex(x.shape[:-1]):
    z = np.sort(x[idx].astype(np.float64))[::-1]
    cumsum = np.cumsum(z)
    k = np.arange(1, z.size + 1)
    support = k[1 + k * z > cumsum].max()
    tau = (cumsum[support - 1] - 1) / support
    out[idx] = np.maximum(x[idx] - tau, 0)
  return out


def _np_entmax(x: np.ndarray, alpha: float) -> np.ndarray:
  """float64 bisection on the original threshold tau of p = [(a-1) x - tau]_+^(1/(a-1))."""
  s = alpha - 1
  out = np.zeros_like(x, dtype=np.float64)
  for idx in np.ndindex(x.shape[:-1]):
    z = s * x[idx].astype(np.float64)
    d = z.size
    zmax = z[np.argmax(x[idx])]
    prob = lambda tau, z=z: np.maximum(z - tau, 0) ** (1 / s)
    # Thresholds where the top entry is 1 / d and 1; the mass increases from one to the other.
    lo, hi = zmax - d ** (-s), zmax - 1.0
    f_lo = prob(lo).sum() - 1
    for _ in range(200):
      mid = 0.5 * (lo + hi)
      if (prob(mid).sum() - 1) * f_lo > 0:
        lo = mid
      else:
        hi = mid
    p = prob(0.5 * (lo + hi))
    out[idx] = p / p.sum()
  return out


def _scores(shape=(4, 3, 9), scale=2.0, seed=0) -> np.ndarray:
  return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


@pytest.mark.parametrize("alpha", [0.75, 1.0, 1.001, 1.25, 1.5, 2.0, 3.0])
def test_simplex(alpha):
  p = np.asarray(entmax_bisect(_scores(), alpha))
  assert p.dtype == np.float32
  assert (p >= 0).all()
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)


def test_sparsemax_at_two():
  x = _scores((6, 17), scale=1.5)
  np.testing.assert_allclose(entmax_bisect(x, 2.0), _np_sparsemax(x), atol=2e-6)


@pytest.mark.parametrize("alpha", [1.0, 1.001])
def test_softmax_limit(alpha):
  x = _scores()
  p = entmax_bisect(x, alpha)
  if alpha == 1.0:
    np.testing.assert_allclose(p, jax.nn.softmax(x), rtol=1e-6, atol=1e-7)
  else:  # O(alpha - 1) away from softmax, and on the numpy reference.
    np.testing.assert_allclose(p, _np_softmax(x), atol=5e-3)
    np.testing.assert_allclose(p, _np_entmax(x, alpha), atol=1e-5)


@pytest.mark.parametrize("alpha", [0.75, 1.25, 1.5, 3.0])
def test_matches_float64_reference(alpha):
  x = _scores()
  np.testing.assert_allclose(entmax_bisect(x, alpha), _np_entmax(x, alpha), atol=2e-6)


def test_axis_and_per_row_alpha():
  x = _scores((3, 5, 7))
  np.testing.assert_allclose(
    entmax_bisect(x, 1.5, axis=1),
    np.moveaxis(_np_entmax(np.moveaxis(x, 1, -1), 1.5), -1, 1),
    atol=2e-6,
  )
  alphas = np.array([1.0, 1.5, 2.0], np.float32).reshape(3, 1, 1)
  p = entmax_bisect(x, alphas)
  for i, a in enumerate([1.0, 1.5, 2.0]):
    np.testing.assert_allclose(p[i], entmax_bisect(x[i], a), atol=1e-7)
  with pytest.raises(ValueError, match="size 1 along axis"):
    entmax_bisect(x, np.full((3, 5, 7), 1.5))


def test_sparsity():
  x = np.array([[4.0, 3.0, 0.0, -1.0, -2.0, 0.5]], np.float32)
  assert (np.asarray(entmax_bisect(x, 1.0)) > 0).all()
  zeros = [int((np.asarray(entmax_bisect(x, a)) == 0).sum()) for a in (1.25, 1.5, 2.0)]
  assert zeros[0] > 0 and zeros == sorted(zeros), zeros  # Sparser as alpha grows.


def test_jit_bf16_and_masked_scores():
  x = jnp.asarray(_scores()).at[..., 0].set(-jnp.inf)
  p = jax.jit(entmax_bisect)(x.astype(jnp.bfloat16), jnp.float32(1.5))
  assert p.dtype == jnp.float32 and (p[..., 0] == 0).all()
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("alpha", [1.0, 1.25, 1.5, 2.0])
def test_gradients_match_finite_differences(alpha):
  rng = np.random.default_rng(1)
  with jax.enable_x64(True):
    # Generic scores: no entry within eps of the support boundary, where entmax has a kink.
    x = jnp.asarray(rng.normal(size=(3, 6)) * 2)
    w = jnp.asarray(rng.normal(size=(3, 6)))
    f = lambda x, a: jnp.sum(w.astype(x.dtype) * entmax_bisect(x, a, n_iter=100))
    gx, ga = jax.grad(f, (0, 1))(x, jnp.float64(alpha))
    eps = 1e-6
    basis = np.eye(x.size).reshape(x.size, *x.shape) * eps
    fd_x = np.array([(f(x + e, alpha) - f(x - e, alpha)) / (2 * eps) for e in basis])
    fd_a = (f(x, alpha + eps) - f(x, alpha - eps)) / (2 * eps)
    np.testing.assert_allclose(gx, fd_x.reshape(x.shape), atol=1e-8)
    np.testing.assert_allclose(ga, fd_a, rtol=1e-7, atol=1e-9)
    assert abs(float(ga)) > 1e-3
    # float32, the training dtype: the same gradients within float32 accuracy.
    gx32, ga32 = jax.grad(f, (0, 1))(x.astype(jnp.float32), jnp.float32(alpha))
    assert gx32.dtype == jnp.float32
    np.testing.assert_allclose(gx32, gx, atol=1e-5)
    np.testing.assert_allclose(ga32, ga, rtol=1e-4, atol=1e-5)


def test_gradient_is_smooth_through_alpha_one():
  x = jnp.asarray(_scores((2, 8)))
  w = jnp.asarray(_scores((2, 8), seed=1))
  grad_a = jax.grad(lambda a: jnp.sum(w * entmax_bisect(x, a)))
  g = [float(grad_a(jnp.float32(a))) for a in (1.0 - 1e-4, 1.0, 1.0 + 1e-4)]
  np.testing.assert_allclose(g, g[1], rtol=1e-3)


@pytest.mark.slow
def test_sparse_vit_alpha_per_layer_and_gradients():
  vit = ViT(num_classes=5, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_dim=48)
  sparse = vit.clone(attention="entmax")
  images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  params = jax.jit(sparse.init)(jax.random.key(0), images)["params"]
  for layer in range(2):
    alpha = params[f"block_{layer}"]["attn"]["entmax_alpha"]
    assert alpha.shape == () and alpha.dtype == jnp.float32 and float(alpha) == 1.5
  # The softmax ViT's layout, plus one scalar per layer.
  paths = lambda tree: {
    jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)
  }
  dense = jax.eval_shape(vit.init, jax.random.key(0), images)["params"]
  assert paths(params) - paths(dense) == {
    f"['block_{layer}']['attn']['entmax_alpha']" for layer in range(2)
  }
  assert paths(dense) <= paths(params)

  @jax.jit
  def loss_and_grad(params):
    def loss(params):
      logits, _ = sparse.apply({"params": params}, images)
      return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[:, 0])

    return jax.value_and_grad(loss)(params)

  value, grads = loss_and_grad(params)
  assert np.isfinite(value)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  for layer in range(2):
    assert float(grads[f"block_{layer}"]["attn"]["entmax_alpha"]) != 0.0


def test_config_builds_sparse_vit():
  config = load_config("tiny_config", "mode=vit")
  config.model.attention = "entmax"
  images = jnp.zeros((1, 32, 32, 3))
  variables = jax.eval_shape(
    build_models(config, kernel_sets.for_config(config)).init, jax.random.key(0), images
  )
  for layer in range(config.model.depth):
    assert variables["params"]["vit"][f"block_{layer}"]["attn"]["entmax_alpha"].shape == ()


def test_bad_attention_names_the_field():
  config = load_config("tiny_config", "mode=vit")
  config.model.attention = "linear"
  with pytest.raises(ConfigError, match=r"config\.model\.attention='linear'.*softmax.*entmax"):
    configlib.validate(config)
