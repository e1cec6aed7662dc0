"""Loss terms of Bootstrapping ViTs: cross-entropy, mutual KD and adaptive feature supervision.

Pure functions on arrays, so `steps.py` can weight and combine them freely and tests can check each
against a plain numpy reference. Everything is computed in float32 whatever the compute dtype,
because these are small reductions whose rounding would otherwise leak into the gradients.
Teacher inputs are wrapped in `stop_gradient` here, not by callers, so no call site can forget it
(docs/reference/official_pytorch_code.md §3: the official code detaches the teacher in KD and in
the hint loss).
With the field's recipe (data/recipe_augment.py) every model of a step sees the one augmented,
mixed batch, so KD's teacher logits and the hint's agent map are the teacher's on those same images
(Beyer et al. 2022's consistent teaching); only the cross-entropy reads the mixed targets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax

from vitboot_jax.models.choices import hinted_layers


def cross_entropy(
  logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None
) -> jax.Array:
  """Softmax cross-entropy with integer labels, averaged over the (weighted) batch.

  `weights` is a 0/1 mask for padded examples (exact eval pads the last batch); the weighted mean
  divides by max(sum(weights), 1) so an all-padding shard gives 0 instead of NaN.
  """
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  if weights is None:
    return jnp.mean(nll)
  weights = weights.astype(jnp.float32)
  return jnp.sum(weights * nll) / jnp.maximum(jnp.sum(weights), 1.0)


def soft_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Cross-entropy with probability targets [B, classes] (smoothed or mixed labels), batch mean."""
  return jnp.mean(optax.softmax_cross_entropy(logits.astype(jnp.float32), targets))


def kd(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float) -> jax.Array:
  """Hinton KD: T^2 * KL(p_teacher || p_student) at temperature T, "batchmean" as in the official.

  The T^2 factor keeps the gradient scale independent of T (Hinton et al. 2015).
  """
  t = temperature
  teacher = jax.lax.stop_gradient(teacher_logits).astype(jnp.float32)
  log_p_t = jax.nn.log_softmax(teacher / t, axis=-1)
  log_p_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / t, axis=-1)
  kl = jnp.sum(jnp.exp(log_p_t) * (log_p_t - log_p_s), axis=-1)
  return (t * t) * jnp.mean(kl)


