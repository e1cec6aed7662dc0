"""Training and evaluation batches from a tfds dataset or an image folder, reproducibly.

The training stream is a pure function of (config, step): epoch e is a shuffle of the (subset)
training examples seeded by (config.seed, e), identical on every process; every global batch is
split into contiguous per-process blocks (process p gets rows [p*L, (p+1)*L)), so concatenating
the processes' batches in process order gives exactly the batch a single-process run sees; each
example's augmentation is keyed by (config.seed, e, example index) (see tfdata_augment.py).
Resuming at step k skips whole epochs arithmetically and only the first k mod steps_per_epoch
batches of the current epoch, before any image is decoded.

Evaluation sees every example once: process p reads a contiguous range of the split and pads with
masked examples, and every process yields the same number of batches so collectives line up.

Memory: with config.data.cache the decoded training subset is held in memory on every process,
and so is its share of the decoded eval split once evaluated (fine for CIFAR or small subsets).
Without it, image folders read only each process's share of files, while tfds streams the
subset's records on every process (shuffle buffer: config.data.shuffle_buffer records) and
decodes only its share.

Determinism: the order is fixed by (config.seed, epoch) and TensorFlow's shuffle algorithm, which
also mixes in TF's global seed. Nothing here sets it; do not call tf.random.set_seed in the
trainer (it would change the order, consistently across processes). Keep the TF version fixed
within a run so that a resumed run sees the same order.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import ml_collections
import numpy as np

from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.data import (
  splits,
  step_preprocess,
  tfdata_augment,
  tfdata_sources,
  tfdata_undecodable,
)
from vitboot_jax.data.tfdata_sources import AUTOTUNE, tf


def _processes(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= index < count:
    raise ValueError(f"process_index={index} must be in [0, process_count={count})")
  return index, count


def _local_batch(global_batch: int, process_count: int, field: str) -> int:
  if global_batch <= 0 or global_batch % process_count:
    raise ValueError(
      f"config.{field}={global_batch} is not a positive multiple of the {process_count} "
      f"processes; use a multiple of {process_count}"
    )
  return global_batch // process_count


def _options(*, autotune: bool = True) -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True  # Parallel maps keep their input order.
  options.autotune.enabled = autotune
  return options


def split_labels(config: ml_collections.ConfigDict, split: str) -> np.ndarray:
  """Labels of a split in canonical order, read without decoding any image."""
  return tfdata_sources.open_source(config).labels(split)


def dataset_info(config: ml_collections.ConfigDict) -> splits.DatasetInfo:
  source = tfdata_sources.open_source(config)
  num_split = source.count(config.data.train_split)
  num_train = num_split
  if splits.takes_rows(config):
    num_train = len(tfdata_sources.part_rows(source, config, "train"))
  val_split = splits.validation_split(config)
  num_val = 0
  if val_split is not None:
    num_val = len(tfdata_sources.part_rows(source, config, "val"))
  return splits.DatasetInfo(
    num_train_examples=num_train,
    num_eval_examples=source.count(config.data.eval_split),
    num_classes=len(source.class_names),
    steps_per_epoch=splits.steps_per_epoch(config, num_train),
    class_names=source.class_names,
    num_val_examples=num_val,
    num_train_split=num_split,
  )


def train_dataset(
  config: ml_collections.ConfigDict,
  *,
  start_step: int = 0,
  process_index: int | None = None,
  process_count: int | None = None,
) -> tf.data.Dataset:
  """The endless training stream of this process from `start_step` on, as a tf.data.Dataset."""
  p, num_p = _processes(process_index, process_count)
  local = _local_batch(config.batch_size, num_p, "batch_size")
  glob = config.batch_size
  if start_step < 0:
    raise ValueError(f"start_step={start_step} must be >= 0")
  source = tfdata_sources.open_source(config)
  split = config.data.train_split
  if not splits.takes_rows(config):
    num = source.count(split)
    base = source.examples(split)
  else:
    keep = tfdata_sources.part_rows(source, config, "train")
    num = len(keep)
    base = source.examples(split, keep)
  steps = splits.steps_per_epoch(config, num)
  start_epoch, skip_steps = divmod(start_step, steps)

  fetch = source.fetch
  if config.data.cache:
    base = base.map(
      lambda ex: {**ex, "ref": fetch(ex["ref"])}, num_parallel_calls=AUTOTUNE, deterministic=True
    ).cache()
  decoded = bool(config.data.cache)
  buffer = num if (decoded or source.cheap_refs) else max(1, min(num, config.data.shuffle_buffer))
  seed = int(config.seed)

  def epoch(e: tf.Tensor) -> tf.data.Dataset:
    shuffle_seed = tf.random.stateless_uniform(
      [], tfdata_augment.stream_key(seed, step_preprocess.SHUFFLE_STREAM, e), None, None, tf.int64
    )
    ds = base.shuffle(buffer, seed=shuffle_seed, reshuffle_each_iteration=False)
    skip = tf.where(tf.equal(e, start_epoch), tf.constant(skip_steps * glob, tf.int64), 0)
    ds = ds.take(steps * glob).skip(skip)  # skip is a multiple of glob: row slots unchanged.
    ds = ds.enumerate().filter(lambda j, ex: (j % glob) // local == p)
    return ds.map(lambda j, ex: {**ex, "epoch": e})

  train_fn = tfdata_augment.make_train_fn(config)

  def augment(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    image = ex["ref"] if decoded else fetch(ex["ref"])
    image = train_fn(image, tfdata_augment.example_seed(seed, ex["epoch"], ex["index"]))
    return {"image": image, "label": tf.cast(ex["label"], tf.int32)}

  ds = tf.data.Dataset.counter(start_epoch).flat_map(epoch)
  ds = ds.map(augment, num_parallel_calls=AUTOTUNE, deterministic=True)
  ds = ds.batch(local, drop_remainder=True).prefetch(AUTOTUNE)
  return ds.with_options(_options())


def train_batches(
  config: ml_collections.ConfigDict,
  *,
  start_step: int = 0,
  process_index: int | None = None,
  process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """{"image": float32 [B, S, S, 3], "label": int32 [B]}, B = batch_size // process_count;
  the image is uint8 [B, s, s, 3] at the stored size s when the steps resize on the device
  (configlib.device_resize_from).

  With start_step=k, yields exactly what an uninterrupted run yields from step k on.
  """
  ds = train_dataset(
    config, start_step=start_step, process_index=process_index, process_count=process_count
  )
  return numpy_batches(ds, config, config.data.train_split)


def eval_dataset(
  config: ml_collections.ConfigDict,
  *,
  part: str = "eval",
  process_index: int | None = None,
  process_count: int | None = None,
) -> tf.data.Dataset:
  """This process's share of the eval split (or of the validation split, `part`="val"), padded
  with masked examples (see eval_batches)."""
  p, num_p = _processes(process_index, process_count)
  local = _local_batch(config.data.eval_batch_size, num_p, "data.eval_batch_size")
  source = tfdata_sources.open_source(config)
  split = splits.part_split(config, part)
  rows = None  # The whole split, read by contiguous ranges.
  if part == "val" and splits.holds_out(config):
    rows = tfdata_sources.part_rows(source, config, part)
  num = source.count(split) if rows is None else len(rows)
  start, stop = num * p // num_p, num * (p + 1) // num_p
  largest_share = -(-num // num_p)
  num_batches = max(1, -(-largest_share // local))
  eval_fn = tfdata_augment.make_eval_fn(config)
  fetch = source.fetch
  size = int(config.image_size)

  def decode(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {"image": fetch(ex["ref"]), "label": tf.cast(ex["label"], tf.int32)}

  def prepare(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {"image": eval_fn(ex["image"]), "label": ex["label"], "mask": tf.constant(1.0)}

  stored = configlib.device_resize_from(config)
  padding = {
    "image": tf.zeros([stored, stored, 3], tf.uint8) if stored else tf.zeros([size, size, 3]),
    "label": tf.constant(0, tf.int32),
    "mask": tf.constant(0.0, tf.float32),
  }
  padding_ds = tf.data.Dataset.from_tensors(padding).repeat()
  if stop > start:
    if rows is None:
      ds = source.range_examples(split, start, stop)
    else:  # Held-out validation: its rows of the training split.
      ds = source.examples(split, rows[start:stop])
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    if config.data.cache:
      # Decoded images before the resize (CIFAR: 30 MB): an evaluation every epoch would
      # otherwise decode the whole split again, which on a 2-core CPU costs as much as running
      # the models. The cache lives as long as this dataset: build it once per run.
      ds = ds.cache()
    ds = ds.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    ds = ds.concatenate(padding_ds)
  else:  # More processes than examples: this one only pads.
    ds = padding_ds
  ds = ds.take(num_batches * local).batch(local, drop_remainder=True)
  # A new iterator per evaluation: with autotuning on, tearing each one down took a good part of
  # a 32-px evaluation (docs/performance.md, "evaluation input"). Maps then run one thread per
  # core.
  return ds.prefetch(2).with_options(_options(autotune=False))


def eval_batches(
  config: ml_collections.ConfigDict,
  *,
  part: str = "eval",
  process_index: int | None = None,
  process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """{"image", "label", "mask"} batches of eval_batch_size // process_count; mask 0 = padding.

  Every example of config.data.eval_split (`part`="val": of the validation split) appears once
  across processes; every process yields the same number of batches.
  """
  ds = eval_dataset(config, part=part, process_index=process_index, process_count=process_count)
  return numpy_batches(ds, config, splits.part_split(config, part))


def numpy_batches(
  ds: tf.data.Dataset, config: ml_collections.ConfigDict, split: str
) -> Iterator[dict[str, np.ndarray]]:
  """Iterates `ds` as numpy; a decoding failure names the unreadable file(s) of `split`."""
  try:
    yield from ds.as_numpy_iterator()
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError, tf.errors.NotFoundError) as e:
    message = tfdata_undecodable.find_unreadable(config, split, e)
    if message is None and "config.data.stored_size" in str(e):
      raise errors.ConfigError(tfdata_undecodable.wrong_size_message(config, split, e)) from None
    if message is None:  # Every file decodes: the failure is not about a file.
      raise
    raise splits.UnreadableImageError(message) from None
