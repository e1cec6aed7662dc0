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
