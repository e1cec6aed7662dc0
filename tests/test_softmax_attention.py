"""The cpu set's attention with a written-out backward equals autodiff of softmax attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import jaxprs
from vitboot_jax.models import kernels
from vitboot_jax.models.softmax_attention import softmax_attention
from vitboot_jax.models.vit import attend


def _plain(q, k, v):
  out, _ = attend(q, k, v, attention="softmax", alpha=None, dropout_rate=0.0, dropout_key=None)
  return out


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_values_and_gradients_match_autodiff(dtype, tol):
  kq, kk, kv, kc = jax.random.split(jax.random.key(0), 4)
  shape = (3, 2, 17, 8)
  q, k, v = (jax.random.normal(key, shape).astype(dtype) for key in (kq, kk, kv))
  cotangent = jax.random.normal(kc, shape).astype(dtype)
  np.testing.assert_allclose(
    np.asarray(softmax_attention(q, k, v), np.float32),
    np.asarray(_plain(q, k, v), np.float32),
    rtol=tol,
    atol=tol,
  )
  loss = lambda f: lambda q, k, v: jnp.sum((f(q, k, v) * cotangent).astype(jnp.float32))
  got = jax.grad(loss(softmax_attention), (0, 1, 2))(q, k, v)
  want = jax.grad(loss(_plain), (0, 1, 2))(q, k, v)
  for g, w in zip(got, want, strict=True):
    assert g.dtype == dtype
    np.testing.assert_allclose(
      np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=tol, atol=tol
    )


def _reduced_shapes(jaxpr) -> list[tuple[int, ...]]:
  return [
    tuple(eqn.invars[0].aval.shape)
    for eqn in jaxprs.equations(jaxpr)
    if eqn.primitive.name == "reduce_sum"
  ]


def test_backward_reduces_outputs_not_key_rows():
  """The softmax correction comes from [T, d] outputs, not from reducing a [T, T] product."""
  tokens, width = 11, 4
  q = k = v = jnp.ones((2, 3, tokens, width))
  grad = jax.grad(lambda q, k, v: softmax_attention(q, k, v).sum(), (0, 1, 2))
  shapes = _reduced_shapes(jax.make_jaxpr(grad)(q, k, v).jaxpr)
  plain = jax.grad(lambda q, k, v: _plain(q, k, v).sum(), (0, 1, 2))
  plain_shapes = _reduced_shapes(jax.make_jaxpr(plain)(q, k, v).jaxpr)
  key_rows = lambda shapes: sum(s[-2:] == (tokens, tokens) for s in shapes)
  assert (2, 3, tokens, width) in shapes
  # Only the forward softmax's normaliser is left of the key-row reductions.
  assert key_rows(shapes) == 1 < key_rows(plain_shapes)


def test_only_the_cpu_set_writes_the_backward_out():
  assert kernels.CPU.softmax_attention is softmax_attention
  assert kernels.XLA.softmax_attention is None


def test_compiled_backward_has_no_product_over_both_major_axes():
  """dV and dK stay [d, T] x [T, T] products: XLA:CPU runs a dot contracting the major axis of
  both operands (P^T dO as written by autodiff) in its slow generic loop."""
  q = k = v = jnp.ones((2, 3, 11, 4))
  grad = jax.jit(jax.grad(lambda q, k, v: softmax_attention(q, k, v).sum(), (0, 1, 2)))
  hlo = grad.lower(q, k, v).compile().as_text()
  dots = [line for line in hlo.splitlines() if " dot(" in line]
  assert dots, "no dot left in the compiled backward to inspect"
  for line in dots:
    # Batch dims {0,1}: a left operand contracting dim 2 is the query axis taken transposed.
    assert "lhs_contracting_dims={2}" not in line, line