def _pool_seq1d(x: jax.Array, n_out: int) -> jax.Array:
  """Average-pools [B, n, D] along the flattened token axis with kernel = stride = n / n_out."""
  b, n, d = x.shape
  return x.reshape(b, n_out, n // n_out, d).mean(axis=2)


def _pool_grid2d(x: jax.Array, grid_in: tuple[int, int], grid_out: tuple[int, int]) -> jax.Array:
  """Average-pools a row-major token sequence [B, h*w, D] on its 2-D grid to `grid_out`."""
  (h, w), (ho, wo) = grid_in, grid_out
  b, _, d = x.shape
  x = x.reshape(b, ho, h // ho, wo, w // wo, d).mean(axis=(2, 4))
  return x.reshape(b, ho * wo, d)


def adapt_tokens(
  vit: jax.Array, agent: jax.Array, agent_grid: tuple[int, int], adapt: str
) -> tuple[jax.Array, jax.Array]:
  """Brings both token sequences to the same length by pooling the longer one."""
  n_vit, n_agent = vit.shape[1], agent.shape[1]
  if adapt == "seq1d":
    if n_vit == n_agent:
      return vit, agent
    n_long, n_short = max(n_vit, n_agent), min(n_vit, n_agent)
    if n_long % n_short:
      raise ValueError(
        f"feature_loss(adapt='seq1d'): {n_long} tokens cannot be 1-D pooled to {n_short} "
        "(the ratio must be an integer)"
      )
    if n_vit > n_agent:
      return _pool_seq1d(vit, n_agent), agent
    return vit, _pool_seq1d(agent, n_vit)
  # "pool2d": configlib.validate checked the config's choice.
  side = math.isqrt(n_vit)
  if side * side != n_vit:
    raise ValueError(f"feature_loss(adapt='pool2d'): {n_vit} ViT tokens do not form a square grid")
  vit_grid = (side, side)
  if vit_grid == agent_grid:
    return vit, agent
  # Pool the side with more tokens down to the other's grid; both factors must be integers.
  if n_vit >= n_agent:
    src, dst = vit_grid, agent_grid
  else:
    src, dst = agent_grid, vit_grid
  if n_vit == n_agent or src[0] % dst[0] or src[1] % dst[1]:
    raise ValueError(
      f"feature_loss(adapt='pool2d'): a {src[0]}x{src[1]} grid cannot be average-pooled to "
      f"{dst[0]}x{dst[1]} (integer factors per axis needed)"
    )
  if n_vit > n_agent:
    return _pool_grid2d(vit, src, dst), agent
  return vit, _pool_grid2d(agent, src, dst)


def layer_norm(x: jax.Array, eps: float) -> jax.Array:
  """LayerNorm over channels with gamma=1, beta=0: the official hint LNs are never trained."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps)


def _l2_normalise(x: jax.Array) -> jax.Array:
  """Per-image L2 normalisation of the whole flattened feature; the floor avoids NaN gradients."""
  sq = jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim)), keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sq, 1e-24))


def _position_correlation(x: jax.Array, y: jax.Array, eps: float) -> jax.Array:
  """[B, D]: per image and channel, the correlation of x and y [B, N, D] over the N positions; eps
  keeps it in [-1, 1] and finite where a side does not vary (a shared token correlates 0)."""
  x = x - jnp.mean(x, axis=1, keepdims=True)
  y = y - jnp.mean(y, axis=1, keepdims=True)
  cov = jnp.mean(x * y, axis=1)
  return cov * jax.lax.rsqrt((jnp.mean(x * x, axis=1) + eps) * (jnp.mean(y * y, axis=1) + eps))


def feature_loss(
  vit_tokens: jax.Array,
  agent_map: jax.Array,
  *,
  formula: str = "official",
  adapt: str = "seq1d",
  ln_eps: float = 1e-5,
) -> jax.Array:
  """Adaptive intermediate supervision for one layer: ViT tokens pulled towards the agent's map.

  Args:
    vit_tokens: [B, 1+N, D] ViT block output with the cls token first (it has no spatial
      counterpart and is dropped); patches in row-major order.
    agent_map: [B, h, w, D] agent block output (NHWC); the teacher, so it gets no gradient.
    formula: "official" (non-affine LN on both sides, then MSE over all elements), "paper"
      (Eq. 6: squared distance of the per-image L2-normalised flattened features) or "corr" (a
      variant: 1 - the correlation over positions, per image and channel; a token shared by all
      positions of an image earns nothing, where the MSE forms reward the image's mean target).
    adapt: "seq1d" (official: 1-D average pooling of the longer flattened sequence, which does not
      preserve 2-D neighbourhoods) or "pool2d" (2-D average pooling on the token grid, AP-2D).
    ln_eps: epsilon of the official hint LayerNorms.

  Returns:
    A float32 scalar.
  """
  if vit_tokens.ndim != 3 or agent_map.ndim != 4:
    raise ValueError(
      f"feature_loss expects vit_tokens [B, 1+N, D] and agent_map [B, h, w, D]; got "
      f"{vit_tokens.shape} and {agent_map.shape}"
    )
  if vit_tokens.shape[-1] != agent_map.shape[-1]:
    raise ValueError(
      f"feature_loss: ViT width {vit_tokens.shape[-1]} != agent width {agent_map.shape[-1]}"
    )
  b, h, w, d = agent_map.shape
  vit = vit_tokens[:, 1:].astype(jnp.float32)
  agent = jax.lax.stop_gradient(agent_map).astype(jnp.float32).reshape(b, h * w, d)
  vit, agent = adapt_tokens(vit, agent, (h, w), adapt)
  if formula == "official":
    return jnp.mean(jnp.square(layer_norm(vit, ln_eps) - layer_norm(agent, ln_eps)))
  if formula == "paper":
    diff = _l2_normalise(agent) - _l2_normalise(vit)
    return jnp.mean(jnp.sum(jnp.square(diff), axis=(1, 2)))
  # "corr": configlib.validate checked the config's choice.
  return jnp.mean(1.0 - _position_correlation(vit, agent, ln_eps))


def resample_to_grid(x: jax.Array, grid: tuple[int, int]) -> jax.Array:
  """A teacher's map [B, h, w, C] on the ViT's token grid: average-pooled by integer factors
  (what pool2d does), else resized bilinearly (a smaller map, or a factor that does not divide)."""
  b, h, w, c = x.shape
  ho, wo = grid
  if (h, w) == (ho, wo):
    return x
  if h % ho == 0 and w % wo == 0:
    return x.reshape(b, ho, h // ho, wo, w // wo, c).mean(axis=(2, 4))
  return jax.image.resize(x, (b, ho, wo, c), method="linear", antialias=True)


def feature_losses(
  vit_features: Sequence[jax.Array],
  agent_features: Sequence[jax.Array],
  *,
  last: int = 0,
  projectors: dict[str, dict[str, jax.Array]] | None = None,
  pairs: Sequence[tuple[int, int]] | None = None,
  **kwargs,
) -> tuple[jax.Array, dict[int, jax.Array]]:
  """Sums `feature_loss` over index-paired layers (l with l), as the official code (not a mean).

  Variants (off by default): `last` k > 0 pairs only the last k layers; `projectors`
  ({"layer_<l>": {"kernel", "bias"}}) maps layer l's ViT tokens linearly before the loss (FitNets'
  regressor; the official code has none), to the teacher's width where that differs; `pairs`
  ((t, l), ...) lets teacher map t feed ViT layer l instead of the index pairing, each map first
  resampled to the ViT's token grid (a CNN teacher's stages, config.loss.hint_pairs).

  Returns the total and the per-layer values by (ViT) layer index (for logging).
  """
  if pairs is None:
    if len(vit_features) != len(agent_features):
      raise ValueError(
        f"feature_losses: {len(vit_features)} ViT layers but {len(agent_features)} agent layers; "
        "layers are paired by index"
      )
    pairs = [(layer, layer) for layer in hinted_layers(len(vit_features), last)]
    teacher_maps = agent_features
  else:
    side = math.isqrt(vit_features[0].shape[1] - 1)  # The tokens after cls form a square grid.
    teacher_maps = {t: resample_to_grid(agent_features[t], (side, side)) for t, _ in pairs}
  per_layer = {}
  for teacher, layer in pairs:
    vit = vit_features[layer]
    if projectors is not None and f"layer_{layer}" in projectors:
      p = projectors[f"layer_{layer}"]
      vit = vit.astype(jnp.float32) @ p["kernel"] + p["bias"]
    per_layer[layer] = feature_loss(vit, teacher_maps[teacher], **kwargs)
  total = sum(per_layer.values(), jnp.zeros((), jnp.float32))
  return total, per_layer


def feature_weight(
  step: jax.Array | int, steps_per_epoch: int, num_epochs: int | float, per: str = "epoch"
) -> jax.Array:
  """Linear decay max(0, 1 - e/E) of the feature-loss weight
  (docs/reference/official_pytorch_code.md §3, "Decay").

  per="epoch" uses the 0-based epoch floor(step / steps_per_epoch), constant inside an epoch, so the
  last epoch still has weight 1/E (official); per="step" decays continuously; per="none" keeps the
  weight at 1 throughout (Table 4's "No Decay").
  """
  step = jnp.asarray(step)
  if per == "none":
    return jnp.ones((), jnp.float32)
  if per == "epoch":
    if jnp.issubdtype(step.dtype, jnp.integer):
      # Integer division is exact at every epoch boundary, whatever the step count.
      e = (step // steps_per_epoch).astype(jnp.float32)
    else:
      e = jnp.floor(step.astype(jnp.float32) / steps_per_epoch)
  else:  # "step": configlib.validate checked the config's choice.
    e = step.astype(jnp.float32) / steps_per_epoch
  return jnp.maximum(0.0, 1.0 - e / num_epochs)
