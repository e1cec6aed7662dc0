"""Convolutions as matmuls (the CPU path) equal XLA's convolutions, values and gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitboot_jax.models import conv, kernels
from vitboot_jax.models.agent import tap_positions
from vitboot_jax.models.conv import assemble_kernel

NHWC = ("NHWC", "HWIO", "NHWC")


def _lax(x, kernel, strides, padding):
  return jax.lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=NHWC)


@pytest.mark.parametrize(
  "name, x_shape, kernel_shape, strides, padding",
  [
    ("patch embedding", (2, 16, 16, 3), (4, 4, 3, 8), (4, 4), "VALID"),
    ("res-like stem conv1", (2, 20, 20, 3), (7, 7, 3, 16), (2, 2), ((3, 3), (3, 3))),
    ("stem conv2 (im2col)", (2, 9, 9, 16), (3, 3, 16, 24), (2, 2), ((1, 1), (1, 1))),
    ("3x3 per-tap matmuls", (2, 7, 6, 72), (3, 3, 72, 40), (1, 1), "SAME"),
    ("strided 1x1", (2, 8, 8, 80), (1, 1, 80, 16), (2, 2), "VALID"),
  ],
)
@pytest.mark.slow
def test_conv_as_matmuls_equals_lax_conv(name, x_shape, kernel_shape, strides, padding):
  kx, kk, kc = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, x_shape)
  kernel = jax.random.normal(kk, kernel_shape) / np.sqrt(np.prod(kernel_shape[:3]))
  want = _lax(x, kernel, strides, padding)
  got = conv.conv_as_matmuls(x, kernel, strides, padding)
  assert got.shape == want.shape, name
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  cotangent = jax.random.normal(kc, want.shape)
  loss = lambda f: lambda x, k: (f(x, k, strides, padding) * cotangent).sum()
  got_grads = jax.grad(loss(conv.conv_as_matmuls), (0, 1))(x, kernel)
  want_grads = jax.grad(loss(_lax), (0, 1))(x, kernel)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def _primitives(fn, *args) -> list[str]:
  """Every primitive `fn` runs, inside custom derivative rules too."""
  names = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      names.append(eqn.primitive.name)
      for sub in jax.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return names


@pytest.mark.parametrize(
  "x_shape, kernel_shape, strides, padding",
  [
    ((2, 9, 9, 16), (3, 3, 16, 24), (2, 2), ((1, 1), (1, 1))),
    ((2, 7, 6, 72), (3, 3, 72, 40), (1, 1), "SAME"),
    ((2, 20, 20, 3), (7, 7, 3, 16), (2, 2), ((3, 3), (3, 3))),
  ],
)
def test_conv_with_matmul_kernel_grad_equals_lax_conv(x_shape, kernel_shape, strides, padding):
  kx, kk, kc = jax.random.split(jax.random.key(10), 3)
  x = jax.random.normal(kx, x_shape)
  kernel = jax.random.normal(kk, kernel_shape) / np.sqrt(np.prod(kernel_shape[:3]))
  want = _lax(x, kernel, strides, padding)
  np.testing.assert_allclose(
    conv.conv_matmul_kernel_grad(x, kernel, strides, padding), want, rtol=1e-5, atol=1e-5
  )
  cotangent = jax.random.normal(kc, want.shape)
  loss = lambda f: lambda x, k: (f(x, k, strides, padding) * cotangent).sum()
  got_grads = jax.grad(loss(conv.conv_matmul_kernel_grad), (0, 1))(x, kernel)
  want_grads = jax.grad(loss(_lax), (0, 1))(x, kernel)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
  # The kernel gradient is built from matmuls (XLA:CPU runs kernel-gradient convolutions slowly).
  kernel_grad = jax.grad(loss(conv.conv_matmul_kernel_grad), 1)
  differentiated = [p for p in _primitives(kernel_grad, x, kernel) if p != "custom_vjp_call"]
  assert "dot_general" in differentiated


@pytest.mark.parametrize("heads", [6, 9])
def test_taps_conv_with_matmul_grad_equals_lax_conv(heads):
  k, positions = tap_positions(heads, "official")
  kx, kt, kc = jax.random.split(jax.random.key(11), 3)
  x = jax.random.normal(kx, (2, 6, 5, 16))
  taps = jax.random.normal(kt, (heads, 16, 16)) / 12
  lax_taps = lambda x, t: _lax(x, assemble_kernel(t, k, positions), (1, 1), "SAME")
  hybrid = lambda x, t: conv.taps_conv_matmul_grad(x, t, positions, k)
  np.testing.assert_allclose(hybrid(x, taps), lax_taps(x, taps), rtol=1e-5, atol=1e-5)
  cotangent = jax.random.normal(kc, (2, 6, 5, 16))
  loss = lambda f: lambda x, t: (f(x, t) * cotangent).sum()
  for g, w in zip(
    jax.grad(loss(hybrid), (0, 1))(x, taps), jax.grad(loss(lax_taps), (0, 1))(x, taps)
  ):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_bfloat16_convolutions_stay_matmuls():
  """XLA:CPU convolves bf16 slowly: 16-bit inputs take the matmul path in both passes."""
  k, positions = tap_positions(9, "official")
  x = jnp.ones((2, 6, 6, 16), jnp.bfloat16)
  taps = jnp.ones((9, 16, 16), jnp.bfloat16)
  kernel = jnp.ones((3, 3, 16, 16), jnp.bfloat16)
  for fn, args in (
    (lambda x, t: conv.taps_conv_matmul_grad(x, t, positions, k), (x, taps)),
    (lambda x, w: conv.conv_matmul_kernel_grad(x, w, (1, 1), "SAME"), (x, kernel)),
  ):
    grad = jax.grad(lambda *a, fn=fn: fn(*a).astype(jnp.float32).sum(), (0, 1))
    assert "conv_general_dilated" not in _primitives(grad, *args)


@pytest.mark.parametrize("heads", [6, 9])
@pytest.mark.slow
def test_taps_conv_skips_unused_taps(heads):
  k, positions = tap_positions(heads, "official")
  x = jax.random.normal(jax.random.key(1), (2, 5, 5, 8))
  taps = jax.random.normal(jax.random.key(2), (heads, 8, 8))
  want = _lax(x, assemble_kernel(taps, k, positions), (1, 1), "SAME")
  np.testing.assert_allclose(conv.taps_conv(x, taps, positions, k), want, rtol=1e-5, atol=1e-5)
  # Only the real taps are multiplied: 6 heads cost 6 matmuls, not the 9 of the 3x3 window.
  jaxpr = jax.make_jaxpr(lambda x, t: conv.taps_conv(x, t, positions, k))(x, taps)
  assert sum(e.primitive.name == "dot_general" for e in jaxpr.jaxpr.eqns) == heads


@pytest.mark.slow
def test_bfloat16_taps_conv_accumulates_in_float32():
  k, positions = tap_positions(9, "official")
  x = jax.random.normal(jax.random.key(3), (2, 6, 6, 64))
  taps = jax.random.normal(jax.random.key(4), (9, 64, 32)) / 24
  want = _lax(x, assemble_kernel(taps, k, positions), (1, 1), "SAME")
  x16, taps16 = x.astype(jnp.bfloat16), taps.astype(jnp.bfloat16)
  got = conv.taps_conv(x16, taps16, positions, k)
  assert got.dtype == jnp.bfloat16
  exact = _lax(
    x16.astype(jnp.float32),
    assemble_kernel(taps16.astype(jnp.float32), k, positions),
    (1, 1),
    "SAME",
  )
  # One rounding at the end: within one bf16 ulp of the float32 sum of the rounded inputs.
  np.testing.assert_allclose(np.asarray(got, np.float32), exact, rtol=2**-8, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0.05, atol=0.05)


@pytest.mark.slow
def test_flax_hook_falls_back_for_what_it_does_not_handle():
  x = jax.random.normal(jax.random.key(5), (2, 9, 9, 4))
  for module in (
    nn.Conv(6, (3, 3), kernel_dilation=(2, 2)),
    nn.Conv(8, (3, 3), feature_group_count=2),
    nn.Conv(6, (3, 3), strides=(2, 2)),
  ):
    params = module.init(jax.random.key(6), x)
    hooked = module.clone(conv_general_dilated=conv.conv_general_dilated)
    np.testing.assert_allclose(
      hooked.apply(params, x), module.apply(params, x), rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
def test_max_pool_equals_flax_max_pool_values_and_gradients():
  x = jax.random.normal(jax.random.key(7), (2, 11, 10, 4))
  want = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
  got = conv.max_pool(x, 3, stride=2, pad=1)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(kernels.xla_max_pool(x, 3, stride=2, pad=1), want)
  cotangent = jax.random.normal(jax.random.key(8), want.shape)
  grad = lambda f: jax.grad(lambda x: (f(x) * cotangent).sum())(x)
  np.testing.assert_allclose(
    grad(lambda x: conv.max_pool(x, 3, stride=2, pad=1)),
    grad(lambda x: nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))),
    rtol=1e-6,
  )
