"""The kernels the models are built from, as one injected record, and its `XLA` set.

`XLA`: plain lax / flax ops, what GPUs and TPUs run (cuDNN convolutions, the TPU matrix and
convolution units, XLA's fused attention). 16-bit floats go through `dot_general` with
float32 accumulation (`preferred_element_type`) and jax's own derivatives. Dropout masks come
from a counter hash (models/common.py) that fuses into the select applying them: no
threefry bits written out per element.
The `cpu` set, the kernels that pay on XLA:CPU, is built from the same record in
vitboot_jax/cpu/kernels.py; vitboot_jax/kernel_sets.py picks a set for the devices a step runs on
(config.kernels). Models take the record as a field and never look at the backend. MAC counts
(models/costs.py) use `XLA`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from vitboot_jax.models import common

_HALF_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True)
class Kernels:
  """One set of kernels; every field is read while tracing.

  einsum(subscripts, a, b, out_dtype=None): a two-operand einsum, float32 sums.
  dot_general / conv_general_dilated: flax's Dense / Conv hooks.
  taps_conv(x, taps, positions, window, padding): the agent's generalised convolution, tap h
    ([C_in, C_out]) at positions[h] of a window x window kernel.
  max_pool(x, window, stride, pad), gelu(x) (exact), dropout(x, rate, key, rows, num_rows).
  attention(core, q, k, v, *, train): runs `core(q, k, v, rows=None)` -> (output, probabilities
    or None) on [B, heads, T, d]; a set may run it over slices of the batch (rows: their indices).
  softmax_attention(q, k, v): training attention without dropout on [B, heads, T, d], or None
    for `models/vit.attend` (autodiff of softmax).
  inference_softmax_attention(q, k, v): the same for evaluation, or None for `attend` (whose
    probabilities capture_intermediates can read; a fused op exposes none).
  inference_compiler_options: XLA options for compiling the steps that only run the models
    forward (evaluation), as (name, value) pairs.
  batch_shards: how many devices the batch is split over (the set's slices align with them).
  eval_batches_in_flight: evaluation batches dispatched before the oldest one's sums are
    fetched (evaluate.evaluate): the host feeds the device while it computes.
  """

  name: str
  einsum: Callable[..., jax.Array]
  dot_general: Callable[..., jax.Array]
  conv_general_dilated: Callable[..., jax.Array]
  taps_conv: Callable[..., jax.Array]
  max_pool: Callable[..., jax.Array]
  gelu: Callable[[jax.Array], jax.Array]
  dropout: Callable[..., jax.Array]
  attention: Callable[..., tuple[jax.Array, jax.Array | None]]
  softmax_attention: Callable[..., jax.Array] | None = None
  inference_softmax_attention: Callable[..., jax.Array] | None = None
  inference_compiler_options: tuple[tuple[str, Any], ...] = ()
  batch_shards: int = 1
  eval_batches_in_flight: int = 2


def _accumulator(dtype) -> Any:
  return jnp.float32 if jnp.dtype(dtype) in _HALF_FLOATS else None


def xla_einsum(subscripts: str, a: jax.Array, b: jax.Array, out_dtype=None) -> jax.Array:
  """jnp.einsum with float32 sums for 16-bit inputs, rounded to `out_dtype` (default: inputs)."""
  in_dtype = jnp.result_type(a, b)
  out_dtype = jnp.dtype(out_dtype or in_dtype)
  sums = _accumulator(in_dtype) or out_dtype
  return jnp.einsum(subscripts, a, b, preferred_element_type=sums).astype(out_dtype)


def xla_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kw):
  """lax.dot_general; 16-bit inputs accumulate in float32 and round back once."""
  in_dtype = jnp.result_type(lhs, rhs)
  if preferred_element_type is None and _accumulator(in_dtype) is not None:
    out = jax.lax.dot_general(
      lhs, rhs, dimension_numbers, precision, preferred_element_type=jnp.float32, **kw
    )
    return out.astype(in_dtype)
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type, **kw)


def assemble_kernel(taps: jax.Array, k: int, positions: Sequence[tuple[int, int]]) -> jax.Array:
  """[H, D_in, D_out] tap matrices -> [k, k, D_in, D_out] HWIO kernel, zeros elsewhere."""
  rows = jnp.array([r for r, _ in positions])
  cols = jnp.array([c for _, c in positions])
  kernel = jnp.zeros((k, k) + taps.shape[1:], taps.dtype)
  return kernel.at[rows, cols].set(taps)


def xla_taps_conv(x, taps, positions, window: int, padding) -> jax.Array:
  """The generalised convolution as one real convolution over the assembled kernel."""
  return jax.lax.conv_general_dilated(
    x,
    assemble_kernel(taps, window, positions),
    (1, 1),
    padding,
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
  )


def xla_max_pool(x: jax.Array, window: int, stride: int, pad: int) -> jax.Array:
  """NHWC max pooling with -inf padding (reduce_window, as nn.max_pool)."""
  return jax.lax.reduce_window(
    x,
    -jnp.inf,
    jax.lax.max,
    (1, window, window, 1),
    (1, stride, stride, 1),
    ((0, 0), (pad, pad), (pad, pad), (0, 0)),
  )


def xla_gelu(x: jax.Array) -> jax.Array:
  return jax.nn.gelu(x, approximate=False)


def whole_batch_attention(core, q: jax.Array, k: jax.Array, v: jax.Array, *, train: bool):
  """`core` on the whole batch: one op each, whatever the batch size."""
  del train
  return core(q, k, v)


def fused_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, implementation: str | None = None
) -> jax.Array:
  """softmax(q k^T) v on [B, heads, T, d] (q already scaled), no dropout, as one
  jax.nn.dot_product_attention: None lets jax choose (XLA's einsum-softmax-einsum with float32
  logits), "cudnn" asks for cuDNN's fused kernel (16-bit inputs only)."""
  tokens_major = lambda t: jnp.swapaxes(t, 1, 2)  # The op's [B, T, heads, d] layout.
  out = jax.nn.dot_product_attention(
    tokens_major(q), tokens_major(k), tokens_major(v), scale=1.0, implementation=implementation
  )
  return tokens_major(out)


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """`fused_attention` through cuDNN for 16-bit inputs (its only dtypes), else jax's choice."""
  half = jnp.result_type(q, k, v) in _HALF_FLOATS
  return fused_attention(q, k, v, implementation="cudnn" if half else None)


def threefry_dropout(
  x: jax.Array, rate: float, key: jax.Array, rows: jax.Array | None = None, num_rows: int = 0
) -> jax.Array:
  """Inverted dropout with nn.Dropout's threefry Bernoulli mask; no sliced masks. Not in a set:
  the baseline the hashed masks are measured against (tools/perf/kernel_ab hashed_dropout)."""
  if rows is not None:
    raise ValueError("threefry_dropout draws whole-batch masks; it does not slice attention")
  if rate == 0.0:
    return x
  if rate >= 1.0:
    return jnp.zeros_like(x)
  keep_prob = 1.0 - rate
  keep = jax.random.bernoulli(key, keep_prob, x.shape)
  return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))


XLA = Kernels(
  name="xla",
  einsum=xla_einsum,
  dot_general=xla_dot_general,
  conv_general_dilated=jax.lax.conv_general_dilated,
  taps_conv=xla_taps_conv,
  max_pool=xla_max_pool,
  gelu=xla_gelu,
  dropout=common.dropout,
  attention=whole_batch_attention,
  # Attention without dropout (evaluation; training where config.model.dropout is 0).
  softmax_attention=fused_attention,
  inference_softmax_attention=fused_attention,
)
