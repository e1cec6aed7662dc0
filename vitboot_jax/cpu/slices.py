"""Cache-sized slices of the batch, aligned with the devices it is split over: how the `cpu`
set runs attention (cpu/attention_chunks.py) and large convolutions (cpu/conv.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def images_per_slice(batch: int, per_image_bytes: int, budget: int, shards: int = 1) -> int:
  """The largest slice of `batch` whose images take at most `budget` bytes on each device.

  The slice is a multiple of `shards` when they divide the batch (data-parallel runs), so every
  slice has the same number of images on each device; one image per device at least.
  """
  shards = shards if batch % shards == 0 else 1
  local = batch // shards
  fits = [c for c in range(1, local + 1) if local % c == 0 and c * per_image_bytes <= budget]
  return max(fits, default=1) * shards


def batch_slices(x: jax.Array, images: int) -> jax.Array:
  """[B, ...] -> [B / images, images, ...]; slice i holds images i, i + n, i + 2n, ... (n =
  B / images): strided, so with the batch sharded in contiguous blocks every device holds its
  share of every slice."""
  return jnp.moveaxis(x.reshape(images, x.shape[0] // images, *x.shape[1:]), 1, 0)


def merge_batch_slices(x: jax.Array) -> jax.Array:
  """The inverse of `batch_slices`."""
  return jnp.moveaxis(x, 0, 1).reshape(-1, *x.shape[2:])
