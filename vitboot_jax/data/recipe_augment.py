"""The field's recipe for ViTs on small data, in the jitted step: RandAugment, random erasing,
mixup / CutMix and label smoothing (stochastic depth lives in the models: models/common.DropPath).

Values are DeiT's (Touvron et al. 2021, its main.py defaults, which timm's create_transform,
RandomErasing and Mixup implement): RandAugment "rand-m9-mstd0.5-inc1", random erasing with
probability 0.25 in 'pixel' mode, mixup alpha 0.8 and CutMix alpha 1.0 with one of them a batch
(switch probability 0.5, mixing probability 1.0), label smoothing 0.1, drop path 0.1. big_vision
and timm ship the same pieces; where a value differs, DeiT's is the one used.

Running them here gives one implementation for both input pipelines: whether the batch came
from tf.data (host-finished floats or uint8 crops) or from the dataset on the devices, the step
turns it into pixels, draws every random choice from the step's key, and so the same key gives
the same batch on both. The order is DeiT's: the crop and flip of config.data.augment (the
pipelines'), RandAugment on the pixels at config.image_size, normalisation, random erasing on
the normalised image, then mixup or CutMix of the whole batch with the targets mixed alike.

Every model of a step sees the one batch this returns (the "consistent teaching" of Beyer et al.
2022): KD targets and the hint are computed on the augmented, mixed images.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vitboot_jax import configlib
from vitboot_jax.data import randaugment, randaugment_policy

Batch = dict[str, jax.Array]

# A seed stream of the step's key apart from the models' dropout (fold_in(key, i)) and DrLoc's.
RECIPE_STREAM = 2000
ERASE_AREA = (0.02, 1.0 / 3.0)  # timm RandomErasing's min_area, max_area.
ERASE_LOG_RATIO = (math.log(0.3), math.log(1.0 / 0.3))  # min_aspect 0.3 and its inverse.
ERASE_ATTEMPTS = 10  # timm tries 10 boxes and erases nothing if none fits.


def enabled(config: ml_collections.ConfigDict) -> bool:
  """Whether any part of the recipe that acts on the batch is on (drop path is the models')."""
  return bool(
    config.data.get("randaugment", "")
    or config.data.get("random_erase", 0.0)
    or mixes(config)
    or config.loss.get("label_smoothing", 0.0)
  )


def mixes(config: ml_collections.ConfigDict) -> bool:
  mix = config.get("mix")
  return bool(mix and (mix.mixup_alpha > 0 or mix.cutmix_alpha > 0) and mix.prob > 0)


def mix_choice(key: jax.Array, mix: ml_collections.ConfigDict) -> tuple[jax.Array, jax.Array]:
  """(lam, use_cutmix) of one batch as timm's Mixup._params_per_batch: mixed with probability
  `prob` (else lam 1), by CutMix with probability `switch_prob` when both alphas are on."""
  apply_key, switch_key, mixup_key, cutmix_key = jax.random.split(key, 4)
  if mix.mixup_alpha > 0 and mix.cutmix_alpha > 0:
    use_cutmix = jax.random.bernoulli(switch_key, mix.switch_prob)
  else:
    use_cutmix = jnp.asarray(mix.cutmix_alpha > 0)
  mixup_alpha, cutmix_alpha = max(mix.mixup_alpha, 1e-6), max(mix.cutmix_alpha, 1e-6)
  lam_mixup = jax.random.beta(mixup_key, mixup_alpha, mixup_alpha)
  lam_cutmix = jax.random.beta(cutmix_key, cutmix_alpha, cutmix_alpha)
  lam = jnp.where(use_cutmix, lam_cutmix, lam_mixup)
  applied = jax.random.bernoulli(apply_key, mix.prob)
  return jnp.where(applied, lam, 1.0).astype(jnp.float32), use_cutmix & applied


def cutmix_box(key: jax.Array, lam: jax.Array, height: int, width: int) -> jax.Array:
  """int32 [top, bottom, left, right] as timm's rand_bbox: a box of side sqrt(1 - lam) of the
  image's (truncated), centred uniformly on the image and clipped to it."""
  cut = jnp.sqrt(1.0 - lam)
  cut_h = jnp.floor(height * cut).astype(jnp.int32)
  cut_w = jnp.floor(width * cut).astype(jnp.int32)
  cy_key, cx_key = jax.random.split(key)
  cy = jax.random.randint(cy_key, [], 0, height)
  cx = jax.random.randint(cx_key, [], 0, width)
  top, bottom = jnp.clip(cy - cut_h // 2, 0, height), jnp.clip(cy + cut_h // 2, 0, height)
  left, right = jnp.clip(cx - cut_w // 2, 0, width), jnp.clip(cx + cut_w // 2, 0, width)
  return jnp.stack([top, bottom, left, right]).astype(jnp.int32)


def _box_mask(box: jax.Array, height: int, width: int) -> jax.Array:
  """bool [H, W, 1]: inside [top, bottom) x [left, right)."""
  rows = jnp.arange(height)[:, None]
  cols = jnp.arange(width)[None, :]
  inside = (rows >= box[0]) & (rows < box[1]) & (cols >= box[2]) & (cols < box[3])
  return inside[..., None]


def mix_batch(
  images: jax.Array, targets: jax.Array, key: jax.Array, mix: ml_collections.ConfigDict
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(images, targets, lam) with the batch mixed with itself reversed, as timm's Mixup in 'batch'
  mode: one lam and one box for the whole batch, lam corrected to the box's true area (timm's
  correct_lam), the targets mixed by the same lam."""
  choice_key, box_key = jax.random.split(key)
  lam, use_cutmix = mix_choice(choice_key, mix)
  height, width = images.shape[1:3]
  flipped, flipped_targets = images[::-1], targets[::-1]
  box = cutmix_box(box_key, lam, height, width)
  area = (box[1] - box[0]) * (box[3] - box[2])
  cutmix_lam = 1.0 - area.astype(jnp.float32) / (height * width)
  cut = jnp.where(_box_mask(box, height, width)[None], flipped, images)
  blend = images * lam.astype(images.dtype) + flipped * (1.0 - lam).astype(images.dtype)
  images = jnp.where(use_cutmix, cut, blend)
  lam = jnp.where(use_cutmix, cutmix_lam, lam)
  return images, lam * targets + (1.0 - lam) * flipped_targets, lam


def erase_box(key: jax.Array, height: int, width: int) -> tuple[jax.Array, jax.Array]:
  """(int32 [top, bottom, left, right], found) as timm's RandomErasing._erase: the first of 10
  boxes (area ~ U(0.02, 1/3) of the image, log aspect ~ U(log 0.3, log 1/0.3), sides rounded)
  strictly smaller than the image, placed uniformly; found False when none fits."""
  area_key, ratio_key, top_key, left_key = jax.random.split(key, 4)
  area = (
    height
    * width
    * jax.random.uniform(area_key, [ERASE_ATTEMPTS], minval=ERASE_AREA[0], maxval=ERASE_AREA[1])
  )
  aspect = jnp.exp(
    jax.random.uniform(
      ratio_key, [ERASE_ATTEMPTS], minval=ERASE_LOG_RATIO[0], maxval=ERASE_LOG_RATIO[1]
    )
  )
  box_h = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
  box_w = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
  fits = (box_w < width) & (box_h < height)
  first, found = jnp.argmax(fits), fits.any()
  box_h, box_w = box_h[first], box_w[first]
  # Python's random.randint(0, H - h) includes both ends.
  top = jax.random.randint(top_key, [], 0, height - box_h + 1)
  left = jax.random.randint(left_key, [], 0, width - box_w + 1)
  return jnp.stack([top, top + box_h, left, left + box_w]).astype(jnp.int32), found


def random_erase(image: jax.Array, key: jax.Array, prob: float) -> jax.Array:
  """timm's RandomErasing(prob, mode='pixel', max_count=1) of one normalised [H, W, C] image:
  with probability `prob`, one box of it replaced by N(0, 1) noise per pixel and channel."""
  apply_key, box_key, noise_key = jax.random.split(key, 3)
  height, width = image.shape[:2]
  box, found = erase_box(box_key, height, width)
  erase = jax.random.bernoulli(apply_key, prob) & found
  noise = jax.random.normal(noise_key, image.shape, image.dtype)
  return jnp.where(erase & _box_mask(box, height, width), noise, image)


def targets(labels: jax.Array, num_classes: int, smoothing: float) -> jax.Array:
  """float32 [B, classes]: one-hot labels smoothed as timm's and optax's (1 - s) + s / classes on
  the label, s / classes elsewhere."""
  one_hot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  return optax.smooth_labels(one_hot, smoothing) if smoothing else one_hot


def make_batch_fn(
  config: ml_collections.ConfigDict, prepare: Callable[[jax.Array], jax.Array]
) -> Callable[[Batch, jax.Array], Batch]:
  """`batch_fn(batch, key) -> batch`: the model input of every model of the step. With the
  recipe off it is `prepare` (step_preprocess.make_prepare) alone (the official step, bit for
  bit); with it on, the images go through the recipe and the batch gains "target" (float32
  [B, classes], summing to 1), which the cross-entropies then read instead of "label"."""
  if not enabled(config):
    return lambda batch, key: {**batch, "image": prepare(batch["image"])}
  mean_values, std_values = configlib.NORMALISATION[config.data.normalisation]
  mean, std = jnp.asarray(mean_values, jnp.float32), jnp.asarray(std_values, jnp.float32)
  spec = config.data.get("randaugment", "")
  policy = randaugment_policy.parse_policy(spec) if spec else None
  fill = tuple(min(255.0, round(255.0 * m)) for m in mean_values)  # timm's img_mean, 0-255.
  erase_prob = float(config.data.get("random_erase", 0.0))

  def to_pixels(images: jax.Array) -> jax.Array:
    """The 0-255, integer-valued images RandAugment works on (uint8 levels, as PIL): prepare's
    normalised output, whatever the pipeline shipped, un-normalised and rounded."""
    return jnp.clip(jnp.round((prepare(images) * std + mean) * 255.0), 0.0, 255.0)

  augment_one = jax.vmap(lambda image, key: randaugment.randaugment(image, key, policy, fill))
  erase_one = jax.vmap(lambda image, key: random_erase(image, key, erase_prob))

  def batch_fn(batch: Batch, key: jax.Array) -> Batch:
    key = jax.random.fold_in(key, RECIPE_STREAM)
    augment_key, erase_key, mix_key = jax.random.split(key, 3)
    n = batch["image"].shape[0]
    if policy is not None:
      pixels = augment_one(to_pixels(batch["image"]), jax.random.split(augment_key, n))
      images = (pixels / 255.0 - mean) / std
    else:
      images = prepare(batch["image"])
    if erase_prob:
      images = erase_one(images, jax.random.split(erase_key, n))
    target = targets(batch["label"], config.data.num_classes, config.loss.label_smoothing)
    if mixes(config):
      images, target, _ = mix_batch(images, target, mix_key, config.mix)
    return {**batch, "image": images, "target": target}

  return batch_fn
