"""The dataset on the devices (config.data.pipeline="device"): every batch made inside the step.

The training subset and the eval split are read once as uint8 arrays at their stored size
(read_folders.py and read_npz.py, without TensorFlow; tfdata_sources.decoded_arrays for tfds)
and placed replicated on every device of every process: each process reads the same files and
puts a full copy on each of its own devices, so no batch ever crosses a host.

Training batches are a pure function of (data, step), computed inside the jitted step
(`feeding`): epoch e = step // steps_per_epoch is a permutation of the subset keyed by
(config.seed, e), batch step % steps_per_epoch its next batch_size rows (the official
drop_last), and each example's augmentation is keyed by (config.seed, e, its index in the
split), as in the tf.data pipeline. The subset and its canonical order are tfdata_pipeline's
(splits.subset_indices); the permutation comes from jax.random, so the order differs from
tf.data's shuffle while its distribution is the same. A resumed run continues the exact stream,
and a scan over several steps needs no host input. The gathered rows are split over the mesh
before they are augmented, so each device augments only its share of the batch.

Evaluation slices the eval split, padded with masked examples to whole batches, on the devices:
every example is evaluated once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from vitboot_jax import sharding
from vitboot_jax.base import errors
from vitboot_jax.data import read_folders, read_npz, splits, step_preprocess
from vitboot_jax.data.splits import DatasetInfo

Data = dict[str, jax.Array]
Batch = dict[str, jax.Array]

# The dataset may take this share of a device's free memory; the rest is the model's.
MEMORY_SHARE = 0.5


def stream_key(seed: int, stream: int, epoch: jax.Array) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), stream), epoch)


def batch_at(
  config: ml_collections.ConfigDict,
  data: Data,
  step: jax.Array,
  steps_per_epoch: int,
  batch_sharding: jax.sharding.Sharding | None = None,
) -> Batch:
  """The training batch of (0-based) `step`: {"image": [B, ...], "label": int32 [B]}.

  Jittable; `data` is DeviceDataset's train arrays. The images are the augmented crops: uint8
  at the stored size, which the train step resizes and normalises (step_preprocess.
  make_prepare), or for config.data.augment="imagenet" the normalised random-resized crops,
  float32 at config.image_size.
  """
  num = data["label"].shape[0]
  step = jnp.asarray(step, jnp.int32)
  epoch, position = step // steps_per_epoch, step % steps_per_epoch
  order = jax.random.permutation(
    stream_key(config.seed, step_preprocess.SHUFFLE_STREAM, epoch), num
  )
  rows = jax.lax.dynamic_slice_in_dim(order, position * config.batch_size, config.batch_size)
  if batch_sharding is not None:
    rows = jax.lax.with_sharding_constraint(rows, batch_sharding)
  augment_key = stream_key(config.seed, step_preprocess.AUGMENT_STREAM, epoch)
  keys = jax.vmap(lambda i: jax.random.fold_in(augment_key, i))(data["index"][rows])
  images = step_preprocess.make_augment(config)(data["image"][rows], keys)
  return {"image": images, "label": data["label"][rows]}


def feeding(
  train_step: Callable[[Any, Batch], tuple[Any, dict[str, jax.Array]]],
  config: ml_collections.ConfigDict,
  mesh: jax.sharding.Mesh,
  steps_per_epoch: int,
) -> Callable[[Any, Data], tuple[Any, dict[str, jax.Array]]]:
  """`step(state, data)`: `train_step(state, batch_at(data, state.step))`, pure; jit it."""
  batch_sharding = sharding.batch_sharded(mesh)

  def step(state, data: Data):
    return train_step(state, batch_at(config, data, state.step, steps_per_epoch, batch_sharding))

  return step


# ---------------------------------------------------------------------------------------------
# Reading and placing.


def read_split(
  config: ml_collections.ConfigDict, part: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [N, H, W, 3], labels, index in the split) of `part` on the host (splits.PARTS:
  "train", "val" or "eval"), checked: every image decodes and has config.data.stored_size (a bad
  one is named, before training)."""
  if config.data.name == "folder":
    arrays = read_folders.folder_arrays(config, part)
  elif config.data.name == "npz":
    arrays = read_npz.npz_arrays(config, part)
  else:
    from vitboot_jax.data import tfdata_sources  # tfds: TensorFlow decodes.

    arrays = tfdata_sources.decoded_arrays(config, part)
  split = splits.part_split(config, part)
  where = f"{config.data.name} split {split!r}"
  if config.data.name == "npz":
    where = read_npz.npz_path(config.data.dir, split)
  splits.check_stored_size(config, arrays[0], where)  # A folder's files were named as read.
  return arrays


def free_bytes(device: jax.Device) -> int:
  """Memory one device can still take: the allocator's limit on accelerators, the host's
  available memory shared by its CPU devices otherwise."""
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  return int(pages) // max(1, jax.local_device_count())


def check_fits(
  config: ml_collections.ConfigDict, nbytes: int, sizes: str, device: jax.Device, free: int
) -> None:
  """Fails before training when the dataset would take over MEMORY_SHARE of a device."""
  if nbytes <= MEMORY_SHARE * free:
    return
  gib = 2**30
  raise errors.DataError(
    f"config.data.pipeline='device': {config.data.name} ({sizes}) takes {nbytes / gib:.2f} GiB "
    f"per device but {device.device_kind} has {free / gib:.2f} GiB free, of which at most "
    f"{MEMORY_SHARE:.0%} is for data; use --config.data.pipeline=tfdata (or a smaller "
    "train_fraction)"
  )


