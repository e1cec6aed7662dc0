"""The cpu set's attention with a written-out backward, and the xla set's fused attention
(jax.nn.dot_product_attention), equal autodiff of the plain softmax attention."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import jaxprs
from vitboot_jax.cpu import kernels as cpu_kernels
from vitboot_jax.cpu.softmax_attention import softmax_attention
from vitboot_jax.models import kernels
from vitboot_jax.models import vit as vit_lib
from vitboot_jax.models.vit import attend


def _plain(q, k, v):
  out, _ = attend(q, k, v, attention="softmax", alpha=None, dropout_rate=0.0, dropout_key=None)
  return out


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
@pytest.mark.slow
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
  assert cpu_kernels.CPU.softmax_attention is softmax_attention
  assert cpu_kernels.CPU.inference_softmax_attention is None  # Keeps its sliced evaluation.
  assert kernels.XLA.softmax_attention is kernels.fused_attention
  assert kernels.XLA.inference_softmax_attention is kernels.fused_attention


def _values_and_grads(f, q, k, v, cotangent):
  loss = lambda q, k, v: jnp.sum((f(q, k, v) * cotangent).astype(jnp.float32))
  out = jax.jit(f)(q, k, v)
  grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
  return [np.asarray(t, np.float32) for t in (out, *grads)]


@pytest.mark.parametrize("tokens", [17, 197])  # 197: ViT-S's 14 x 14 patches + cls.
def test_fused_attention_matches_the_plain_path_in_float32(tokens):
  """Same einsum-softmax-einsum, other fusions: outputs and gradients agree to float32 rounding
  (eps 1.2e-7, sums of T = 197 terms: a few 1e-6 relative)."""
  kq, kk, kv, kc = jax.random.split(jax.random.key(1), 4)
  shape = (2, 3, tokens, 32)  # Head dim 32: ViT-S's 288 / 9.
  q, k, v, cotangent = (jax.random.normal(key, shape) for key in (kq, kk, kv, kc))
  q = q * 32**-0.5
  got = _values_and_grads(kernels.fused_attention, q, k, v, cotangent)
  want = _values_and_grads(_plain, q, k, v, cotangent)
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_fused_attention_in_bfloat16_stays_within_two_roundings_of_float32():
  """bf16 (8-bit mantissa, eps 2^-8): the probabilities and the output are each rounded once, so
  both paths stay within 2 eps of the float32 values, relative to the largest (measured on CPU:
  fused 0.44-0.55 % for the output and gradients, plain 0.30-0.55 %)."""
  kq, kk, kv, kc = jax.random.split(jax.random.key(2), 4)
  shape = (2, 3, 65, 32)
  q, k, v, cotangent = (jax.random.normal(key, shape) for key in (kq, kk, kv, kc))
  q = q * 32**-0.5
  exact = _values_and_grads(_plain, q, k, v, cotangent)
  half = [t.astype(jnp.bfloat16) for t in (q, k, v, cotangent)]
  fused = _values_and_grads(kernels.fused_attention, *half)
  plain = _values_and_grads(_plain, *half)
  for name, f, p, x in zip(("out", "dq", "dk", "dv"), fused, plain, exact, strict=True):
    scale = np.abs(x).max()
    for path, got in (("fused", f), ("plain", p)):
      assert np.abs(got - x).max() / scale < 2 * 2.0**-8, (name, path)


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


@pytest.mark.slow
def test_xla_set_vit_takes_the_fused_path_only_without_attention_dropout():
  """A ViT on the xla set: the fused op where attention has no dropout (evaluation; training at
  dropout 0), the same logits and parameter gradients as the plain path (float32 rounding)."""
  calls = []

  def counted(q, k, v):
    calls.append(q.shape)
    return kernels.fused_attention(q, k, v)

  fused_set = dataclasses.replace(
    kernels.XLA, softmax_attention=counted, inference_softmax_attention=counted
  )
  plain_set = dataclasses.replace(
    kernels.XLA, softmax_attention=None, inference_softmax_attention=None
  )
  model = vit_lib.ViT(num_classes=5, patch_size=4, embed_dim=12, depth=2, num_heads=3, mlp_dim=24)
  images = jax.random.normal(jax.random.key(4), (4, 16, 16, 3))
  params = model.init(jax.random.key(0), images[:1])["params"]

  def loss(params, kernel_set, train, dropout=0.0):
    m = model.clone(kernels=kernel_set, dropout=dropout)
    rngs = {"dropout": jax.random.key(1)} if train else {}
    return jnp.sum(m.apply({"params": params}, images, train=train, rngs=rngs)[0] ** 2)

  value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=(1, 2))
  for train in (False, True):
    calls.clear()
    got, got_grads = value_and_grad(params, fused_set, train)
    assert len(calls) == 2, train  # One per block (counted while tracing).
    want, want_grads = value_and_grad(params, plain_set, train)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got_grads, want_grads
    )
  calls.clear()
  jax.eval_shape(functools.partial(loss, kernel_set=fused_set, train=True, dropout=0.1), params)
  assert not calls  # The recipe's attention dropout keeps the plain path in training.
  jax.eval_shape(functools.partial(loss, kernel_set=fused_set, train=False, dropout=0.1), params)
  assert len(calls) == 2
