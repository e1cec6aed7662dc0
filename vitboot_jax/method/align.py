"""Gradient alignment (Align of the paper's Algorithm 1) as plain pytree algebra.

The shared weights receive a gradient from the ViT loss (g_vit) and one from the agent loss
(g_agent). When the two conflict (negative inner product) the agent's gradient would undo part of
the ViT's progress, so Align removes from g_agent its component along g_vit, as PCGrad does
(Yu et al. 2020). The ViT is the model we care about, so only the agent's gradient is projected.

Sharing is not always whole leaves: the agent reads only the V columns of the ViT's fused qkv
kernel. A `mask` pytree (0/1, broadcastable to each leaf, e.g. [1, 3D] for the qkv kernel) says
which entries are shared; inner products, norms and the projection then live on those entries only.

No flax here, and no Python branching on values, so everything runs inside the jitted train step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def _f32(x: jax.Array) -> jax.Array:
  return jnp.asarray(x).astype(jnp.float32)


def tree_dot(a: PyTree, b: PyTree) -> jax.Array:
  """Inner product of two pytrees of the same structure, accumulated in float32."""
  parts = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.sum(_f32(x) * _f32(y)), a, b))
  return sum(parts, jnp.zeros((), jnp.float32))


def tree_sq_norm(a: PyTree) -> jax.Array:
  """Squared L2 norm of a pytree, accumulated in float32."""
  return tree_dot(a, a)


def _full_mask(mask: PyTree | None, like: PyTree) -> PyTree:
  """Expands `mask` to one boolean leaf per leaf of `like`.

  None means every entry is shared. A mask leaf may also stand for a whole subtree of `like` (a
  prefix tree), e.g. {"vit": 1.0, "agent": 0.0}.
  """
  if mask is None:
    return jax.tree.map(lambda _: jnp.ones((), bool), like)
  return jax.tree.map(lambda m, sub: jax.tree.map(lambda _: jnp.asarray(m) > 0, sub), mask, like)


def _masked(x: jax.Array, m: jax.Array) -> jax.Array:
  """float32 copy of `x` with unshared entries zeroed (where, not multiply, so inf cannot leak)."""
  return jnp.where(m, _f32(x), 0.0)


def _safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den, and 0 where den == 0 (a zero g_vit has no direction to project on)."""
  ok = den > 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def align(
  g_agent: PyTree,
  g_vit: PyTree,
  *,
  granularity: str = "global",
  mask: PyTree | None = None,
) -> tuple[PyTree, dict[str, jax.Array]]:
  """PCGrad projection of `g_agent` against `g_vit` on the masked entries.

  If <g_agent, g_vit> < 0 returns g_agent - <g_agent, g_vit> / ||g_vit||^2 * g_vit, else g_agent.
  granularity="global" tests and projects with one inner product over all leaves (the whole shared
  weight set, as Algorithm 1 states it); "per_leaf" treats each leaf as its own task pair, which
  also catches conflicts that cancel out globally. Unmasked entries come back unchanged.

  Returns:
    (aligned g_agent, info) with float32 scalars: `cosine` (global, masked), `conflict` (1.0 if the
    global inner product is negative) and `conflict_fraction` (fraction of leaves with any shared
    entry whose own inner product is negative).
  """
  masks = _full_mask(mask, g_agent)
  a_m = jax.tree.map(_masked, g_agent, masks)
  v_m = jax.tree.map(_masked, g_vit, masks)
  dots = jax.tree.map(lambda x, y: jnp.sum(x * y), a_m, v_m)
  v_sq = jax.tree.map(lambda y: jnp.sum(y * y), v_m)
  a_sq = jax.tree.map(lambda x: jnp.sum(x * x), a_m)
  active = jax.tree.map(lambda m, g: jnp.any(jnp.broadcast_to(m, jnp.shape(g))), masks, g_agent)

  total = lambda t: sum(jax.tree.leaves(t), jnp.zeros((), jnp.float32))
  dot, vv, aa = total(dots), total(v_sq), total(a_sq)

  if granularity == "global":
    coef = _safe_div(jnp.minimum(dot, 0.0), vv)
    coefs = jax.tree.map(lambda _: coef, dots)
  else:
    coefs = jax.tree.map(lambda d, n: _safe_div(jnp.minimum(d, 0.0), n), dots, v_sq)

  # v_m is zero off the mask, so only shared entries move.
  aligned = jax.tree.map(
    lambda g, v, c: (_f32(g) - c * v).astype(jnp.asarray(g).dtype), g_agent, v_m, coefs
  )

  leaf_conflict = jax.tree.leaves(
    jax.tree.map(lambda d, act: jnp.logical_and(act, d < 0), dots, active)
  )
  num_active = total(jax.tree.map(lambda act: act.astype(jnp.float32), active))
  info = {
    "cosine": _safe_div(dot, jnp.sqrt(aa * vv)),
    "conflict": (dot < 0).astype(jnp.float32),
    "conflict_fraction": _safe_div(
      sum((c.astype(jnp.float32) for c in leaf_conflict), jnp.zeros((), jnp.float32)), num_active
    ),
  }
  return aligned, info


def combine(
  g_vit: PyTree,
  g_agent: PyTree,
  shared_mask: PyTree,
  *,
  method: str = "pcgrad",
  granularity: str = "global",
) -> tuple[PyTree, dict[str, jax.Array]]:
  """The bootstrapping update direction of Algorithm 1 for one parameter pytree.

  Shared entries get (g_vit + Align(g_agent | g_vit)) / 2; private entries get g_vit + g_agent,
  since only one of the two losses reaches them, so the sum is that model's own gradient. With
  method="none" (official code, which has no Align) the result is g_vit + g_agent everywhere, i.e.
  the gradient of the summed losses. `info` is computed in both modes so runs can be compared.

  Args:
    g_vit: gradient of the ViT loss w.r.t. all params.
    g_agent: gradient of the agent loss, same structure.
    shared_mask: 0/1 pytree (leaves broadcastable to the gradient leaves, or a prefix tree) marking
      the entries both models read.
    method: "pcgrad" or "none" (config.align).
    granularity: "global" or "per_leaf" (config.align_granularity).
  """
  aligned, info = align(g_agent, g_vit, granularity=granularity, mask=shared_mask)
  if method == "none":
    return jax.tree.map(lambda v, a: v + a, g_vit, g_agent), info
  masks = _full_mask(shared_mask, g_vit)
  combined = jax.tree.map(
    lambda m, v, a, al: jnp.where(m, (v + al) / 2, v + a).astype(jnp.result_type(v, a)),
    masks,
    g_vit,
    g_agent,
    aligned,
  )
  return combined, info