def _eval_padded(images: np.ndarray, labels: np.ndarray, batch: int) -> dict[str, np.ndarray]:
  """The eval split padded with masked examples (image 0, label 0, mask 0) to whole batches."""
  num = len(labels)
  total = max(1, -(-num // batch)) * batch
  pad = total - num
  return {
    "image": np.concatenate([images, np.zeros((pad, *images.shape[1:]), np.uint8)]),
    "label": np.concatenate([labels, np.zeros([pad], np.int64)]).astype(np.int32),
    "mask": np.concatenate([np.ones([num], np.float32), np.zeros([pad], np.float32)]),
  }


def _replicate(arrays: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> Data:
  """Full copies on every device of every process, each process giving its own read."""
  replicated = sharding.replicated(mesh)
  return {
    k: jax.make_array_from_callback(v.shape, replicated, lambda index, v=v: v[index])
    for k, v in arrays.items()
  }


class DeviceDataset:
  """The train subset, the eval split and the validation split on the devices, and the jitted
  eval slicer."""

  def __init__(self, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
    split, eval_split = config.data.train_split, config.data.eval_split
    images, labels, index = read_split(config, "train")
    eval_images, eval_labels, _ = read_split(config, "eval")
    val = read_split(config, "val") if splits.validation_split(config) else None
    num_classes = config.data.num_classes
    class_names = source_class_names(config)
    if len(class_names) != num_classes:
      raise errors.ConfigError(
        f"config.data.num_classes={num_classes} but the data ({config.data.name}, "
        f"{config.data.dir}) has {len(class_names)} classes; set "
        f"--config.data.num_classes={len(class_names)}"
      )
    splits.check_labels(labels, num_classes, f"{config.data.name} {split}")
    splits.check_labels(eval_labels, num_classes, f"{config.data.name} {eval_split}")
    self.eval_batch_size = config.data.eval_batch_size
    held = {"eval": _eval_padded(eval_images, eval_labels, self.eval_batch_size)}
    if val is not None:
      splits.check_labels(val[1], num_classes, f"{config.data.name} validation")
      held["val"] = _eval_padded(val[0], val[1], self.eval_batch_size)
    train_arrays = {
      "image": images,
      "label": labels.astype(np.int32),
      "index": index.astype(np.int32),
    }
    arrays = [*train_arrays.values(), *(a for part in held.values() for a in part.values())]
    nbytes = sum(a.nbytes for a in arrays)
    validation = "" if val is None else f" + {len(val[1])} validation"
    sizes = (
      f"{len(labels)} train + {len(eval_labels)} eval{validation} images of {images.shape[1:]}"
    )
    device = mesh.devices.flat[0]
    check_fits(config, nbytes, sizes, device, free_bytes(device))
    self.info = DatasetInfo(
      num_train_examples=len(labels),
      num_eval_examples=len(eval_labels),
      num_classes=num_classes,
      steps_per_epoch=splits.steps_per_epoch(config, len(labels)),
      class_names=class_names,
      num_val_examples=0 if val is None else len(val[1]),
      num_train_split=_split_size(config, split, len(labels)),
    )
    self.train = _replicate(train_arrays, mesh)
    self._held = {part: _replicate(a, mesh) for part, a in held.items()}
    logging.info("Dataset on the devices: %s, %.1f MiB per device.", sizes, nbytes / 2**20)
    size, batch_sharding = self.eval_batch_size, sharding.batch_sharded(mesh)

    def eval_slice(data: Data, i: jax.Array) -> Batch:
      return {k: jax.lax.dynamic_slice_in_dim(v, i * size, size) for k, v in data.items()}

    self._eval_slice = jax.jit(eval_slice, out_shardings=batch_sharding)

  def eval_batches(self, part: str = "eval") -> Iterator[Batch]:
    """Global batches {"image", "label", "mask"} of the eval split (or of the validation split:
    `part`="val"), sliced on the devices."""
    data = self._held[part]
    for i in range(data["label"].shape[0] // self.eval_batch_size):
      yield self._eval_slice(data, np.int32(i))


def _split_size(config: ml_collections.ConfigDict, split: str, num_train: int) -> int:
  """Examples of the whole training split: listed again only where part of it was left out."""
  if not splits.takes_rows(config):
    return num_train
  if config.data.name == "folder":
    return len(read_folders.split_paths(config, split))
  if config.data.name == "npz":
    return len(read_npz.read_npz(config.data.dir, split, split)["labels"])
  from vitboot_jax.data import tfdata_sources

  return tfdata_sources.open_source(config).count(split)


def source_class_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The class names config.data's source gives, by label index (tfds: through TensorFlow)."""
  if config.data.name == "npz":
    return read_npz.npz_class_names(config)
  if config.data.name == "folder":
    return tuple(
      read_folders.class_folders(config.data.dir, config.data.train_split, "train_split")
    )
  from vitboot_jax.data import tfdata_pipeline

  return tfdata_pipeline.dataset_info(config).class_names
