"""Initialisers and small layers shared by the ViT and the agent CNN.

The "official" initialisers reproduce the authors' PyTorch code, quirks included
(docs/reference/official_pytorch_code.md §1.5,
§2.2): N(0, 1) patch-conv weights and N(1e-6, 1) MLP / stem biases (their `normal_(b, 1e-6)` sets
the mean, not the std). The "standard" set is the usual ViT recipe (big_vision-like).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

Initializer = nn.initializers.Initializer

zeros = nn.initializers.zeros
xavier_uniform = nn.initializers.xavier_uniform()
lecun_normal = nn.initializers.lecun_normal()


def normal(stddev: float, mean: float = 0.0) -> Initializer:
  def init(key, shape, dtype=jnp.float32):
    return mean + stddev * jax.random.normal(key, shape, dtype)

  return init


def torch_linear_default(fan_in: int) -> Initializer:
  """PyTorch's nn.Linear default for weight and bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / math.sqrt(fan_in)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


# The official code's `nn.init.normal_(bias, 1e-6)`: mean 1e-6, std 1 (std 1e-6 was intended).
official_bias = normal(1.0, mean=1e-6)


def hash32(x: jax.Array) -> jax.Array:
  """A bijective, well-mixing 32-bit integer hash ("lowbias32": two xorshift-multiply rounds).

  Five integer ops per element against ~120 for a threefry-2x32 word: cheap enough to fuse
  into the op that applies a dropout mask instead of being a kernel of its own.
  """
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def hashed_bits(
  key: jax.Array, shape: tuple[int, ...], rows: jax.Array | None = None, num_rows: int = 0
) -> jax.Array:
  """32 random bits per element, a pure function of (key, element index).

  Two words of real (threefry) randomness from `key` seed a counter-based hash of the flat
  element index. The seed enters before and between the two hash rounds, so masks drawn from
  different keys are not shifted or permuted copies of each other (which one round of
  `hash(index ^ seed)` would give). Elementwise in the index, it shards like any elementwise op.

  `rows` ([shape[0]] integers) says which rows (axis-0 indices) of a larger [num_rows, ...]
  array this block is: the bits are then exactly those of the larger array's rows, so a
  computation done in slices draws the same mask as the whole (chunked attention).
  """
  total = math.prod(shape) if rows is None else num_rows * math.prod(shape[1:])
  if total >= 2**32:
    raise ValueError(f"hashed_bits: {total} elements overflow the 32-bit counter; split the array")
  seed = jax.random.bits(key, (2,), jnp.uint32)
  if rows is None:
    index = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  else:
    row_size = math.prod(shape[1:])
    within = jax.lax.iota(jnp.uint32, row_size).reshape(shape[1:])
    first = rows.astype(jnp.uint32).reshape((shape[0],) + (1,) * (len(shape) - 1))
    index = first * jnp.uint32(row_size) + within
  return hash32(hash32(index + seed[0]) ^ seed[1])


def dropout(
  x: jax.Array, rate: float, key: jax.Array, rows: jax.Array | None = None, num_rows: int = 0
) -> jax.Array:
  """Inverted dropout with a `hashed_bits` mask (`rows`/`num_rows`: see there)."""
  if rate == 0.0:
    return x
  if rate >= 1.0:
    return jnp.zeros_like(x)
  threshold = min(int(round(rate * 2**32)), 2**32 - 1)
  keep_prob = 1.0 - threshold / 2**32
  keep = hashed_bits(key, x.shape, rows, num_rows) >= jnp.uint32(threshold)
  return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
  """Inverted dropout through an injected mask kernel (`Kernels.dropout`; default `dropout`).

  The default draws its mask from a counter-based hash, not from threefry: flax's nn.Dropout
  draws a float32 uniform (32 threefry bits) per element, and at ViT scale those masks were the
  largest single cost of a CPU training step. `hashed_bits` costs ~10 integer ops per element
  and fuses into the select that applies the mask. The drop probability is quantised to 2^-32
  and kept values are scaled by the exact keep probability, so expectations are preserved.
  """

  rate: float
  kernel: Callable[..., jax.Array] = dropout

  def rng(self) -> jax.Array:
    """The key `__call__` would draw its mask from (for code that applies the kernel itself)."""
    return self.make_rng("dropout")

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:  # Everything dropped: no key needed.
      return jnp.zeros_like(x)
    return self.kernel(x, self.rate, self.rng())


def drop_path_rates(rate: float, depth: int) -> tuple[float, ...]:
  """Stochastic depth's per-block drop rates: 0 at the first block rising linearly to `rate` at
  the last (Huang et al. 2016; DeiT and timm's ViT schedule)."""
  if depth <= 1:
    return (float(rate),) * depth
  return tuple(float(rate) * i / (depth - 1) for i in range(depth))


class DropPath(nn.Module):
  """Stochastic depth: a residual branch dropped whole for a random subset of the batch's images
  (each with probability `rate`), the kept ones scaled by 1 / (1 - rate); identity in evaluation."""

  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    keep_prob = 1.0 - self.rate
    keep = jax.random.bernoulli(self.make_rng("dropout"), keep_prob, (x.shape[0],))
    keep = keep.reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))
