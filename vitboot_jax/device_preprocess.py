"""The image ops the jitted steps run on the device: uint8 stored-size crops -> model input.

When the host ships CIFAR crops as uint8 at their stored size (configlib.device_resize_from),
the steps finish the pipeline: [0, 1] floats, bilinear up-sampling to config.image_size (the
host's tf.image.resize, half-pixel centres) and the per-channel normalisation. Images that
arrive as floats were finished on the host and pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from vitboot_jax import configlib


def make_prepare(config: ml_collections.ConfigDict) -> Callable[[jax.Array], jax.Array]:
  """`prepare(images)`: uint8 [B, s, s, 3] -> normalised float32 [B, S, S, 3]; floats as is."""
  size = int(config.image_size)
  mean, std = configlib.NORMALISATION[config.data.normalisation]

  def prepare(images: jax.Array) -> jax.Array:
    if images.dtype != jnp.uint8:
      return images
    x = images.astype(jnp.float32) / 255.0
    if x.shape[1:3] != (size, size):
      x = jax.image.resize(x, (x.shape[0], size, size, x.shape[3]), "bilinear", antialias=False)
    return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)

  return prepare


def shipped_image(config: ml_collections.ConfigDict) -> tuple[tuple[int, int, int], jnp.dtype]:
  """(shape, dtype) of one image as the host pipelines deliver it to the steps."""
  stored = configlib.device_resize_from(config)
  if stored:
    return (stored, stored, 3), jnp.dtype(jnp.uint8)
  return (config.image_size, config.image_size, 3), jnp.dtype(jnp.float32)
