"""DrLoc: the dense relative localisation auxiliary loss (Liu et al., NeurIPS 2021).

Per image, m random pairs of cells of the final k x k token grid are fed (concatenated) to a small
MLP f that regresses (or classifies) their 2-D offset. The loss teaches each token where it sits,
which a ViT trained on a small data set otherwise learns slowly (reference §A).

Pipeline, all pure functions usable under `jax.jit` (shapes are static):

  grid = pool_grid(tokens_to_grid(tokens))       # [B, k, k, d]; or a CNN NHWC map as is
  loss = drloc_loss(head, head_params, grid, rng) # scalar, mean over B * m pairs
  total = ce + lam * loss                         # lam applied by the caller (DEFAULT_LAMBDA)

Conventions follow the released code (reference §A.2, §D.4): unnormalised absolute offsets
|Delta| in {0..k-1} and mean reduction, which is what its lambda values were tuned with.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from vitboot_jax.models import common

# m: pairs per image (paper §5.1 Tab. 2a and the code's argparse default; `config.py`'s 32 is
# overridden).
DEFAULT_NUM_PAIRS = 64
# Hidden width of f (paper Supp. F Tab. 15/16: 512 beat 256 and 1024).
DEFAULT_HIDDEN = 512
# lambda in L_tot = L_ce + lambda * L_drloc, per architecture (paper §4 and Supp. C). These were
# tuned with the code's unnormalised targets (normalize="none"); with "paper" targets the L1 loss
# is k times smaller. ResNet is not stated in the paper. Our plain ViT is closest to "vit".
DEFAULT_LAMBDA = {"swin": 0.5, "t2t": 0.1, "cvt": 0.1, "vit": 0.01}
# alpha of the "reg" variant (paper Eq. 6; code `lambda_var`).
REG_ALPHA = 1e-3
# Added to sigma^2 before the log / division in "reg", as the code's EPSILON.
REG_EPS = 1e-8
# Grids at least this large are pooled under pool_grid(mode="auto") (14x14 -> 7x7, reference §A.6).
AUTO_POOL_MIN_SIZE = 14

VARIANTS = ("l1", "ce", "reg")
NORMALIZATIONS = ("none", "code", "paper")


# ---------------------------------------------------------------------------------------------
# Grid extraction (reference §A.6)


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
  if mode == "auto":
    while min(grid.shape[1], grid.shape[2]) >= min_size:
      grid = _pool_once(grid)
    return grid
  raise ValueError(f"drloc pool mode {mode!r} is unknown; choose 'auto', 'always' or 'none'")


# ---------------------------------------------------------------------------------------------
# Sampling and targets (reference §A.1, §A.2)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def sample_pairs(
  rng: jax.Array, batch: int, grid_size: int, num_pairs: int = DEFAULT_NUM_PAIRS
) -> tuple[jax.Array, jax.Array]:
  """Returns p1, p2: int32 [batch, num_pairs, 2] (row, col), uniform in [0, k), independent.

  As the official `randn_sampling`: with replacement, pairs may coincide, not restricted to
  neighbours. Pass a fresh rng every step (e.g. fold_in(rng, step)).
  """
  k1, k2 = jax.random.split(rng)
  shape = (batch, num_pairs, 2)
  p1 = jax.random.randint(k1, shape, 0, grid_size, dtype=jnp.int32)
  p2 = jax.random.randint(k2, shape, 0, grid_size, dtype=jnp.int32)
  return p1, p2


def gather(grid: jax.Array, pos: jax.Array) -> jax.Array:
  """[B, k, k, D] grid, [B, m, 2] (row, col) -> [B, m, D] embeddings at those cells."""
  b, h, w, d = grid.shape
  flat = (pos[..., 0] * w + pos[..., 1])[..., None]  # Row-major, as the token sequence.
  return jnp.take_along_axis(grid.reshape(b, h * w, d), flat, axis=1)


def targets(
  p1: jax.Array, p2: jax.Array, grid_size: int, *, use_abs: bool = True, normalize: str = "none"
) -> jax.Array:
  """Float32 [B, m, 2] regression targets for Delta = p1 - p2.

  use_abs: |Delta| (paper Eq. 1, "drloc"); else signed (Eq. 3, "drloc*").
  normalize: "none" = the released code's default (|Delta| in {0..k-1}, or Delta + (k-1) in
  {0..2k-2}); "code" = those divided by (k-1), resp. 2(k-1), into [0, 1]; "paper" = Eq. 1 / 3,
  |Delta|/k in [0, 1) resp. Delta/k in (-1, 1).
  """
  k = grid_size
  delta = (p1 - p2).astype(jnp.float32)
  if normalize == "paper":
    return (jnp.abs(delta) if use_abs else delta) / k
  if normalize not in ("none", "code"):
    raise ValueError(f"drloc normalize={normalize!r} is unknown; choose one of {NORMALIZATIONS}")
  t = jnp.abs(delta) if use_abs else delta + (k - 1)
  if normalize == "code":
    t = t / max(1, (k - 1) if use_abs else 2 * (k - 1))
  return t


def num_offset_classes(grid_size: int, use_abs: bool = True) -> int:
  """Classes of one axis for "ce"/"reg": k values of |Delta|, or 2k-1 signed ones.

  (The paper's "2k+1" over-counts; the code's out_dim = k gives k or 2k-1.)
  """
  return grid_size if use_abs else 2 * grid_size - 1


def class_targets(
  p1: jax.Array, p2: jax.Array, grid_size: int, *, use_abs: bool = True
) -> jax.Array:
  """Int32 [B, m, 2] class ids in [0, num_offset_classes): |Delta| or Delta + (k-1)."""
  delta = p1 - p2
  return (jnp.abs(delta) if use_abs else delta + (grid_size - 1)).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# The localisation MLP f (reference §A.3)


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
    if self.variant not in VARIANTS:
      raise ValueError(f"drloc variant {self.variant!r} is unknown; choose one of {VARIANTS}")
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


# ---------------------------------------------------------------------------------------------
# Losses (reference §A.4)


def _reg_loss(logits: jax.Array, labels: jax.Array, alpha: float) -> jax.Array:
  # Per axis: (c - mu)^2 / var + alpha * log var, var = sigma^2 + eps, over class ids 0..C-1
  # (the code's `variance_aware_regression`; the shift of C cancels in c - mu). Note: log var
  # = 2 log sigma, so the paper's alpha * log sigma is alpha / 2 here.
  p = jax.nn.softmax(logits, axis=-1)
  classes = jnp.arange(logits.shape[-1], dtype=jnp.float32)
  mu = jnp.sum(p * classes, axis=-1)
  var = jnp.sum(p * (classes - mu[..., None]) ** 2, axis=-1) + REG_EPS
  per_axis = (labels.astype(jnp.float32) - mu) ** 2 / var + alpha * jnp.log(var)
  return jnp.sum(jnp.mean(per_axis.reshape(-1, 2), axis=0))


def drloc_loss_from_pairs(
  head: DrLocHead,
  params: Any,
  grid: jax.Array,
  p1: jax.Array,
  p2: jax.Array,
  *,
  use_abs: bool = True,
  normalize: str = "none",
  reg_alpha: float = REG_ALPHA,
) -> jax.Array:
  """L_drloc of `grid` [B, k, k, D] for given pairs p1, p2 [B, m, 2]; a float32 scalar.

  "l1": mean |t - d| over B * m * 2 (the code's F.l1_loss; the paper's sum over the batch is a
  constant factor away). "ce": mean CE(u) + mean CE(v). "reg": see `_reg_loss`.
  """
  b, h, w, _ = grid.shape
  if h != w:
    raise ValueError(f"DrLoc needs a square grid, got {h}x{w}")
  if head.variant != "l1" and head.num_classes != num_offset_classes(h, use_abs):
    raise ValueError(
      f"DrLocHead has {head.num_classes} classes but a {h}x{h} grid with use_abs={use_abs} "
      f"needs {num_offset_classes(h, use_abs)}; build it with "
      f"make_head({head.variant!r}, grid_size={h}, use_abs={use_abs})"
    )
  pred = head.apply({"params": params}, gather(grid, p1), gather(grid, p2))
  if head.variant == "l1":
    t = targets(p1, p2, h, use_abs=use_abs, normalize=normalize)
    return jnp.mean(jnp.abs(pred - t))
  labels = class_targets(p1, p2, h, use_abs=use_abs)
  if head.variant == "ce":
    ce = optax.softmax_cross_entropy_with_integer_labels(pred, labels)  # [B, m, 2]
    return jnp.sum(jnp.mean(ce.reshape(-1, 2), axis=0))
  return _reg_loss(pred, labels, reg_alpha)


def drloc_loss(
  head: DrLocHead,
  params: Any,
  grid: jax.Array,
  rng: jax.Array,
  *,
  num_pairs: int = DEFAULT_NUM_PAIRS,
  use_abs: bool = True,
  normalize: str = "none",
  reg_alpha: float = REG_ALPHA,
) -> jax.Array:
  """L_drloc (before lambda) of one NHWC grid with `num_pairs` fresh pairs drawn from `rng`.

  The grid is used as given: pool ViT grids first (pool_grid). A CNN's final NHWC map works
  unchanged. Default = the paper's "drloc" with the code's unnormalised targets.
  """
  p1, p2 = sample_pairs(rng, grid.shape[0], grid.shape[1], num_pairs)
  return drloc_loss_from_pairs(
    head, params, grid, p1, p2, use_abs=use_abs, normalize=normalize, reg_alpha=reg_alpha
  )
