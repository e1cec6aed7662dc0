"""alpha-entmax by bisection, with exact gradients w.r.t. the scores and alpha.

This backs the paper's "Sparse" ViT (docs/reference/official_pytorch_code.md §1.6): every attention
layer replaces softmax by
alpha-entmax with one learnable alpha (init 1.5), solved by 50 bisection steps and renormalised to
sum to one (the official `ensure_sum_one`). The official ViT-B-Sparse yaml is a byte copy of the
ViT-S one, so its "ViT-B-Sparse" is really a ViT-S; ours builds the size the config names.

Definition (Peters et al. 2019): p_i = [(alpha - 1) x_i - tau]_+^(1 / (alpha - 1)), with tau such
that sum_i p_i = 1. We bisect on u = (-tau - 1) / s (s = alpha - 1) after shifting x so its max is
0, which gives p_i = exp(log1p(s (x_i + u)) / s), the bracket u in [expm1(-s log d) / s, 0] for
every s (the max entry goes from 1/d to 1) and a smooth s -> 0 limit (softmax, u = -logsumexp).

Backward (implicit function theorem on sum_i p_i = 1; S the support, g_i = p_i^(2 - alpha) on S,
g_hat = g / sum(g)):
  dp/dx     = diag(g) - g g^T / sum(g)
  dp/dalpha = a - g_hat sum(a),  a_i = p_i log(p_i)^2 r(s log p_i),  r(v) = -(e^-v - 1 + v) / v^2
This equals the (p - g_hat) / s^2 - (p log p - g_hat sum(p log p)) / s of Correia et al. 2019, but
has no 1/s cancellation, so it stays accurate as alpha -> 1, where it tends to the softmax limit
-p (l^2 - sum(p l^2)) / 2 with l = log p. alpha is not clamped (as officially); alpha < 1 is
well defined here (dense Tsallis distributions); alpha == 1 exactly returns jax.nn.softmax.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

# Below this |v| the series of r(v) replaces the closed form, whose e^-v - 1 + v cancels.
_SERIES_CUTOFF = 0.5
_SERIES_TERMS = 12


def _r(v: jax.Array) -> jax.Array:
  """r(v) = -(e^-v - 1 + v) / v^2, accurate for every v (r(0) = -1/2)."""
  small = jnp.abs(v) < _SERIES_CUTOFF
  v_small = jnp.where(small, v, 0.0)
  # e^-v - 1 + v = sum_{k>=2} (-v)^k / k!, so r(v) = -sum_{k>=2} (-v)^(k-2) / k!, via Horner.
  series = jnp.zeros_like(v)
  for k in range(_SERIES_TERMS + 1, 1, -1):
    series = series * (-v_small) + 1.0 / math.factorial(k)
  v_big = jnp.where(small, 1.0, v)
  closed = -(jnp.expm1(-v_big) + v_big) / (v_big * v_big)
  return jnp.where(small, -series, closed)


def _log_probs(y: jax.Array, s: jax.Array) -> jax.Array:
  """log p for p = (1 + s y)_+^(1/s); -inf off the support; y itself (softmax) at s == 0."""
  safe_s = jnp.where(s == 0, 1.0, s)
  w = s * y
  inside = w > -1.0
  log_p = jnp.log1p(jnp.where(inside, w, 0.0)) / safe_s
  return jnp.where(s == 0, y, jnp.where(inside, log_p, -jnp.inf))


def _bisect(x: jax.Array, s: jax.Array, n_iter: int) -> jax.Array:
  """Entmax along the last axis for s = alpha - 1 of shape [..., 1]; rows sum to exactly 1."""
  d = x.shape[-1]
  x = x - jnp.max(x, axis=-1, keepdims=True)
  log_d = jnp.log(jnp.asarray(d, x.dtype))
  safe_s = jnp.where(s == 0, 1.0, s)
  lo = jnp.where(s == 0, -log_d, jnp.expm1(-s * log_d) / safe_s)  # The max entry is 1/d here.
  hi = jnp.zeros_like(lo)  # And 1 here, so sum(p) - 1 changes sign in [lo, hi].

  def body(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    total = jnp.sum(jnp.exp(_log_probs(x + mid, s)), axis=-1, keepdims=True)
    too_small = total < 1.0  # sum(p) increases with u.
    return jnp.where(too_small, mid, lo), jnp.where(too_small, hi, mid)

  lo, hi = jax.lax.fori_loop(0, n_iter, body, (lo, hi))
  p = jnp.exp(_log_probs(x + 0.5 * (lo + hi), s))
  return p / jnp.sum(p, axis=-1, keepdims=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _entmax_last(x: jax.Array, alpha: jax.Array, n_iter: int) -> jax.Array:
  """Entmax over the last axis of x; alpha has shape x.shape[:-1] + (1,)."""
  s = alpha - 1.0
  return jnp.where(s == 0, jax.nn.softmax(x, axis=-1), _bisect(x, s, n_iter))


def _entmax_last_fwd(x, alpha, n_iter):
  p = _entmax_last(x, alpha, n_iter)
  return p, (p, alpha)


def _entmax_last_bwd(n_iter, residuals, dp):
  del n_iter
  p, alpha = residuals
  s = alpha - 1.0
  support = p > 0
  log_p = jnp.where(support, jnp.log(jnp.where(support, p, 1.0)), 0.0)
  g = jnp.where(support, jnp.exp((1.0 - s) * log_p), 0.0)  # p^(2 - alpha) on the support.
  g_hat = g / jnp.sum(g, axis=-1, keepdims=True)
  dx = g * dp - g_hat * jnp.sum(g * dp, axis=-1, keepdims=True)
  a = jnp.where(support, p * log_p * log_p * _r(s * log_p), 0.0)
  dalpha = jnp.sum(dp * a, axis=-1, keepdims=True) - jnp.sum(
    dp * g_hat, axis=-1, keepdims=True
  ) * jnp.sum(a, axis=-1, keepdims=True)
  return dx, dalpha


_entmax_last.defvjp(_entmax_last_fwd, _entmax_last_bwd)


@functools.partial(jax.jit, static_argnames=("axis", "n_iter"))
def entmax_bisect(
  x: jax.Array, alpha: jax.Array | float, axis: int = -1, n_iter: int = 50
) -> jax.Array:
  """alpha-entmax of `x` along `axis` (alpha=1: softmax, alpha=2: sparsemax).

  Args:
    x: scores; computed in float32 (or float64 if x is float64) whatever its dtype.
    alpha: a scalar, or an array broadcastable to x with size 1 along `axis` (one alpha per row).
      Differentiable; its gradient is summed over the rows that share it.
    axis: the axis that sums to one.
    n_iter: bisection steps; 50 (official) reaches the float32 resolution of the threshold.

  Returns:
    Probabilities of x's shape in the compute dtype, summing to 1 along `axis`.
  """
  dtype = jnp.promote_types(jnp.result_type(x), jnp.float32)
  x = jnp.moveaxis(jnp.asarray(x, dtype), axis, -1)
  alpha = jnp.asarray(alpha, dtype)
  if alpha.ndim > x.ndim:
    raise ValueError(f"alpha of shape {alpha.shape} has more axes than x {x.shape}")
  alpha = jnp.moveaxis(jnp.reshape(alpha, (1,) * (x.ndim - alpha.ndim) + alpha.shape), axis, -1)
  if alpha.shape[-1] != 1:
    raise ValueError(f"alpha of shape {alpha.shape} must have size 1 along axis {axis}")
  alpha = jnp.broadcast_to(alpha, x.shape[:-1] + (1,))
  return jnp.moveaxis(_entmax_last(x, alpha, n_iter), -1, axis)
