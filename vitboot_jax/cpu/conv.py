"""2-D convolutions for CPUs: XLA's own convolution only where it is fast.

XLA:CPU runs a float32 convolution's forward pass and its input gradient (itself a convolution)
through Eigen well, but its kernel-gradient convolution at a fraction of the GEMM rate, and it
never uses the AMX/AVX512-BF16 matmul kernel (numbers: docs/results.md, "Throughput at 224 px",
and docs/performance.md). So float32 convolutions here run forward and input gradient as XLA
convolutions and the kernel gradient as matmuls (`conv_matmul_kernel_grad`); 16-bit ones are
matmuls throughout, which `matmul.einsum` runs on the bf16 kernel. These are the `cpu` kernel
set's (cpu/kernels.py); on GPUs and TPUs cuDNN and the TPU convolution unit beat anything
built from matmuls, so the `xla` set uses lax's.

Three shapes of matmul, by what the convolution looks like:
- non-overlapping patches (stride = kernel, no padding: the ViT patch embedding): a reshape;
- few input channels (the stems): im2col, one matmul with K = k*k*C_in;
- otherwise (the agent's CONV): one matmul per tap on a shifted view, summed in float32, so
  the taps a generalised convolution does not use (6 heads in a 3x3 window) cost nothing.

A batch too large for the cache (the agent's first block at 32x32x144: 38 MB) runs XLA's
stride-1 convolutions in batch slices (`BatchSlices`), the input gradient included.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from vitboot_jax.cpu import matmul
from vitboot_jax.cpu.slices import batch_slices, images_per_slice, merge_batch_slices
from vitboot_jax.models.kernels import assemble_kernel

# Below this many input channels a per-tap matmul is too thin for a GEMM: use im2col instead.
_IM2COL_MAX_CHANNELS = 64
# A batch input up to this many slices' bytes stays whole: slicing it measured no faster.
_WHOLE_BATCH_SLICES = 4


@dataclasses.dataclass(frozen=True)
class BatchSlices:
  """How float32 XLA convolutions split the batch (the `cpu` set's, cpu/kernels.CONV_SLICE_BYTES).

  An input batch larger than `_WHOLE_BATCH_SLICES` x `max_bytes` runs in slices of at most
  `max_bytes` per device, strided and aligned with `shards` devices as attention's slices are
  (cpu/slices.py); 0 never slices.
  """

  max_bytes: int = 0
  shards: int = 1

  def images(self, x: jax.Array) -> int:
    """Images per slice of `x` ([B, ...]); B when it stays whole."""
    batch = x.shape[0]
    per_image = math.prod(x.shape[1:]) * jnp.dtype(x.dtype).itemsize
    if not self.max_bytes or batch * per_image <= _WHOLE_BATCH_SLICES * self.max_bytes:
      return batch
    return images_per_slice(batch, per_image, self.max_bytes, self.shards)


NO_SLICES = BatchSlices()


def _pads(padding, spatial: Sequence[int], window: Sequence[int], strides: Sequence[int]):
  if isinstance(padding, str):
    return jax.lax.padtype_to_pads(spatial, window, strides, padding)
  return [tuple(p) for p in padding]


def _tap(x: jax.Array, row: int, col: int, out_hw: tuple[int, int], strides) -> jax.Array:
  """The input pixels that window position (row, col) sees, for every output pixel."""
  (ho, wo), (sh, sw) = out_hw, strides
  return jax.lax.slice(
    x,
    (0, row, col, 0),
    (x.shape[0], row + sh * (ho - 1) + 1, col + sw * (wo - 1) + 1, x.shape[3]),
    (1, sh, sw, 1),
  )


def taps_conv(
  x: jax.Array,
  taps: jax.Array,
  positions: Sequence[tuple[int, int]],
  window: int,
  strides: Sequence[int] = (1, 1),
  padding="SAME",
) -> jax.Array:
  """NHWC convolution whose kernel is `taps[h]` ([C_in, C_out]) at `positions[h]`, 0 elsewhere.

  The sum over taps is kept in float32 and rounded once, like a convolution's accumulator.
  """
  pads = _pads(padding, x.shape[1:3], (window, window), strides)
  x = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
  out_hw = tuple((x.shape[1 + i] - window) // strides[i] + 1 for i in range(2))
  total = None
  for (row, col), tap_kernel in zip(positions, taps, strict=True):
    term = matmul.einsum(
      "bhwc,cd->bhwd", _tap(x, row, col, out_hw, strides), tap_kernel, out_dtype=jnp.float32
    )
    total = term if total is None else total + term
  return total.astype(jnp.result_type(x, taps))


def conv_as_matmuls(
  x: jax.Array, kernel: jax.Array, strides: Sequence[int] = (1, 1), padding="SAME"
) -> jax.Array:
  """NHWC x HWIO convolution (no dilation, no groups) computed with matmuls only."""
  kh, kw, cin, cout = kernel.shape
  strides = tuple(strides)
  pads = _pads(padding, x.shape[1:3], (kh, kw), strides)
  if strides == (kh, kw) and all(p == (0, 0) for p in pads):
    b, h, w, _ = x.shape
    ho, wo = h // kh, w // kw
    patches = x[:, : ho * kh, : wo * kw].reshape(b, ho, kh, wo, kw, cin)
    patches = patches.transpose(0, 1, 3, 2, 4, 5).reshape(b, ho, wo, kh * kw * cin)
    return matmul.einsum("bhwk,kd->bhwd", patches, kernel.reshape(kh * kw * cin, cout))
  if cin < _IM2COL_MAX_CHANNELS:
    x = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    out_hw = tuple((x.shape[1 + i] - (kh, kw)[i]) // strides[i] + 1 for i in range(2))
    cols = [_tap(x, r, c, out_hw, strides) for r in range(kh) for c in range(kw)]
    return matmul.einsum(
      "bhwk,kd->bhwd", jnp.concatenate(cols, axis=-1), kernel.reshape(kh * kw * cin, cout)
    )
  positions = [(r, c) for r in range(kh) for c in range(kw)]
  if kh != kw:
    raise ValueError(f"conv_as_matmuls: non-square {kh}x{kw} kernels with {cin} channels")
  return taps_conv(x, kernel.reshape(kh * kw, cin, cout), positions, kh, strides, pads)


_NHWC = ("NHWC", "HWIO", "NHWC")


def _xla_conv(x: jax.Array, kernel: jax.Array, strides, pads) -> jax.Array:
  return jax.lax.conv_general_dilated(x, kernel, strides, pads, dimension_numbers=_NHWC)


def _sliced_conv(x: jax.Array, kernel: jax.Array, strides, pads, slices: BatchSlices):
  """`_xla_conv`, stride 1 in batch slices when `slices` says so."""
  images = slices.images(x)
  if tuple(strides) != (1, 1) or images == x.shape[0]:
    return _xla_conv(x, kernel, strides, pads)
  out = jax.lax.map(lambda part: _xla_conv(part, kernel, strides, pads), batch_slices(x, images))
  return merge_batch_slices(out)


def _input_grad(x, kernel, ct, strides, pads, slices: BatchSlices) -> jax.Array:
  """The input gradient of `_xla_conv`.

  Stride 1: the cotangent convolved with the flipped kernel, in/out swapped, padded k-1-pad, in
  slices like the forward pass (XLA's own transpose inside a slice loop ran at a fifth of the
  rate). Other strides: XLA's transpose of the whole-batch convolution.
  """
  back_pads = tuple((k - 1 - lo, k - 1 - hi) for k, (lo, hi) in zip(kernel.shape[:2], pads))
  if tuple(strides) == (1, 1) and min(min(p) for p in back_pads) >= 0:
    flipped = jnp.flip(kernel, (0, 1)).swapaxes(2, 3)
    return _sliced_conv(ct, flipped, (1, 1), back_pads, slices)
  return jax.vjp(lambda x: _xla_conv(x, kernel, strides, pads), x)[1](ct)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _conv_matmul_weight_grad(x, weights, strides, pads, as_kernel, weight_grad, slices):
  return _sliced_conv(x, as_kernel(weights), strides, pads, slices)


def _conv_matmul_weight_grad_fwd(x, weights, strides, pads, as_kernel, weight_grad, slices):
  out = _conv_matmul_weight_grad(x, weights, strides, pads, as_kernel, weight_grad, slices)
  return out, (x, weights)


def _conv_matmul_weight_grad_bwd(strides, pads, as_kernel, weight_grad, slices, residuals, ct):
  x, weights = residuals
  x_grad = _input_grad(x, as_kernel(weights), ct, strides, pads, slices)
  return x_grad, weight_grad(x, weights, ct, strides, pads)


_conv_matmul_weight_grad.defvjp(_conv_matmul_weight_grad_fwd, _conv_matmul_weight_grad_bwd)


def _matmuls_weight_grad(x, kernel, ct, strides, pads):
  """The kernel gradient of `conv_as_matmuls`, by autodiff of its matmuls."""
  return jax.vjp(lambda w: conv_as_matmuls(x, w, strides, pads), kernel)[1](ct)[0]


def _taps_weight_grad(x, taps, ct, strides, pads, *, positions, shards=1):
  """Tap gradients of a stride-1 `taps_conv`, one matmul per tap without copying its window.

  With the padded input and the cotangent (zero-padded to the same grid) flattened to
  [pixels, C] per batch shard, tap (r, c)'s window is the row range shifted by r * W_pad + c: a
  contiguous slice, where the per-tap view of the 4-D input was a strided copy. Rows that wrap
  into the next image row or image meet zeros of the cotangent. Flattening per shard keeps each
  window on its device (one flat axis over the sharded batch made XLA exchange halos per tap).
  """
  del strides
  (top, bottom), (left, right) = pads
  x = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
  b, hp, wp, c_in = x.shape
  _, ho, wo, c_out = ct.shape
  shards = shards if b % shards == 0 else 1
  ct = jnp.pad(ct, ((0, 0), (0, hp - ho), (0, wp - wo), (0, 0)))
  ct = ct.reshape(shards, b // shards * hp * wp, c_out)
  x = x.reshape(shards, b // shards * hp * wp, c_in)
  last = max(r * wp + c for r, c in positions)
  rows = x.shape[1] - last
  grads = [
    matmul.einsum(
      "smc,smd->cd", jax.lax.slice_in_dim(x, r * wp + c, r * wp + c + rows, axis=1), ct[:, :rows]
    )
    for r, c in positions
  ]
  return jnp.stack(grads).astype(taps.dtype)


def _identity(kernel: jax.Array) -> jax.Array:
  return kernel


def conv_matmul_kernel_grad(
  x: jax.Array,
  kernel: jax.Array,
  strides: Sequence[int] = (1, 1),
  padding="SAME",
  slices: BatchSlices = NO_SLICES,
) -> jax.Array:
  """NHWC x HWIO convolution: XLA's forward and input gradient (in batch `slices`), the kernel
  gradient as matmuls.

  16-bit floats go through `conv_as_matmuls` entirely (XLA:CPU convolves them at a low rate).
  """
  strides = tuple(strides)
  kh, kw = kernel.shape[:2]
  pads = tuple(tuple(p) for p in _pads(padding, x.shape[1:3], (kh, kw), strides))
  patches = strides == (kh, kw) and all(p == (0, 0) for p in pads)  # A reshape and one GEMM.
  if patches or jnp.result_type(x, kernel) in matmul.HALF_FLOATS:
    return conv_as_matmuls(x, kernel, strides, pads)
  return _conv_matmul_weight_grad(x, kernel, strides, pads, _identity, _matmuls_weight_grad, slices)


def taps_conv_matmul_grad(
  x: jax.Array,
  taps: jax.Array,
  positions: Sequence[tuple[int, int]],
  window: int,
  padding="SAME",
  slices: BatchSlices = NO_SLICES,
) -> jax.Array:
  """`taps_conv` (stride 1) as one XLA convolution over the assembled kernel (in batch
  `slices`); tap gradients as one matmul per tap (`_taps_weight_grad`), so the taps a
  generalised convolution leaves out cost nothing there."""
  positions = tuple(tuple(p) for p in positions)
  pads = tuple(tuple(p) for p in _pads(padding, x.shape[1:3], (window, window), (1, 1)))
  if jnp.result_type(x, taps) in matmul.HALF_FLOATS:
    return taps_conv(x, taps, positions, window, padding=pads)
  as_kernel = functools.partial(assemble_kernel, k=window, positions=positions)
  weight_grad = functools.partial(_taps_weight_grad, positions=positions, shards=slices.shards)
  return _conv_matmul_weight_grad(x, taps, (1, 1), pads, as_kernel, weight_grad, slices)


def conv_hook(plain_conv: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """A flax `conv_general_dilated=` hook that runs plain NHWC convolutions with `plain_conv`.

  Dilated, grouped or otherwise laid-out convolutions and explicit precisions go to
  lax.conv_general_dilated unchanged.
  """

  def conv_general_dilated(
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count=1,
    precision=None,
    **kw,
  ):
    plain = (
      lhs.ndim == 4
      and not any(d != 1 for d in (lhs_dilation or ()))
      and not any(d != 1 for d in (rhs_dilation or ()))
      and feature_group_count == 1
      and precision is None
      and not kw
      and jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
      == jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
    )
    if plain:
      return plain_conv(lhs, rhs, window_strides, padding)
    return jax.lax.conv_general_dilated(
      lhs,
      rhs,
      window_strides,
      padding,
      lhs_dilation=lhs_dilation,
      rhs_dilation=rhs_dilation,
      dimension_numbers=dimension_numbers,
      feature_group_count=feature_group_count,
      precision=precision,
      **kw,
    )

  return conv_general_dilated


conv_general_dilated = conv_hook(conv_matmul_kernel_grad)


def sliced_conv_hook(slices: BatchSlices) -> Callable[..., jax.Array]:
  """`conv_general_dilated` with its XLA convolutions in batch `slices`."""
  return conv_hook(functools.partial(conv_matmul_kernel_grad, slices=slices))


# Matmuls in both passes (the cpu set before XLA's forward convolution; kept for kernel A/Bs).
conv_general_dilated_matmuls = conv_hook(conv_as_matmuls)


def max_pool(x: jax.Array, window: int, stride: int, pad: int) -> jax.Array:
  """NHWC max pooling with -inf padding, as nn.max_pool, as a max over strided views.

  XLA:CPU differentiates reduce_window max with select_and_scatter over int32 window indices,
  a sizeable share of the shared step (docs/performance.md). The max of k*k strided views has an
  elementwise gradient instead. Ties (measure zero for real activations) send the
  gradient to every maximal input rather than to one.
  """
  pads = ((pad, pad), (pad, pad))
  x = jnp.pad(x, ((0, 0), *pads, (0, 0)), constant_values=-jnp.inf)
  out_hw = tuple((x.shape[1 + i] - window) // stride + 1 for i in range(2))
  views = [_tap(x, r, c, out_hw, (stride, stride)) for r in range(window) for c in range(window)]
  return functools.reduce(jnp.maximum, views)
