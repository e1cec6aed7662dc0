"""Softmax attention with the backward pass written out, for the `cpu` kernel set.

Autodiff of softmax reduces dP * P over the keys (a [T, T] product per head) to get each row's
correction; here it comes from the outputs instead, delta = sum_d dO * O ([T, d]: the same value,
as sum_k P dP = sum_k P (dO V^T) = sum_d dO O), the FlashAttention backward. On XLA:CPU the
[T, T] reduction was fused with the products into a slow loop (docs/performance.md).

dV = P^T dO and dK = dS^T Q contract the query axis, the major axis of both operands; XLA:CPU
runs such a product, and any rewrite that folds a transpose back into it, in its generic dot loop
at a third of the library kernel's rate. Both are computed transposed instead, dV^T = dO^T P,
from the small [d, T] transposes, with barriers that keep XLA from folding them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vitboot_jax.cpu import matmul


def _forward(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
  logits = matmul.einsum("bhqd,bhkd->bhqk", q, k)
  # Probabilities in float32 even under bf16 compute: attention logits overflow bf16 easily.
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
  return matmul.einsum("bhqk,bhkd->bhqd", probs, v), probs


@jax.custom_vjp
def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """softmax(q k^T) v on [B, heads, T, d] (q already scaled), no dropout."""
  return _forward(q, k, v)[0]


def _softmax_attention_fwd(q, k, v):
  out, probs = _forward(q, k, v)
  return out, (q, k, v, probs, out)


def _contract_queries(a: jax.Array, b: jax.Array) -> jax.Array:
  """sum_q a[..., q, k] b[..., q, d] -> [..., k, d], as (b^T a)^T."""
  b_t = jax.lax.optimization_barrier(jnp.swapaxes(b, -1, -2))
  return jnp.swapaxes(
    jax.lax.optimization_barrier(matmul.einsum("bhdq,bhqk->bhdk", b_t, a)), -1, -2
  )


def _softmax_attention_bwd(residuals, d_out):
  q, k, v, probs, out = residuals
  d_v = _contract_queries(probs, d_out)
  d_probs = matmul.einsum("bhqd,bhkd->bhqk", d_out, v, out_dtype=jnp.float32)
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
  d_logits = (probs.astype(jnp.float32) * (d_probs - delta)).astype(q.dtype)
  d_q = matmul.einsum("bhqk,bhkd->bhqd", d_logits, k)
  d_k = _contract_queries(d_logits, q)
  return d_q, d_k, d_v


softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)
