"""The image ops the jitted steps run on the device: uint8 stored-size crops -> model input.

When the host ships CIFAR crops as uint8 at their stored size (configlib.device_resize_from),
the steps finish the pipeline: [0, 1] floats, bilinear resizing to config.image_size (the
host's tf.image.resize, half-pixel centres, antialiased when shrinking as the host is) and the
per-channel normalisation. Images that arrive as floats were finished on the host and pass
through unchanged.

With config.data.pipeline="device" the augmentation runs here too (`make_augment`), with the
distributions of tfdata_augment.py drawn from jax.random instead of TensorFlow's stateless ops: the
CIFAR pad-4 random crop and horizontal flip (tfdata_augment.pad_crop_flip) on uint8 images, and the
ImageNet random-resized-crop and flip (tfdata_augment.random_resized_crop_flip) to normalised floats
at config.image_size, each crop resized by two small matrices (no gather: one shape for every
box). Its evaluation images, uint8 at their stored size, get the recipe's eval transform here
(tfdata_augment.resize_short_centre_crop).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from vitboot_jax import configlib

# Separate seed streams, so the shuffle order and the augmentations never reuse the same numbers;
# these and the recipes' augmentation constants serve both pipelines (tfdata_augment imports them).
SHUFFLE_STREAM = 0
AUGMENT_STREAM = 1
CIFAR_PAD = 4
IMAGENET_SCALE = (0.6, 1.0)
IMAGENET_RATIO = (3.0 / 4.0, 4.0 / 3.0)
IMAGENET_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before its fallback.


def _resize(x: jax.Array, height: int, width: int) -> jax.Array:
  """tfdata_augment.resize of float [B, H, W, C]: bilinear, antialiased when shrinking."""
  if x.shape[1:3] == (height, width):
    return x
  shrink = x.shape[1] > height or x.shape[2] > width  # Static: a Python decision per shape.
  return jax.image.resize(x, (x.shape[0], height, width, x.shape[3]), "bilinear", antialias=shrink)


def _normalise(config: ml_collections.ConfigDict, x: jax.Array) -> jax.Array:
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)


def make_prepare(config: ml_collections.ConfigDict) -> Callable[[jax.Array], jax.Array]:
  """`prepare(images)`: uint8 [B, H, W, 3] -> normalised float32 [B, S, S, 3] (resized, or with
  config.data.augment="imagenet" short side resized and centre-cropped); floats as is."""
  size = int(config.image_size)

  def prepare(images: jax.Array) -> jax.Array:
    if images.dtype != jnp.uint8:
      return images
    x = images.astype(jnp.float32) / 255.0
    if config.data.augment != "imagenet":
      return _normalise(config, _resize(x, size, size))
    # tfdata_augment.resize_short_centre_crop, its sizes static: every stored image has one shape.
    height, width = x.shape[1:3]
    short_target = round(size * 256 / 224)
    long_target = math.floor(short_target * max(height, width) / min(height, width))
    new_h, new_w = (short_target, long_target) if height <= width else (long_target, short_target)
    x = _resize(x, new_h, new_w)
    top, left = round((new_h - size) / 2), round((new_w - size) / 2)
    return _normalise(config, x[:, top : top + size, left : left + size])

  return prepare


def pad_crop_flip(image: jax.Array, key: jax.Array, pad: int = CIFAR_PAD) -> jax.Array:
  """The CIFAR augmentation of one uint8 [H, W, 3] image: zero-pad `pad`, random crop back to
  [H, W], random horizontal flip (tfdata_augment.pad_crop_flip's distribution)."""
  crop_key, flip_key = jax.random.split(key)
  height, width, channels = image.shape
  top, left = jax.random.randint(crop_key, [2], 0, 2 * pad + 1)
  padded = jnp.pad(image, [(pad, pad), (pad, pad), (0, 0)])
  crop = jax.lax.dynamic_slice(padded, (top, left, 0), (height, width, channels))
  return jnp.where(jax.random.bernoulli(flip_key), crop[:, ::-1], crop)


def random_resized_crop_box(
  key: jax.Array,
  height: int,
  width: int,
  scale: tuple[float, float] = IMAGENET_SCALE,
  ratio: tuple[float, float] = IMAGENET_RATIO,
) -> jax.Array:
  """int32 [top, left, crop_height, crop_width] as tfdata_augment.random_resized_crop_box: the first
  of 10 boxes (area ~ U(scale) * H * W, log aspect ~ U(log ratio)) that fits, else the centre
  crop with the aspect ratio clamped into `ratio`."""
  area_key, ratio_key, top_key, left_key = jax.random.split(key, 4)
  h, w = jnp.float32(height), jnp.float32(width)
  area = h * w * jax.random.uniform(area_key, [IMAGENET_ATTEMPTS], minval=scale[0], maxval=scale[1])
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  aspect = jnp.exp(
    jax.random.uniform(ratio_key, [IMAGENET_ATTEMPTS], minval=log_ratio[0], maxval=log_ratio[1])
  )
  crop_w = jnp.round(jnp.sqrt(area * aspect))
  crop_h = jnp.round(jnp.sqrt(area / aspect))
  fits = (crop_w > 0) & (crop_w <= w) & (crop_h > 0) & (crop_h <= h)
  first, found = jnp.argmax(fits), fits.any()
  fallback_w = jnp.where(w / h > ratio[1], jnp.round(h * ratio[1]), w)
  fallback_h = jnp.where(w / h < ratio[0], jnp.round(w / ratio[0]), h)
  crop_h = jnp.where(found, crop_h[first], fallback_h).astype(jnp.int32)
  crop_w = jnp.where(found, crop_w[first], fallback_w).astype(jnp.int32)
  top = jnp.where(
    found, jax.random.randint(top_key, [], 0, height - crop_h + 1), (height - crop_h) // 2
  )
  left = jnp.where(
    found, jax.random.randint(left_key, [], 0, width - crop_w + 1), (width - crop_w) // 2
  )
  return jnp.stack([top, left, crop_h, crop_w]).astype(jnp.int32)


def crop_resize_weights(start: jax.Array, length: jax.Array, size: int, stored: int) -> jax.Array:
  """float32 [size, stored]: rows of [start, start + length) resized to `size` by a product.

  tf.image.resize's bilinear (triangle) kernel, widened by length / size when shrinking
  (antialias) and normalised over the crop's pixels only, as resizing the cut-out crop is.
  """
  length = length.astype(jnp.float32)
  inv_scale = length / size
  centres = start + (jnp.arange(size, dtype=jnp.float32) + 0.5) * inv_scale - 0.5
  pixels = jnp.arange(stored, dtype=jnp.float32)
  distance = jnp.abs(pixels[None, :] - centres[:, None]) / jnp.maximum(inv_scale, 1.0)
  inside = (pixels >= start) & (pixels < start + length)
  weights = jnp.where(inside[None, :], jnp.maximum(0.0, 1.0 - distance), 0.0)
  return weights / weights.sum(axis=1, keepdims=True)


def resized_crop(image: jax.Array, box: jax.Array, size: int, flip: jax.Array) -> jax.Array:
  """float [0, 1] [size, size, C] of uint8 `image`'s crop `box` (top, left, height, width),
  resized as tfdata_augment.resize and mirrored left-right where `flip`."""
  top, left, crop_h, crop_w = box[0], box[1], box[2], box[3]
  rows = crop_resize_weights(top, crop_h, size, image.shape[0])
  cols = crop_resize_weights(left, crop_w, size, image.shape[1])
  cols = jnp.where(flip, cols[::-1], cols)
  x = image.astype(jnp.float32) / 255.0
  highest = jax.lax.Precision.HIGHEST  # The host's float32 resize, not a TF32/bf16 one.
  x = jnp.einsum("yh,hwc->ywc", rows, x, precision=highest)
  return jnp.einsum("xw,ywc->yxc", cols, x, precision=highest)


def random_resized_crop_flip(image: jax.Array, key: jax.Array, size: int) -> jax.Array:
  """The ImageNet train augmentation of one uint8 [H, W, 3] image -> float [0, 1] [size, size,
  3] (tfdata_augment.random_resized_crop_flip's distribution)."""
  box_key, flip_key = jax.random.split(key)
  box = random_resized_crop_box(box_key, image.shape[0], image.shape[1])
  return resized_crop(image, box, size, jax.random.bernoulli(flip_key))


def make_augment(config: ml_collections.ConfigDict) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """`augment(images, keys)`: uint8 [B, H, W, 3] and one key per image -> uint8 [B, H, W, 3], or
  for "imagenet" normalised float32 [B, S, S, 3] (the steps' `prepare` passes floats through)."""
  kind = config.data.augment
  if kind == "cifar":
    return jax.vmap(pad_crop_flip)
  if kind == "imagenet":
    size = int(config.image_size)
    crops = jax.vmap(lambda image, key: random_resized_crop_flip(image, key, size))
    return lambda images, keys: _normalise(config, crops(images, keys))
  if kind == "none":
    return lambda images, keys: images
  raise ValueError(f"config.data.augment={kind!r} has no device implementation")


def shipped_image(config: ml_collections.ConfigDict) -> tuple[tuple[int, int, int], jnp.dtype]:
  """(shape, dtype) of one image as the host pipelines deliver it to the steps."""
  stored = configlib.device_resize_from(config)
  if stored:
    return (stored, stored, 3), jnp.dtype(jnp.uint8)
  return (config.image_size, config.image_size, 3), jnp.dtype(jnp.float32)
