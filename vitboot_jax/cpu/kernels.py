"""The `cpu` kernel set: the kernels that pay on XLA:CPU (models/kernels.py has the record).

Matmuls with float32 sums that reach the bf16 kernel (cpu/matmul.py), convolutions with matmul
kernel gradients in cache-sized batch slices (cpu/conv.py), attention with a written-out softmax
backward (cpu/softmax_attention.py) in batch slices (cpu/attention_chunks.py), the erf GELU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from vitboot_jax.cpu import conv, matmul, softmax_attention
from vitboot_jax.cpu.attention_chunks import AttentionChunks
from vitboot_jax.models import common
from vitboot_jax.models.kernels import Kernels

# Training attention runs over slices of the batch whose attention matrices take at most
# train_bytes each, so logits and probabilities stay in cache from forward to backward; a small
# batch's attention is cheaper in one op than in slices recomputed in backward; evaluation keeps
# no backward, so larger slices pay (docs/performance.md).
ATTENTION = AttentionChunks(
  train_bytes=3 * 2**20, whole_batch_bytes=6 * 2**20, inference_bytes=24 * 2**20
)
# XLA:CPU's convolutions slow down once a batch's activations leave the cache.
CONV_SLICE_BYTES = 8 * 2**20


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@jax.custom_jvp
def gelu(x: jax.Array) -> jax.Array:
  """Exact GELU x * Phi(x), written as torch.nn.GELU() writes it: 0.5 x (1 + erf(x / sqrt 2)).

  Not the tanh approximation flax defaults to. jax's exact form goes through erfc, which
  XLA:CPU evaluates slower than erf (an exp plus a wider polynomial); the erf form differs
  from the exact value by at most 1e-6 in float32 (erfc form: 4e-7). The derivative
  Phi(x) + x phi(x) is written out so forward and backward share Phi instead of
  differentiating through erf's polynomial.
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * _SQRT_HALF))


@gelu.defjvp
def _gelu_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  cdf = 0.5 * (1.0 + jax.lax.erf(x * _SQRT_HALF))
  pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
  return x * cdf, (cdf + x * pdf) * dx


def taps_conv(
  x, taps, positions, window: int, padding, slices: conv.BatchSlices = conv.NO_SLICES
) -> jax.Array:
  return conv.taps_conv_matmul_grad(x, taps, positions, window, padding=padding, slices=slices)


def for_shards(shards: int = 1) -> Kernels:
  """The cpu set for a batch split over `shards` devices (its slices align with them)."""
  slices = conv.BatchSlices(CONV_SLICE_BYTES, shards)
  return Kernels(
    name="cpu",
    einsum=matmul.einsum,
    dot_general=matmul.dot_general,
    conv_general_dilated=conv.sliced_conv_hook(slices),
    taps_conv=functools.partial(taps_conv, slices=slices),
    max_pool=conv.max_pool,
    gelu=gelu,
    dropout=common.dropout,
    attention=dataclasses.replace(ATTENTION, shards=shards),
    softmax_attention=softmax_attention.softmax_attention,
    # XLA:CPU's YNNPACK fusions run the forward pass's batched attention products and the
    # agent's convolution blocks slower than its other emitters (training steps: no difference).
    inference_compiler_options=(("xla_cpu_experimental_ynn_fusion_type", ""),),
    batch_shards=shards,
    # The host's batch work and the forward pass share the same cores: running ahead cost 1-4%.
    eval_batches_in_flight=0,
  )


CPU = for_shards(1)
