"""The DrLoc head: the token grid it reads and the localisation MLP f (Liu et al., NeurIPS 2021).

Per image, pairs of cells of the final k x k token grid are fed (concatenated) to a small MLP f
that regresses (or classifies) their 2-D offset. This file holds what is part of the model: the
grid a model's block output gives (`tokens_to_grid`, `pool_grid`), the head f and its params.
Sampling pairs and the loss on f's predictions are in vitboot_jax/method/drloc.py, with the other
loss terms.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from vitboot_jax.models import common

# Hidden width of f (paper Supp. F Tab. 15/16: 512 beat 256 and 1024).
DEFAULT_HIDDEN = 512
# Grids at least this large are pooled under pool_grid(mode="auto") (14x14 -> 7x7).
AUTO_POOL_MIN_SIZE = 14


# ---------------------------------------------------------------------------------------------
# The grid f reads.


def tokens_to_grid(
  tokens: jax.Array, *, has_cls: bool = True, grid_hw: tuple[int, int] | None = None
) -> jax.Array:
  """[B, (1+)N, D] token sequence -> [B, h, w, D] grid in row-major patch order.

  The cls token (index 0) carries no position, so it never enters the localisation task.
  """
  if has_cls:
    tokens = tokens[:, 1:]
  b, n, d = tokens.shape
  if grid_hw is None:
    side = math.isqrt(n)
    if side * side != n:
      raise ValueError(f"{n} patch tokens do not form a square grid; pass grid_hw")
    grid_hw = (side, side)
  h, w = grid_hw
  if h * w != n:
    raise ValueError(f"grid_hw={grid_hw} does not hold {n} patch tokens")
  return tokens.reshape(b, h, w, d)


def _pool_once(grid: jax.Array) -> jax.Array:
  # The code's AvgPool2d(3, stride=2, padding=1, count_include_pad=False): 14 -> 7, 16 -> 8.
  return nn.avg_pool(
    grid, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), count_include_pad=False
  )


def pool_grid(
  grid: jax.Array, mode: str = "auto", *, min_size: int = AUTO_POOL_MIN_SIZE
) -> jax.Array:
  """Parameter-free pooling of an NHWC grid on the DrLoc branch only.

  Finer grids made L_drloc converge very slowly (paper §4.1), so "auto" halves the grid while
  its side is >= `min_size` (14 -> 7, 16 -> 8, 8 stays 8). "always" halves once; "none" skips.
  """
  if mode == "none":
    return grid
  if mode == "always":
    return _pool_once(grid)
  # "auto": configlib.validate checked the config's choice.
  while min(grid.shape[1], grid.shape[2]) >= min_size:
    grid = _pool_once(grid)
  return grid


@dataclasses.dataclass(frozen=True)
class DrLocSetting:
  """The DrLoc task of one model: its head, the block whose output it reads, and its pooling."""

  head: DrLocHead
  layer: int
  is_vit: bool
  pool: str = "auto"

  def grid(self, out: dict[str, Any]) -> jax.Array:
    """The float32 [B, k, k, D] grid of a forward's `out` that the head reads."""
    grid = out["features"][self.layer]
    if self.is_vit:
      grid = tokens_to_grid(grid)
    return pool_grid(grid, self.pool).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# The localisation MLP f.


def num_offset_classes(grid_size: int, use_abs: bool = True) -> int:
  """Classes of one axis for "ce"/"reg": k values of |Delta|, or 2k-1 signed ones.

  (The paper's "2k+1" over-counts; the code's out_dim = k gives k or 2k-1.)
  """
  return grid_size if use_abs else 2 * grid_size - 1


class DrLocHead(nn.Module):
  """f([e_p1, e_p2]): Dense-ReLU-Dense-ReLU-Dense on the concatenated pair embeddings.

  "l1": 2 outputs (d_u, d_v), no output nonlinearity. "ce"/"reg": as the released code, a third
  512 -> 512 layer (no ReLU) then two unshared Dense(num_classes) heads; returns logits
  [..., 2, C] (axis -2 = u, v); the softmax lives in the loss. Initialisers are PyTorch's
  nn.Linear default, as the official module.
  """

  variant: str = "l1"
  num_classes: int | None = None
  hidden: int = DEFAULT_HIDDEN
  dtype: Any = jnp.float32

  def _dense(self, features: int, fan_in: int, name: str) -> nn.Dense:
    init = common.torch_linear_default(fan_in)
    return nn.Dense(features, kernel_init=init, bias_init=init, dtype=self.dtype, name=name)

  @nn.compact
  def __call__(self, e1: jax.Array, e2: jax.Array) -> jax.Array:
    x = jnp.concatenate([e1, e2], axis=-1)
    h = self.hidden
    x = nn.relu(self._dense(h, x.shape[-1], "fc1")(x))
    x = nn.relu(self._dense(h, h, "fc2")(x))
    if self.variant == "l1":
      return self._dense(2, h, "out")(x).astype(jnp.float32)
    if not self.num_classes:
      raise ValueError(f"drloc variant {self.variant!r} needs num_classes (num_offset_classes)")
    x = self._dense(h, h, "fc3")(x)
    u = self._dense(self.num_classes, h, "out_u")(x)
    v = self._dense(self.num_classes, h, "out_v")(x)
    return jnp.stack([u, v], axis=-2).astype(jnp.float32)


def make_head(
  variant: str = "l1",
  grid_size: int | None = None,
  *,
  use_abs: bool = True,
  hidden: int = DEFAULT_HIDDEN,
  dtype: Any = jnp.float32,
) -> DrLocHead:
  """A DrLocHead whose class count matches the (pooled) grid for "ce"/"reg"."""
  num_classes = None
  if variant in ("ce", "reg"):
    if grid_size is None:
      raise ValueError(f"drloc variant {variant!r} needs the grid size for its class count")
    num_classes = num_offset_classes(grid_size, use_abs)
  return DrLocHead(variant=variant, num_classes=num_classes, hidden=hidden, dtype=dtype)


def init_head(head: DrLocHead, rng: jax.Array, embed_dim: int) -> Any:
  """The head's params for embeddings of width `embed_dim` (independent of B, m and k)."""
  dummy = jnp.zeros((1, 1, embed_dim), jnp.float32)
  return _jit_init(head, rng, dummy)["params"]


# One compiled init per head configuration (modules are hashable) instead of dozens of eagerly
# dispatched ops on every call.
_jit_init = jax.jit(lambda head, rng, x: head.init(rng, x, x), static_argnums=0)
