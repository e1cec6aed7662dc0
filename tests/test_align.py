"""Tests for align.py: PCGrad projection, masks, Algorithm 1's combination and the optax stage."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import tolerances
from vitboot_jax.method import align

SHAPES = {"a": (3, 4), "b": {"c": (5,), "d": (2, 2, 2)}}


def random_tree(rng, scale=1.0):
  return jax.tree.map(
    lambda s: jnp.asarray(rng.normal(size=s) * scale, jnp.float32),
    SHAPES,
    is_leaf=lambda x: isinstance(x, tuple),
  )


def flat(tree):
  return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def ref_pcgrad(a, v):
  """Flat float64 PCGrad of a against v."""
  dot = a @ v
  return a - dot / (v @ v) * v if dot < 0 else a


def conflicting_pair(seed, conflict):
  rng = np.random.default_rng(seed)
  g_vit = random_tree(rng)
  noise = random_tree(rng, 0.5)
  sign = -1.0 if conflict else 1.0
  g_agent = jax.tree.map(lambda v, n: sign * v + n, g_vit, noise)
  return g_agent, g_vit


@pytest.mark.parametrize("seed", range(6))
def test_global_projection_properties(seed):
  for conflict in (True, False):
    g_agent, g_vit = conflicting_pair(seed, conflict)
    dot_before = float(align.tree_dot(g_agent, g_vit))
    assert (dot_before < 0) == conflict
    out, info = align.align(g_agent, g_vit)
    dot_after = float(align.tree_dot(out, g_vit))
    assert jax.tree.structure(out) == jax.tree.structure(g_agent)
    if conflict:
      assert abs(dot_after) < 1e-4 * float(align.tree_sq_norm(g_vit))
      assert float(info["conflict"]) == 1.0
    else:
      for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(g_agent)):
        np.testing.assert_array_equal(x, y)
      assert float(info["conflict"]) == 0.0
    # Never increases the conflict.
    assert dot_after >= min(0.0, dot_before) - 1e-4
    np.testing.assert_allclose(
      flat(out), ref_pcgrad(flat(g_agent), flat(g_vit)), rtol=1e-5, atol=1e-5
    )
    a, v = flat(g_agent), flat(g_vit)
    np.testing.assert_allclose(
      info["cosine"], a @ v / np.linalg.norm(a) / np.linalg.norm(v), rtol=1e-5
    )


@pytest.mark.parametrize("seed", range(4))
def test_random_pairs_never_increase_conflict(seed):
  rng = np.random.default_rng(100 + seed)
  g_agent, g_vit = random_tree(rng), random_tree(rng)
  for granularity in ("global", "per_leaf"):
    out, _ = align.align(g_agent, g_vit, granularity=granularity)
    for o, a, v in zip(*(jax.tree.leaves(t) for t in (out, g_agent, g_vit))):
      if granularity == "per_leaf":
        # Per leaf: every leaf individually is projected or untouched.
        o, a, v = (np.asarray(x, np.float64).ravel() for x in (o, a, v))
        np.testing.assert_allclose(o, ref_pcgrad(a, v), rtol=1e-5, atol=1e-5)
        assert o @ v >= min(0.0, a @ v) - 1e-4
    dot_before = float(align.tree_dot(g_agent, g_vit))
    assert float(align.tree_dot(out, g_vit)) >= min(0.0, dot_before) - 1e-4


def test_per_leaf_differs_from_global():
  # Leaf "x" conflicts (dot -1); leaf "y" agrees strongly (dot 3); the global dot is +2.
  g_agent = {"x": jnp.array([1.0, 0.0]), "y": jnp.array([3.0])}
  g_vit = {"x": jnp.array([-1.0, 0.0]), "y": jnp.array([1.0])}
  out_g, info_g = align.align(g_agent, g_vit, granularity="global")
  out_l, info_l = align.align(g_agent, g_vit, granularity="per_leaf")
  np.testing.assert_array_equal(out_g["x"], [1.0, 0.0])
  np.testing.assert_array_equal(out_g["y"], [3.0])
  np.testing.assert_allclose(out_l["x"], [0.0, 0.0], atol=1e-7)
  np.testing.assert_array_equal(out_l["y"], [3.0])
  assert float(info_g["conflict"]) == 0.0 and float(info_l["conflict"]) == 0.0
  np.testing.assert_allclose(info_l["conflict_fraction"], 0.5)


def test_zero_vit_gradient_leaves_agent_unchanged():
  rng = np.random.default_rng(7)
  g_agent = random_tree(rng)
  zeros = jax.tree.map(jnp.zeros_like, g_agent)
  for granularity in ("global", "per_leaf"):
    out, info = align.align(g_agent, zeros, granularity=granularity)
    for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(g_agent)):
      np.testing.assert_array_equal(x, y)
    assert np.isfinite(float(info["cosine"]))


def test_mask_restricts_projection_to_shared_entries():
  rng = np.random.default_rng(11)
  d = 4
  g_vit = {
    "qkv": jnp.asarray(rng.normal(size=(d, 3 * d)), jnp.float32),
    "out": jnp.asarray(rng.normal(size=(d, d)), jnp.float32),
    "stem": jnp.asarray(rng.normal(size=(3, d)), jnp.float32),
  }
  noise = jax.tree.map(lambda x: 0.3 * jnp.asarray(rng.normal(size=x.shape), jnp.float32), g_vit)
  g_agent = jax.tree.map(lambda v, n: -v + n, g_vit, noise)
  # Only the V columns of qkv and the whole out kernel are shared; the stem is private.
  v_cols = jnp.zeros((1, 3 * d)).at[:, 2 * d :].set(1.0)
  mask = {"qkv": v_cols, "out": jnp.ones(()), "stem": jnp.zeros(())}
  out, info = align.align(g_agent, g_vit, mask=mask)
  # Private entries come back bit-identical.
  np.testing.assert_array_equal(out["stem"], g_agent["stem"])
  np.testing.assert_array_equal(out["qkv"][:, : 2 * d], g_agent["qkv"][:, : 2 * d])
  # Shared part: exactly PCGrad on the concatenated shared sub-vectors.
  shared = lambda t: np.concatenate(
    [np.asarray(t["qkv"][:, 2 * d :], np.float64).ravel(), np.asarray(t["out"]).ravel()]
  )
  a, v = shared(g_agent), shared(g_vit)
  assert a @ v < 0
  np.testing.assert_allclose(shared(out), ref_pcgrad(a, v), rtol=1e-5, atol=1e-5)
  assert abs(shared(out) @ v) < 1e-4 * (v @ v)
  np.testing.assert_allclose(
    info["cosine"], a @ v / np.linalg.norm(a) / np.linalg.norm(v), rtol=1e-5
  )
  # The private stem is not part of the statistics: the mask decides, not the values.
  wild = dict(g_agent, stem=g_agent["stem"] * 1e3)
  _, info2 = align.align(wild, g_vit, mask=mask)
  np.testing.assert_allclose(info2["cosine"], info["cosine"], rtol=1e-6)
  # per_leaf with a mask: the fully private leaf does not count in the fraction.
  _, info3 = align.align(g_agent, g_vit, mask=mask, granularity="per_leaf")
  np.testing.assert_allclose(info3["conflict_fraction"], 1.0)


def test_prefix_mask_covers_subtrees():
  g_vit = {"vit": {"w": jnp.array([1.0, 0.0])}, "agent": {"w": jnp.array([1.0])}}
  g_agent = {"vit": {"w": jnp.array([-1.0, 1.0])}, "agent": {"w": jnp.array([-5.0])}}
  out, _ = align.align(g_agent, g_vit, mask={"vit": 1.0, "agent": 0.0})
  np.testing.assert_allclose(out["vit"]["w"], [0.0, 1.0])
  np.testing.assert_array_equal(out["agent"]["w"], [-5.0])


def test_align_jits_and_matches_eager():
  g_agent, g_vit = conflicting_pair(3, True)
  for granularity in ("global", "per_leaf"):
    fn = lambda a, v, g=granularity: align.align(a, v, granularity=g)
    eager, info_e = fn(g_agent, g_vit)
    jitted, info_j = jax.jit(fn)(g_agent, g_vit)
    np.testing.assert_allclose(flat(jitted), flat(eager), rtol=1e-6, atol=1e-7)
    n = sum(x.size for x in jax.tree.leaves(g_vit))
    np.testing.assert_allclose(info_j["cosine"], info_e["cosine"], atol=tolerances.cosine_atol(n))
    for k in set(info_e) - {"cosine"}:
      np.testing.assert_allclose(info_j[k], info_e[k], rtol=1e-6)


def test_combine_hand_computed():
  g_vit = {"shared": jnp.array([1.0, 0.0]), "vit_head": jnp.array([2.0]), "stem": jnp.array([0.0])}
  g_agent = {
    "shared": jnp.array([-1.0, 1.0]),
    "vit_head": jnp.array([0.0]),
    "stem": jnp.array([3.0]),
  }
  mask = {"shared": 1.0, "vit_head": 0.0, "stem": 0.0}
  # <a, v> = -1, ||v||^2 = 1: Align(a | v) = [-1, 1] + [1, 0] = [0, 1];
  # shared = ([1, 0] + [0, 1]) / 2.
  out, info = align.combine(g_vit, g_agent, mask, method="pcgrad")
  np.testing.assert_allclose(out["shared"], [0.5, 0.5])
  np.testing.assert_allclose(out["vit_head"], [2.0])
  np.testing.assert_allclose(out["stem"], [3.0])
  assert float(info["conflict"]) == 1.0
  np.testing.assert_allclose(info["cosine"], -1 / np.sqrt(2), rtol=1e-6)
  # Official behaviour: the gradient of the summed losses everywhere.
  out, _ = align.combine(g_vit, g_agent, mask, method="none")
  np.testing.assert_allclose(out["shared"], [0.0, 1.0])
  np.testing.assert_allclose(out["vit_head"], [2.0])
  np.testing.assert_allclose(out["stem"], [3.0])
  # No conflict: shared entries are the plain average.
  out, _ = align.combine(g_vit, dict(g_agent, shared=jnp.array([3.0, 1.0])), mask)
  np.testing.assert_allclose(out["shared"], [2.0, 0.5])


def test_combine_partial_leaf_mask():
  """A qkv-like leaf: V columns averaged after alignment, Q/K columns summed."""
  g_vit = {"qkv": jnp.array([[1.0, 2.0, 1.0, 0.0]])}
  g_agent = {"qkv": jnp.array([[3.0, 4.0, -1.0, 1.0]])}
  mask = {"qkv": jnp.array([[0.0, 0.0, 1.0, 1.0]])}
  out, _ = align.combine(g_vit, g_agent, mask)
  # Shared part: a=[-1,1], v=[1,0] -> Align = [0,1]; ([1,0] + [0,1]) / 2 = [.5,.5].
  np.testing.assert_allclose(out["qkv"], [[4.0, 6.0, 0.5, 0.5]])
