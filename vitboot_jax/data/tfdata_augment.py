"""Per-example image ops of the official pipelines (docs/reference/official_pytorch_code.md §5), as
graph-mode TensorFlow.

These run inside `tf.data` maps. Every random choice comes from a stateless op keyed by a seed that
`example_seed` derives from (config.seed, epoch, example index), so the augmented image of an
example depends on nothing else: not on thread scheduling, not on which process reads it, and not
on whether the run was resumed. The official code augments PIL images in uint8; we convert to
float before resizing (no intermediate rounding to uint8) and resize with an antialiased bilinear
filter, which is what PIL's bilinear does when it down-samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_collections

from vitboot_jax import configlib
from vitboot_jax.base import library_logs
from vitboot_jax.data.step_preprocess import (  # One definition for both pipelines.
  AUGMENT_STREAM,
  CIFAR_PAD,
  IMAGENET_ATTEMPTS,
  IMAGENET_RATIO,
  IMAGENET_SCALE,
)

tf = library_logs.import_tensorflow()  # Quietly, and off every accelerator.


TrainFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
EvalFn = Callable[[tf.Tensor], tf.Tensor]


def stream_key(seed: int, stream: int, epoch: tf.Tensor | int) -> tf.Tensor:
  """A stateless key for one epoch of one seed stream, shape [2] int64."""
  key = tf.constant([seed, stream], tf.int64)
  return tf.random.fold_in(key, tf.cast(epoch, tf.int64))


def example_seed(seed: int, epoch: tf.Tensor | int, index: tf.Tensor | int) -> tf.Tensor:
  """The augmentation seed of example `index` (its position in the split) in `epoch`."""
  return tf.random.fold_in(stream_key(seed, AUGMENT_STREAM, epoch), tf.cast(index, tf.int64))


def decode(encoded: tf.Tensor) -> tf.Tensor:
  """Decodes JPEG/PNG/GIF/BMP bytes to uint8 [H, W, 3] (grey and CMYK become RGB).

  JPEGs use the accurate integer IDCT, the one libjpeg (and so PIL) uses by default; TF's default
  fast IDCT differs by a grey level on many pixels.
  """
  image = tf.cond(
    tf.io.is_jpeg(encoded),
    lambda: tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE"),
    lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False),
  )
  image.set_shape([None, None, 3])
  return image


def to_float(image: tf.Tensor) -> tf.Tensor:
  """uint8 [0, 255] -> float32 [0, 1], as torchvision's `to_tensor`."""
  return tf.cast(image, tf.float32) / 255.0


def resize(image: tf.Tensor, height: tf.Tensor | int, width: tf.Tensor | int) -> tf.Tensor:
  """Bilinear resize of a float image; a no-op when the size already matches.

  Antialiased when shrinking (as PIL); up-sampling skips the antialias path, whose result is the
  same but several times slower on CPU (it matters for 32 -> 224 CIFAR; docs/performance.md).
  """
  shape = tf.shape(image)
  size = tf.stack([height, width])
  same = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))
  shrink = tf.logical_or(tf.less(height, shape[0]), tf.less(width, shape[1]))
  return tf.cond(
    same,
    lambda: image,
    lambda: tf.cond(
      shrink,
      lambda: tf.image.resize(image, size, method="bilinear", antialias=True),
      lambda: tf.image.resize(image, size, method="bilinear"),
    ),
  )


