"""Convolutions as matmuls (the CPU path) equal XLA's convolutions, values and gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import jaxprs
from vitboot_jax import kernel_sets
from vitboot_jax.cpu import conv
from vitboot_jax.cpu import kernels as cpu_kernels
from vitboot_jax.models import kernels
from vitboot_jax.models.agent import tap_positions
from vitboot_jax.models.kernels import assemble_kernel

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
  return [eqn.primitive.name for eqn in jaxprs.equations(jax.make_jaxpr(fn)(*args))]


@pytest.mark.parametrize(
  "x_shape, kernel_shape, strides, padding",
  [
    ((2, 9, 9, 16), (3, 3, 16, 24), (2, 2), ((1, 1), (1, 1))),
    pytest.param((2, 7, 6, 72), (3, 3, 72, 40), (1, 1), "SAME", marks=pytest.mark.slow),
    pytest.param((2, 20, 20, 3), (7, 7, 3, 16), (2, 2), ((3, 3), (3, 3)), marks=pytest.mark.slow),
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


def _taps_problem(heads: int, seed: int, batch: int):
  """(window, positions, x, taps, cotangent, the lax convolution over the assembled taps)."""
  k, positions = tap_positions(heads, "official")
  kx, kt, kc = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (batch, 6, 5, 16))
  taps = jax.random.normal(kt, (heads, 16, 16)) / 12
  lax_taps = lambda x, t: _lax(x, assemble_kernel(t, k, positions), (1, 1), "SAME")
  return k, positions, x, taps, jax.random.normal(kc, x.shape), lax_taps


@pytest.mark.parametrize("heads", [pytest.param(6, marks=pytest.mark.slow), 9])
def test_taps_conv_with_matmul_grad_equals_lax_conv(heads):
  k, positions, x, taps, cotangent, lax_taps = _taps_problem(heads, seed=11, batch=2)
  hybrid = lambda x, t: conv.taps_conv_matmul_grad(x, t, positions, k)
  np.testing.assert_allclose(hybrid(x, taps), lax_taps(x, taps), rtol=1e-5, atol=1e-5)
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


def _slices_of(images: int, x_shape, shards: int = 1) -> conv.BatchSlices:
  """Slices of `images` images (per device) for a float32 batch of `x_shape`."""
  return conv.BatchSlices(images * int(np.prod(x_shape[1:])) * 4, shards)


def test_batch_slices_keep_small_batches_whole_and_align_with_devices():
  x = jnp.zeros((64, 32, 32, 144))  # 590 KB per image, 37.7 MB in all.
  assert conv.NO_SLICES.images(x) == 64
  assert conv.BatchSlices(16 * 2**20).images(x) == 64  # Within 4 slices' bytes: stays whole.
  assert conv.BatchSlices(8 * 2**20).images(x) == 8
  assert conv.BatchSlices(8 * 2**20, shards=8).images(x) == 64  # 8 per device: fits.
  assert _slices_of(2, x.shape, shards=8).images(x) == 16  # 2 per device on each of 8.
  assert _slices_of(3, (60, 4, 4, 1)).images(jnp.zeros((60, 4, 4, 1))) == 3


@pytest.mark.parametrize(
  "kernel_shape, strides, padding, loops",
  [
    pytest.param((3, 3, 8, 12), (1, 1), "SAME", 2, marks=pytest.mark.slow),
    ((3, 3, 8, 12), (1, 1), "VALID", 2),
    ((3, 3, 8, 12), (1, 1), ((2, 0), (0, 1)), 2),
    pytest.param((5, 5, 8, 8), (1, 1), "SAME", 2, marks=pytest.mark.slow),
    ((3, 1, 8, 12), (1, 1), ((1, 1), (0, 0)), 2),
    ((3, 3, 8, 12), (1, 1), ((3, 1), (1, 1)), 1),  # A pad beyond k - 1: XLA's own transpose.
    ((3, 3, 8, 12), (2, 2), ((1, 1), (1, 1)), 0),  # Strided: whole batch, XLA's own transpose.
  ],
)
def test_sliced_convolution_equals_lax_conv(kernel_shape, strides, padding, loops):
  kx, kk, kc = jax.random.split(jax.random.key(12), 3)
  x = jax.random.normal(kx, (12, 7, 6, 8))
  kernel = jax.random.normal(kk, kernel_shape) / np.sqrt(np.prod(kernel_shape[:3]))
  slices = _slices_of(2, x.shape)
  sliced = lambda x, k, s, p: conv.conv_matmul_kernel_grad(x, k, s, p, slices=slices)
  want = _lax(x, kernel, strides, padding)
  np.testing.assert_allclose(sliced(x, kernel, strides, padding), want, rtol=1e-5, atol=1e-5)
  cotangent = jax.random.normal(kc, want.shape)
  loss = lambda f: lambda x, k: (f(x, k, strides, padding) * cotangent).sum()
  got_grads = jax.grad(loss(sliced), (0, 1))(x, kernel)
  for g, w in zip(got_grads, jax.grad(loss(_lax), (0, 1))(x, kernel)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
  # Stride 1: the forward and (pads within k - 1) input-gradient convolutions run in slices.
  jaxpr = str(jax.make_jaxpr(jax.grad(loss(sliced), (0, 1)))(x, kernel))
  assert jaxpr.count("scan[") == loops


@pytest.mark.parametrize("heads", [6, 9])
def test_sliced_taps_conv_equals_lax_conv_on_a_sharded_batch(heads):
  """Slices aligned with 8 devices (the batch sharded over them) give the plain values/grads."""
  k, positions, x, taps, cotangent, lax_taps = _taps_problem(heads, seed=13, batch=32)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  x, cotangent = jax.device_put((x, cotangent), batch)
  slices = _slices_of(1, x.shape, shards=len(jax.devices()))
  assert slices.images(x) == len(jax.devices())
  sliced = lambda x, t: conv.taps_conv_matmul_grad(x, t, positions, k, slices=slices)
  loss = lambda f: jax.jit(jax.value_and_grad(lambda x, t: (f(x, t) * cotangent).sum(), (0, 1)))
  (got, got_grads), (want, want_grads) = loss(sliced)(x, taps), loss(lax_taps)(x, taps)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
  # Each device's tap windows stay on it: no halo exchange between neighbouring devices.
  assert "collective-permute" not in loss(sliced).lower(x, taps).compile().as_text()


def test_cpu_set_slices_its_convolutions_for_the_devices():
  cpu = kernel_sets.for_platform("cpu", "cpu", batch_shards=8)
  want = conv.BatchSlices(cpu_kernels.CONV_SLICE_BYTES, shards=8)
  assert cpu.taps_conv.keywords["slices"] == want
  kernel = jax.ShapeDtypeStruct((3, 3, 144, 144), jnp.float32)
  # 32x32x144 activations, 590 KB per image: 64 images per device leave the cache.
  for conv_fn, batch in (
    (cpu.conv_general_dilated, 512),
    (cpu_kernels.CPU.conv_general_dilated, 64),
  ):
    x = jax.ShapeDtypeStruct((batch, 32, 32, 144), jnp.float32)
    fn = lambda x, w, conv_fn=conv_fn: conv_fn(x, w, (1, 1), "SAME", dimension_numbers=NHWC)
    assert "scan[" in str(jax.make_jaxpr(fn)(x, kernel))
  assert kernel_sets.for_platform("xla", "cpu").conv_general_dilated is jax.lax.conv_general_dilated
