"""Mixed-precision matmuls: float32 unchanged; 16-bit inputs summed in float32 both ways."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import jaxprs
from vitboot_jax.cpu import matmul

SUBSCRIPTS = ["bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "...k,kn->...n"]


def _operands(subscripts, dtype=jnp.float32):
  shapes = {
    "bhqd,bhkd->bhqk": ((2, 3, 5, 4), (2, 3, 6, 4)),
    "bhqk,bhkd->bhqd": ((2, 3, 5, 6), (2, 3, 6, 4)),
    "...k,kn->...n": ((2, 5, 8), (8, 7)),
  }[subscripts]
  keys = jax.random.split(jax.random.key(0), 2)
  return [jax.random.normal(k, s).astype(dtype) for k, s in zip(keys, shapes)]


@pytest.mark.parametrize("subscripts", SUBSCRIPTS)
@pytest.mark.slow
def test_float32_is_plain_einsum(subscripts):
  a, b = _operands(subscripts)
  np.testing.assert_array_equal(matmul.einsum(subscripts, a, b), jnp.einsum(subscripts, a, b))
  loss = lambda f: lambda a, b: (f(subscripts, a, b) ** 2).sum()
  got = jax.grad(loss(matmul.einsum), (0, 1))(a, b)
  want = jax.grad(loss(jnp.einsum), (0, 1))(a, b)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("subscripts", SUBSCRIPTS)
@pytest.mark.slow
def test_bfloat16_sums_in_float32_forward_and_backward(subscripts):
  a, b = _operands(subscripts, jnp.bfloat16)
  out = matmul.einsum(subscripts, a, b)
  assert out.dtype == jnp.bfloat16
  exact = jnp.einsum(subscripts, a.astype(jnp.float32), b.astype(jnp.float32))
  np.testing.assert_array_equal(out, exact.astype(jnp.bfloat16))  # One rounding, at the end.
  assert matmul.einsum(subscripts, a, b, out_dtype=jnp.float32).dtype == jnp.float32

  loss = lambda a, b: (matmul.einsum(subscripts, a, b).astype(jnp.float32) ** 2).sum()
  grads = jax.grad(loss, (0, 1))(a, b)
  ref = jax.grad(
    lambda a, b: (jnp.einsum(subscripts, a, b).astype(jnp.bfloat16).astype(jnp.float32) ** 2).sum(),
    (0, 1),
  )(a.astype(jnp.float32), b.astype(jnp.float32))
  for g, r in zip(grads, ref):
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(g, np.float32), r, rtol=0.03, atol=0.03 * np.abs(r).max())
  # What makes it fast on CPU: every product of the step, backward included, takes bf16 operands
  # and asks for a float32 result (none multiplies a float32 cotangent by a bf16 operand).
  jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1)))(a, b)
  dots = [e for e in jaxprs.equations(jaxpr) if e.primitive.name == "dot_general"]
  assert len(dots) == 3
  for dot in dots:
    assert {v.aval.dtype for v in dot.invars} == {jnp.dtype(jnp.bfloat16)}
    assert dot.params["preferred_element_type"] == jnp.float32


def test_contractions_inside_one_operand_fall_back():
  a = jnp.ones((3, 4), jnp.bfloat16)
  b = jnp.ones((4, 5), jnp.bfloat16)
  assert not matmul._transposable("ij,jk->i")  # k is summed inside b alone.
  np.testing.assert_array_equal(matmul.einsum("ij,jk->i", a, b), jnp.einsum("ij,jk->i", a, b))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_flax_dense_hook(dtype):
  x = jax.random.normal(jax.random.key(1), (2, 3, 8))
  plain = nn.Dense(6, dtype=dtype)
  hooked = nn.Dense(6, dtype=dtype, dot_general=matmul.dot_general)
  params = plain.init(jax.random.key(2), x)
  want = plain.apply(params, x)
  got = hooked.apply(params, x)
  assert got.dtype == want.dtype
  tol = 0 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol)


@pytest.mark.parametrize("subscripts", SUBSCRIPTS)
def test_bf16_einsum_rounds_float32_operands_and_keeps_float32_results(subscripts):
  a, b = _operands(subscripts)
  out = matmul.bf16_einsum(subscripts, a, b)
  assert out.dtype == jnp.float32
  half = lambda t: t.astype(jnp.bfloat16).astype(jnp.float32)
  np.testing.assert_allclose(out, jnp.einsum(subscripts, half(a), half(b)), rtol=1e-5, atol=1e-5)
  assert np.abs(out - jnp.einsum(subscripts, a, b)).max() > 0  # The operands really were rounded.

  loss = lambda f: lambda a, b: (f(subscripts, a, b) ** 2).sum()
  grads = jax.grad(loss(matmul.bf16_einsum), (0, 1))(a, b)
  exact = jax.grad(loss(jnp.einsum), (0, 1))(a, b)
  for g, r in zip(grads, exact):
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, r, rtol=0.03, atol=0.03 * np.abs(r).max())
  jaxpr = jax.make_jaxpr(jax.grad(loss(matmul.bf16_einsum), (0, 1)))(a, b)
  for dot in (e for e in jaxprs.equations(jaxpr) if e.primitive.name == "dot_general"):
    assert {v.aval.dtype for v in dot.invars} == {jnp.dtype(jnp.bfloat16)}
    assert dot.params["preferred_element_type"] == jnp.float32


def test_bf16_dot_general_is_a_dense_hook():
  x = jax.random.normal(jax.random.key(1), (2, 5, 8))
  dense = nn.Dense(7, dot_general=matmul.bf16_dot_general)
  params = dense.init(jax.random.key(0), x)
  out = dense.apply(params, x)
  assert out.dtype == jnp.float32
  kernel = params["params"]["kernel"]
  want = (
    jnp.einsum(
      "...k,kn->...n",
      x.astype(jnp.bfloat16),
      kernel.astype(jnp.bfloat16),
      preferred_element_type=jnp.float32,
    )
    + params["params"]["bias"]
  )
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
