"""Matmuls with the mixed-precision contract: 16-bit float inputs, float32 sums, 16-bit outputs.

That is what TPUs and cuBLAS do for bf16, made explicit so that XLA:CPU does it too: on CPUs with
AMX / AVX512-BF16, XLA only takes its fast bf16 kernel when asked for a float32 result (rates:
docs/results.md, "Throughput at 224 px").
The backward products follow the same contract through a custom VJP; JAX's own transpose of a
dot with `preferred_element_type=float32` would multiply a float32 cotangent by a bf16 operand,
which runs at the float32 rate or below. For float32 (and float64) inputs both functions are
the plain jnp/lax ones, bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

HALF_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _product(subscripts: str, a: jax.Array, b: jax.Array, out_dtype) -> jax.Array:
  return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32).astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _half_einsum(subscripts: str, a: jax.Array, b: jax.Array, out_dtype) -> jax.Array:
  return _product(subscripts, a, b, out_dtype)


def _half_einsum_fwd(subscripts, a, b, out_dtype):
  return _half_einsum(subscripts, a, b, out_dtype), (a, b)


def _half_einsum_bwd(subscripts, out_dtype, residuals, ct):
  a, b = residuals
  inputs, out = subscripts.split("->")
  sa, sb = inputs.split(",")
  return (
    _product(f"{out},{sb}->{sa}", ct.astype(a.dtype), b, a.dtype),
    _product(f"{sa},{out}->{sb}", a, ct.astype(b.dtype), b.dtype),
  )


_half_einsum.defvjp(_half_einsum_fwd, _half_einsum_bwd)


def _transposable(subscripts: str) -> bool:
  """Whether each operand's gradient is itself a two-operand einsum of the other two terms.

  True when every index of an operand also appears in the other operand or in the output
  (no index is summed over inside one operand alone), the case of every matmul and batched
  matmul.
  """
  if "->" not in subscripts or subscripts.count(",") != 1:
    return False
  inputs, out = subscripts.replace(" ", "").split("->")
  sa, sb = inputs.split(",")
  strip = lambda s: set(s.replace("...", ""))
  a, b, o = strip(sa), strip(sb), strip(out)
  return a <= b | o and b <= a | o and o <= a | b


def einsum(subscripts: str, a: jax.Array, b: jax.Array, out_dtype=None) -> jax.Array:
  """Two-operand jnp.einsum under the mixed-precision contract (see the module docstring).

  `out_dtype=jnp.float32` keeps the float32 sums (to add several products before rounding).
  """
  in_dtype = jnp.result_type(a, b)
  out_dtype = jnp.dtype(out_dtype or in_dtype)
  if in_dtype not in HALF_FLOATS or not _transposable(subscripts):
    return jnp.einsum(subscripts, a, b, preferred_element_type=out_dtype)
  return _half_einsum(subscripts.replace(" ", ""), a, b, out_dtype)


def bf16_einsum(subscripts: str, a: jax.Array, b: jax.Array, out_dtype=None) -> jax.Array:
  """`einsum` with float32 operands rounded to bfloat16 for the product (float32 sums and result).

  The mixed policy: only the products run at the bf16 rate; everything around them (norms,
  softmax, GELU, the optimiser) stays float32. Other dtypes and contractions go to `einsum`.
  """
  in_dtype = jnp.result_type(a, b)
  if in_dtype != jnp.float32 or not _transposable(subscripts):
    return einsum(subscripts, a, b, out_dtype)
  a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  return _half_einsum(subscripts.replace(" ", ""), a, b, jnp.dtype(out_dtype or in_dtype))


def _dense_hook(product):
  """flax's `dot_general=` hook whose Dense products x[..., K] @ w[K, N] go to `product`."""

  def hook(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kw):
    (contract_lhs, contract_rhs), (batch_lhs, batch_rhs) = dimension_numbers
    dense = (
      tuple(contract_lhs) == (lhs.ndim - 1,)
      and tuple(contract_rhs) == (0,)
      and rhs.ndim == 2
      and not batch_lhs
      and not batch_rhs
      and precision is None
      and preferred_element_type is None
      and not kw
    )
    if dense:
      return product("...k,kn->...n", lhs, rhs)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type, **kw)

  return hook


bf16_dot_general = _dense_hook(bf16_einsum)


# flax's `dot_general=` hook: a Dense layer's x[..., K] @ w[K, N] under the contract; other
# contractions, explicit precisions and output types go to lax.dot_general unchanged.
dot_general = _dense_hook(einsum)
