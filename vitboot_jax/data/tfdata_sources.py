"""The three sources as tf.data datasets: an image folder, `.npz` arrays and a prepared tfds
dataset. Each gives a split's examples as {"index", "ref", "label"} in the split's canonical
order, where "ref" is what `fetch` turns into a uint8 image (a file path, encoded bytes or the
image), so tfdata_pipeline.py decodes only what a process reads; `decoded_arrays` decodes a whole
split for the device pipeline (tfds; folders and .npz need no TensorFlow there).
"""

from __future__ import annotations

import os

import ml_collections
import numpy as np

from vitboot_jax.base import errors, library_logs
from vitboot_jax.data import (
  read_folders,
  read_npz,
  splits,
  tfdata_augment,
  tfdata_undecodable,
)

# Quietly, and off every accelerator: JAX's memory stays JAX's.
tf = library_logs.import_tensorflow()
import tensorflow_datasets as tfds  # noqa: E402  (after TensorFlow is set up)

AUTOTUNE = tf.data.AUTOTUNE


class FolderSource:
  """root/<split>/<class>/*.{jpg,jpeg,png}; classes are the train split's sorted subfolders."""

  cheap_refs = True  # Refs are paths: a full-size shuffle buffer costs almost nothing.

  def __init__(self, config: ml_collections.ConfigDict):
    self.train_split = config.data.train_split
    self.root = config.data.dir
    if not self.root or not os.path.isdir(self.root):
      raise errors.DataError(
        f"config.data.dir={self.root!r} not found; "
        + read_folders.FOLDER_HINT.format(split=config.data.train_split)
      )
    classes = read_folders.class_folders(self.root, config.data.train_split, "train_split")
    self.class_names = tuple(classes)

  def _listing(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    return read_folders.list_folder(
      self.root, split, _field(split, self.train_split), self.class_names
    )

  def labels(self, split: str) -> np.ndarray:
    return self._listing(split)[1]

  def file_names(self, split: str) -> None:
    """None: the canonical order already sorts each class's file names."""
    del split

  def count(self, split: str) -> int:
    return len(self.labels(split))

  def examples(self, split: str, indices: np.ndarray | None = None) -> tf.data.Dataset:
    """The split, or the examples at sorted `indices`, as file paths (nothing is read)."""
    paths, labels = self._listing(split)
    index = np.arange(len(paths), dtype=np.int64)
    if indices is not None:
      index = index[indices]
    return tf.data.Dataset.from_tensor_slices(
      {"index": index, "ref": paths[index], "label": labels[index]}
    )

  def range_examples(self, split: str, start: int, stop: int) -> tf.data.Dataset:
    """Examples [start, stop) of the split."""
    return self.examples(split, np.arange(start, stop))

  @staticmethod
  def fetch(ref: tf.Tensor) -> tf.Tensor:
    return tfdata_augment.decode(tf.io.read_file(ref))


class TfdsSource:
  """A prepared tfds dataset in config.data.dir; never downloads, never reads GCS."""

  cheap_refs = False  # Refs are encoded images.

  def __init__(self, config: ml_collections.ConfigDict):
    self.train_split = config.data.train_split
    self.name = config.data.name
    self.data_dir = config.data.dir
    try:
      self.builder = tfds.builder(self.name, data_dir=self.data_dir, try_gcs=False)
    except tfds.core.registered.DatasetNotFoundError as e:
      raise errors.ConfigError(
        f"config.data.name={self.name!r} is neither a tfds dataset nor 'folder' "
        "(for an image folder set --config.data.name=folder --config.data.dir=ROOT)"
      ) from e
    keys = self.builder.info.supervised_keys or ("image", "label")
    self.image_key, self.label_key = keys[0], keys[1]
    label_feature = self.builder.info.features[self.label_key]
    self.class_names = tuple(label_feature.names)

  def _read(self, split: str, field: str, decoders, **read_kwargs) -> tf.data.Dataset:
    """Reads `split` in its stored order, turning tfds' errors into ones that name the fix."""
    read_config = tfds.ReadConfig(interleave_cycle_length=1, **read_kwargs)
    try:
      return self.builder.as_dataset(
        split=split, shuffle_files=False, decoders=decoders, read_config=read_config
      )
    except AssertionError as e:
      if "could not find data" not in str(e):
        raise
      where = self.data_dir or "the tfds default data_dir ($TFDS_DATA_DIR or ~/tensorflow_datasets)"
      raise errors.DataError(
        f"tfds dataset {self.name!r} is not prepared in data_dir={where}; run `python -m "
        f"vitboot_jax.tools.prepare_data {self.name} --data_dir={self.data_dir or 'DIR'}` (or "
        "copy a prepared dataset there) and pass it as --config.data.dir"
      ) from e
    except (KeyError, ValueError) as e:
      raise ValueError(f"config.data.{field}={split!r} cannot be read from {self.name}: {e}") from e

  def _metadata_count(self, split: str) -> int | None:
    try:
      return int(self.builder.info.splits[split].num_examples)
    except (KeyError, ValueError):  # No split metadata (e.g. tfds.testing.mock_data).
      return None

  def labels(self, split: str) -> np.ndarray:
    return self._labels_and_names(split)[0]

  def file_names(self, split: str) -> np.ndarray | None:
    """Each record's original name: tfds `file_name` (e.g. imagenet2012's
    'n01440764_10026.JPEG') or `id` (cifar10's 'train_00042', the index in the original
    files), or None when the dataset has neither."""
    return self._labels_and_names(split)[1]

  def _labels_and_names(self, split: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One pass over the labels and file names (images are not decoded); cached for data on disk."""
    key = (self.name, self.data_dir, split)
    if key in _LABEL_CACHE:
      return _LABEL_CACHE[key]
    # tfds stores records in a hashed order; the original name orders them as the source did.
    names = [f for f in ("file_name", "id") if f in self.builder.info.features][:1]
    fields = [self.label_key] + names
    decoders = tfds.decode.PartialDecoding({f: True for f in fields})
    ds = self._read(split, _field(split, self.train_split), decoders, try_autocache=False)
    ds = ds.map(lambda ex: tuple(ex[f] for f in fields)).batch(65536)
    columns = [[np.zeros([0], np.int64)], [np.zeros([0], object)]]
    for batch in ds.as_numpy_iterator():
      for column, values in zip(columns, batch):
        column.append(values)
    labels = np.concatenate(columns[0]).astype(np.int64)
    out = labels, (np.concatenate(columns[1]) if len(fields) == 2 else None)
    if self.builder.is_prepared() and len(labels) == self._metadata_count(split):
      _LABEL_CACHE[key] = out
    return out

  def count(self, split: str) -> int:
    num = self._metadata_count(split)
    return len(self.labels(split)) if num is None else num

  def examples(self, split: str, indices: np.ndarray | None = None) -> tf.data.Dataset:
    """The split, or the examples at sorted `indices`, found by one pass that decodes nothing."""
    ds = self._read(split, _field(split, self.train_split), self._skip_image).enumerate()
    if indices is not None:
      keep = np.zeros([int(indices.max()) + 1 if indices.size else 0], bool)
      keep[indices] = True
      keep_t = tf.constant(keep)
      ds = ds.take(keep.size).filter(lambda i, ex: tf.gather(keep_t, i))
    return ds.map(self._to_example)

  def range_examples(self, split: str, start: int, stop: int) -> tf.data.Dataset:
    """Examples [start, stop) of the split; tfds reads only those records when it can."""
    field = _field(split, self.train_split)
    if "[" in split:  # Already a sub-split: tfds cannot slice it again.
      ds = self._read(split, field, self._skip_image).enumerate().skip(start)
    else:
      ds = self._read(f"{split}[{start}:{stop}]", field, self._skip_image).enumerate(start)
    return ds.take(stop - start).map(self._to_example)

  @property
  def _skip_image(self) -> dict:
    return {self.image_key: tfds.decode.SkipDecoding()}

  def _to_example(self, index: tf.Tensor, ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {"index": index, "ref": ex[self.image_key], "label": ex[self.label_key]}

  @staticmethod
  def fetch(ref: tf.Tensor) -> tf.Tensor:
    return tfdata_augment.decode(ref)


class NpzSource:
  """DIR/<split>.npz arrays (read_npz.read_npz), the same files the device pipeline reads."""

  cheap_refs = True  # The images are in memory already: a full shuffle buffer adds nothing.

  def __init__(self, config: ml_collections.ConfigDict):
    self.root, self.train_split = config.data.dir, config.data.train_split
    self.class_names = read_npz.npz_class_names(config)

  def _arrays(self, split: str) -> dict[str, np.ndarray]:
    arrays = read_npz.read_npz(self.root, split, self.train_split)
    where = read_npz.npz_path(self.root, split)
    splits.check_labels(arrays["labels"], len(self.class_names), where)
    return arrays

  def labels(self, split: str) -> np.ndarray:
    return self._arrays(split)["labels"]

  def file_names(self, split: str) -> np.ndarray | None:
    return self._arrays(split).get("file_names")

  def count(self, split: str) -> int:
    return len(self.labels(split))

  def examples(self, split: str, indices: np.ndarray | None = None) -> tf.data.Dataset:
    arrays = self._arrays(split)
    index = np.arange(len(arrays["labels"]), dtype=np.int64) if indices is None else indices
    return tf.data.Dataset.from_tensor_slices(
      {"index": index, "ref": arrays["images"][index], "label": arrays["labels"][index]}
    )

  def range_examples(self, split: str, start: int, stop: int) -> tf.data.Dataset:
    return self.examples(split, np.arange(start, stop, dtype=np.int64))

  @staticmethod
  def fetch(ref: tf.Tensor) -> tf.Tensor:
    return ref


_field = splits.split_field


_LABEL_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}


Source = FolderSource | NpzSource | TfdsSource


def open_source(config: ml_collections.ConfigDict) -> Source:
  """Opens config.data's source and checks its class count against config.data.num_classes."""
  kinds = {"folder": FolderSource, "npz": NpzSource}
  source = kinds.get(config.data.name, TfdsSource)(config)
  if len(source.class_names) != config.data.num_classes:
    raise errors.ConfigError(
      f"config.data.num_classes={config.data.num_classes} but the data "
      f"({config.data.name}, {config.data.dir}) has {len(source.class_names)} classes; set "
      f"--config.data.num_classes={len(source.class_names)}"
    )
  return source


def part_rows(source: Source, config: ml_collections.ConfigDict, part: str = "train"):
  """The rows of `part` (splits.part_rows: the training subset, the held-out validation) in its
  split, by file name where the source knows them (tfds imagenet2012's file_name, cifar10's id),
  so tfds and an image folder of the same images select the same ones."""
  split = splits.part_split(config, part)
  return splits.part_rows(
    config, part, source.labels(split), source.file_names(split), source.class_names
  )


def tfds_record(config: ml_collections.ConfigDict) -> tuple[str, dict[str, int]]:
  """(version, examples per split) of a tfds dataset, for the workdir's data record."""
  source = TfdsSource(config)
  splits = dict.fromkeys((config.data.train_split, config.data.eval_split))
  return str(source.builder.info.version), {split: source.count(split) for split in splits}


def decoded_arrays(
  config: ml_collections.ConfigDict, part: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [N, H, W, 3], labels, index) of `part` (splits.PARTS), decoded by TensorFlow
  for the device pipeline (tfds; read_folders.folder_arrays and read_npz.npz_arrays need none)."""
  source = open_source(config)
  split = splits.part_split(config, part)
  keep = None
  if part == "val" or (part == "train" and splits.takes_rows(config)):
    keep = part_rows(source, config, part)
  ds = source.examples(split, keep).map(
    lambda ex: (source.fetch(ex["ref"]), ex["label"], ex["index"]),
    num_parallel_calls=AUTOTUNE,
    deterministic=True,
  )
  images, labels, index = [], [], []
  try:
    for image, label, i in ds.as_numpy_iterator():
      if images and image.shape != images[0].shape:
        raise errors.DataError(
          f"config.data.pipeline='device' holds a split as one array, but {config.data.name} "
          f"{split!r} has images of {images[0].shape} and {image.shape}; use "
          "--config.data.pipeline=tfdata"
        )
      images.append(image)
      labels.append(label)
      index.append(i)
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    message = tfdata_undecodable.find_unreadable(config, split, e)
    if message is None:
      raise
    raise splits.UnreadableImageError(message) from None
  if not images:
    return np.zeros([0, 0, 0, 3], np.uint8), np.zeros([0], np.int64), np.zeros([0], np.int64)
  return np.stack(images), np.asarray(labels, np.int64), np.asarray(index, np.int64)
