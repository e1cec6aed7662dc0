"""The image ops the jitted steps run on the device: uint8 stored-size crops -> model input.

When the host ships CIFAR crops as uint8 at their stored size (configlib.device_resize_from),
the steps finish the pipeline: [0, 1] floats, bilinear resizing to config.image_size (the
host's tf.image.resize, half-pixel centres, antialiased when shrinking as the host is) and the
per-channel normalisation. Images that arrive as floats were finished on the host and pass
through unchanged.

With config.data.pipeline="device" the augmentation runs here too (`make_augment`): the CIFAR
pad-4 random crop and horizontal flip of preprocess.pad_crop_flip, on uint8 images, with the same
distribution (crop offsets uniform in [0, 2 * pad], flip with probability 1/2) drawn from
jax.random instead of TensorFlow's stateless ops.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from vitboot_jax import configlib

CIFAR_PAD = 4  # preprocess.CIFAR_PAD, without importing TensorFlow.


def make_prepare(config: ml_collections.ConfigDict) -> Callable[[jax.Array], jax.Array]:
  """`prepare(images)`: uint8 [B, s, s, 3] -> normalised float32 [B, S, S, 3]; floats as is."""
  size = int(config.image_size)
  mean, std = configlib.NORMALISATION[config.data.normalisation]

  def prepare(images: jax.Array) -> jax.Array:
    if images.dtype != jnp.uint8:
      return images
    x = images.astype(jnp.float32) / 255.0
    if x.shape[1:3] != (size, size):
      shrink = x.shape[1] > size or x.shape[2] > size  # Static: a Python decision per shape.
      x = jax.image.resize(x, (x.shape[0], size, size, x.shape[3]), "bilinear", antialias=shrink)
    return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)

  return prepare


def pad_crop_flip(image: jax.Array, key: jax.Array, pad: int = CIFAR_PAD) -> jax.Array:
  """The CIFAR augmentation of one uint8 [H, W, 3] image: zero-pad `pad`, random crop back to
  [H, W], random horizontal flip (preprocess.pad_crop_flip's distribution)."""
  crop_key, flip_key = jax.random.split(key)
  height, width, channels = image.shape
  top, left = jax.random.randint(crop_key, [2], 0, 2 * pad + 1)
  padded = jnp.pad(image, [(pad, pad), (pad, pad), (0, 0)])
  crop = jax.lax.dynamic_slice(padded, (top, left, 0), (height, width, channels))
  return jnp.where(jax.random.bernoulli(flip_key), crop[:, ::-1], crop)


def make_augment(config: ml_collections.ConfigDict) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """`augment(images, keys)`: uint8 [B, H, W, 3] and one key per image -> uint8 [B, H, W, 3]."""
  kind = config.data.augment
  if kind == "cifar":
    return jax.vmap(pad_crop_flip)
  if kind == "none":
    return lambda images, keys: images
  raise ValueError(f"config.data.augment={kind!r} has no device implementation")


def shipped_image(config: ml_collections.ConfigDict) -> tuple[tuple[int, int, int], jnp.dtype]:
  """(shape, dtype) of one image as the host pipelines deliver it to the steps."""
  stored = configlib.device_resize_from(config)
  if stored:
    return (stored, stored, 3), jnp.dtype(jnp.uint8)
  return (config.image_size, config.image_size, 3), jnp.dtype(jnp.float32)