def normalise(image: tf.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> tf.Tensor:
  """Per-channel (x - mean) / std with the config's official constants."""
  return (image - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def pad_crop_flip(image: tf.Tensor, seed: tf.Tensor, pad: int = CIFAR_PAD) -> tf.Tensor:
  """The CIFAR augmentation: zero-pad `pad`, random crop back to the input size, random h-flip."""
  crop_seed, flip_seed = tf.unstack(tf.random.split(seed, 2))
  shape = tf.shape(image)
  padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  cropped = tf.image.stateless_random_crop(padded, tf.stack([shape[0], shape[1], 3]), crop_seed)
  return tf.image.stateless_random_flip_left_right(cropped, flip_seed)


def random_resized_crop_box(
  height: tf.Tensor,
  width: tf.Tensor,
  seed: tf.Tensor,
  scale: tuple[float, float] = IMAGENET_SCALE,
  ratio: tuple[float, float] = IMAGENET_RATIO,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
  """(top, left, crop_height, crop_width) sampled as torchvision's RandomResizedCrop.

  Up to 10 boxes with area ~ U(scale) * H * W and log aspect ratio ~ U(log ratio); the first that
  fits is used, else a centre crop with the aspect ratio clamped into `ratio`. All attempts are
  drawn at once (same distribution as torchvision's loop).
  """
  area_seed, ratio_seed, top_seed, left_seed = tf.unstack(tf.random.split(seed, 4))
  h = tf.cast(height, tf.float32)
  w = tf.cast(width, tf.float32)
  area = h * w * tf.random.stateless_uniform([IMAGENET_ATTEMPTS], area_seed, scale[0], scale[1])
  aspect = tf.exp(
    tf.random.stateless_uniform(
      [IMAGENET_ATTEMPTS], ratio_seed, math.log(ratio[0]), math.log(ratio[1])
    )
  )
  crop_w = tf.round(tf.sqrt(area * aspect))
  crop_h = tf.round(tf.sqrt(area / aspect))
  fits = (crop_w > 0) & (crop_w <= w) & (crop_h > 0) & (crop_h <= h)
  first = tf.argmax(tf.cast(fits, tf.int32))
  found = tf.reduce_any(fits)

  # Fallback: the whole image, cropped centrally to the nearest allowed aspect ratio.
  in_ratio = w / h
  fallback_w = tf.where(in_ratio > ratio[1], tf.round(h * ratio[1]), w)
  fallback_h = tf.where(in_ratio < ratio[0], tf.round(w / ratio[0]), h)

  crop_h = tf.cast(tf.where(found, tf.gather(crop_h, first), fallback_h), tf.int32)
  crop_w = tf.cast(tf.where(found, tf.gather(crop_w, first), fallback_w), tf.int32)
  height = tf.cast(height, tf.int32)
  width = tf.cast(width, tf.int32)
  top = tf.where(
    found,
    tf.random.stateless_uniform([], top_seed, 0, height - crop_h + 1, dtype=tf.int32),
    (height - crop_h) // 2,
  )
  left = tf.where(
    found,
    tf.random.stateless_uniform([], left_seed, 0, width - crop_w + 1, dtype=tf.int32),
    (width - crop_w) // 2,
  )
  return top, left, crop_h, crop_w


def random_resized_crop_flip(image: tf.Tensor, seed: tf.Tensor, size: int) -> tf.Tensor:
  """The ImageNet train augmentation on a uint8 image; returns float32 [size, size, 3]."""
  box_seed, flip_seed = tf.unstack(tf.random.split(seed, 2))
  shape = tf.shape(image)
  top, left, crop_h, crop_w = random_resized_crop_box(shape[0], shape[1], box_seed)
  crop = tf.slice(image, tf.stack([top, left, 0]), tf.stack([crop_h, crop_w, 3]))
  out = resize(to_float(crop), size, size)
  return tf.image.stateless_random_flip_left_right(out, flip_seed)


def resize_short_centre_crop(image: tf.Tensor, size: int) -> tf.Tensor:
  """ImageNet eval: short side to round(size * 256 / 224) (as torchvision Resize), centre crop."""
  short_target = round(size * 256 / 224)
  shape = tf.shape(image)
  h, w = shape[0], shape[1]
  short = tf.minimum(h, w)
  long = tf.maximum(h, w)
  # torchvision truncates the long side: int(target * long / short).
  long_target = tf.cast(
    tf.math.floor(short_target * tf.cast(long, tf.float64) / tf.cast(short, tf.float64)), tf.int32
  )
  new_h = tf.where(h <= w, short_target, long_target)
  new_w = tf.where(h <= w, long_target, short_target)
  resized = resize(to_float(image), new_h, new_w)
  top = tf.cast(tf.round(tf.cast(new_h - size, tf.float32) / 2.0), tf.int32)
  left = tf.cast(tf.round(tf.cast(new_w - size, tf.float32) / 2.0), tf.int32)
  return tf.slice(resized, tf.stack([top, left, 0]), [size, size, 3])


def _check_stored(image: tf.Tensor, stored: int) -> tf.Tensor:
  shape = tf.shape(image)
  ok = tf.logical_and(tf.equal(shape[0], stored), tf.equal(shape[1], stored))
  check = tf.debugging.Assert(
    ok,
    [f"config.data.stored_size={stored} but an image is", shape, "; set it to 0 (host resize)"],
  )
  with tf.control_dependencies([check]):
    image = tf.identity(image)
  image.set_shape([stored, stored, 3])
  return image


def _size_mean_std(config: ml_collections.ConfigDict) -> tuple[int, tuple, tuple]:
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  return int(config.image_size), mean, std


def make_train_fn(config: ml_collections.ConfigDict) -> TrainFn:
  """(uint8 image [H, W, 3], seed [2]) -> normalised float32 [S, S, 3] for config.data.augment,
  or the uint8 augmented crop at its stored size (see `configlib.device_resize_from`)."""
  size, mean, std = _size_mean_std(config)
  kind = config.data.augment
  stored = configlib.device_resize_from(config)

  def train_fn(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    if stored:
      image = _check_stored(image, stored)
      return pad_crop_flip(image, seed) if kind == "cifar" else image
    if kind == "cifar":
      out = resize(to_float(pad_crop_flip(image, seed)), size, size)
    elif kind == "imagenet":
      out = random_resized_crop_flip(image, seed, size)
    else:
      out = resize(to_float(image), size, size)
    out = normalise(out, mean, std)
    out.set_shape([size, size, 3])
    return out

  return train_fn


def make_eval_fn(config: ml_collections.ConfigDict) -> EvalFn:
  """uint8 image -> normalised float32 [S, S, 3]: resize, or short-side resize + centre crop;
  or the uint8 image at its stored size (see `configlib.device_resize_from`)."""
  size, mean, std = _size_mean_std(config)
  kind = config.data.augment
  stored = configlib.device_resize_from(config)

  def eval_fn(image: tf.Tensor) -> tf.Tensor:
    if stored:
      return _check_stored(image, stored)
    if kind == "imagenet":
      out = resize_short_centre_crop(image, size)
    else:
      out = resize(to_float(image), size, size)
    out = normalise(out, mean, std)
    out.set_shape([size, size, 3])
    return out

  return eval_fn
