"""DrLoc: the dense relative localisation auxiliary loss (Liu et al., NeurIPS 2021).

Per image, m random pairs of cells of the final k x k token grid are fed (concatenated) to a small
MLP f that regresses (or classifies) their 2-D offset. The loss teaches each token where it sits,
which a ViT trained on a small data set otherwise learns slowly (docs/reference/related_methods.md
§A). The grid and f are
part of the model (models/drloc_head.py); this file samples the pairs and scores f's predictions.

Pipeline, all pure functions usable under `jax.jit` (shapes are static):

  grid = setting.grid(out)                        # [B, k, k, d], pooled (models/drloc_head.py)
  loss = drloc_loss(head, head_params, grid, rng) # scalar, mean over B * m pairs
  total = ce + lam * loss                         # lam applied by steps.model_loss

Conventions follow the released code (docs/reference/related_methods.md §A.2, §D.4): unnormalised
absolute offsets
|Delta| in {0..k-1} and mean reduction, which is what its lambda values were tuned with.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vitboot_jax.models.drloc_head import DrLocHead, DrLocSetting, num_offset_classes

# m: pairs per image (paper §5.1 Tab. 2a and the code's argparse default; `config.py`'s 32 is
# overridden).
DEFAULT_NUM_PAIRS = 64
# lambda in L_tot = L_ce + lambda * L_drloc, per architecture (paper §4 and Supp. C). These were
# tuned with the code's unnormalised targets (normalize="none"); with "paper" targets the L1 loss
# is k times smaller. ResNet is not stated in the paper. Our plain ViT is closest to "vit".
DEFAULT_LAMBDA = {"swin": 0.5, "t2t": 0.1, "cvt": 0.1, "vit": 0.01}
# alpha of the "reg" variant (paper Eq. 6; code `lambda_var`).
REG_ALPHA = 1e-3
# Added to sigma^2 before the log / division in "reg", as the code's EPSILON.
REG_EPS = 1e-8
# The train step draws model i's pairs from fold_in(step_rng, RNG_STREAM + i); the dropout masks
# use fold_in(step_rng, i) (ModelSet.apply), so the two never share a key.
RNG_STREAM = 1000


# ---------------------------------------------------------------------------------------------
# Sampling and targets (docs/reference/related_methods.md §A.1, §A.2)


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
  t = jnp.abs(delta) if use_abs else delta + (k - 1)
  if normalize == "code":
    t = t / max(1, (k - 1) if use_abs else 2 * (k - 1))
  return t


def class_targets(
  p1: jax.Array, p2: jax.Array, grid_size: int, *, use_abs: bool = True
) -> jax.Array:
  """Int32 [B, m, 2] class ids in [0, num_offset_classes): |Delta| or Delta + (k-1)."""
  delta = p1 - p2
  return (jnp.abs(delta) if use_abs else delta + (grid_size - 1)).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# The localisation MLP f (docs/reference/related_methods.md §A.3)


# ---------------------------------------------------------------------------------------------
# Losses (docs/reference/related_methods.md §A.4)


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


class Task(NamedTuple):
  """One model's DrLoc task in a train step: its setting, its head's params, this step's rng."""

  setting: DrLocSetting
  head_params: Any
  rng: jax.Array


def task_loss(task: Task, out: dict[str, Any], cfg: ml_collections.ConfigDict) -> jax.Array:
  """L_drloc (before lambda) of one model from its forward's `out`; `cfg` is config.drloc."""
  return drloc_loss(
    task.setting.head,
    task.head_params,
    task.setting.grid(out),
    task.rng,
    num_pairs=cfg.num_pairs,
    use_abs=cfg.use_abs,
    normalize=cfg.normalize,
  )
