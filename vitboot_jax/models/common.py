"""Initialisers and small layers shared by the ViT and the agent CNN.

The "official" initialisers reproduce the authors' PyTorch code, quirks included (reference §1.5,
§2.2): N(0, 1) patch-conv weights and N(1e-6, 1) MLP / stem biases (their `normal_(b, 1e-6)` sets
the mean, not the std). The "standard" set is the usual ViT recipe (big_vision-like).
"""

from __future__ import annotations

import math

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


def gelu(x: jax.Array) -> jax.Array:
  # Exact erf GELU, as torch.nn.GELU() (not the tanh approximation flax defaults to).
  return nn.gelu(x, approximate=False)


def dtype_of(name: str | None) -> jnp.dtype:
  return jnp.dtype(name or "float32")


class Dropout(nn.Module):
  """Inverted dropout that draws 16 random bits per element instead of 32.

  flax's nn.Dropout draws a float32 uniform (32 threefry bits) per element; at ViT scale the
  masks (attention probabilities, MLP hidden, both residuals) are the largest single cost of a
  CPU training step. Splitting each 32-bit word into two 16-bit draws makes the mask ~40%
  cheaper; the drop probability is quantised to 1/65536 (rate 0.1 -> 0.100006) and the kept
  values are scaled by the exact keep probability, so expectations are preserved.
  """

  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    threshold = min(int(round(self.rate * 65536)), 65535)
    keep_prob = 1.0 - threshold / 65536
    n = x.size
    words = jax.random.bits(self.make_rng("dropout"), ((n + 1) // 2,), jnp.uint32)
    halves = jnp.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1)[:n]
    keep = (halves >= threshold).reshape(x.shape)
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))
