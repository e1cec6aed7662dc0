"""Training and evaluation batches from a tfds dataset or an image folder, reproducibly.

The training stream is a pure function of (config, step): epoch e is a shuffle of the (subset)
training examples seeded by (config.seed, e), identical on every process; every global batch is
split into contiguous per-process blocks (process p gets rows [p*L, (p+1)*L)), so concatenating
the processes' batches in process order gives exactly the batch a single-process run sees; each
example's augmentation is keyed by (config.seed, e, example index) (see preprocess.py). Resuming at
step k skips whole epochs arithmetically and only the first k mod steps_per_epoch batches of the
current epoch, before any image is decoded.

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

import os
from collections.abc import Iterator

import jax
import ml_collections
import numpy as np

from vitboot_jax import configlib, errors, quiet
from vitboot_jax.data import device_preprocess, preprocess, sources
from vitboot_jax.data.sources import (  # noqa: F401  (public here as before)
  IMAGE_EXTENSIONS,
  DatasetInfo,
  UnreadableImageError,
  subset_indices,
)

tf = quiet.import_tensorflow()  # Quietly, and off every accelerator: JAX's memory stays JAX's.
import tensorflow_datasets as tfds  # noqa: E402  (after TensorFlow is set up)

_AUTOTUNE = tf.data.AUTOTUNE
_FOLDER_HINT = sources.FOLDER_HINT


# ---------------------------------------------------------------------------------------------
# Sources. All give examples as {"index", "ref", "label"} in the split's canonical order, where
# "ref" is what `fetch` turns into a uint8 image (a file path, encoded bytes or the image).


class _FolderSource:
  """root/<split>/<class>/*.{jpg,jpeg,png}; classes are the train split's sorted subfolders."""

  cheap_refs = True  # Refs are paths: a full-size shuffle buffer costs almost nothing.

  def __init__(self, config: ml_collections.ConfigDict):
    self.train_split = config.data.train_split
    self.root = config.data.dir
    if not self.root or not os.path.isdir(self.root):
      raise errors.DataError(
        f"config.data.dir={self.root!r} not found; "
        + _FOLDER_HINT.format(split=config.data.train_split)
      )
    classes = sources.class_folders(self.root, config.data.train_split, "train_split")
    self.class_names = tuple(classes)

  def _listing(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    return sources.list_folder(self.root, split, _field(split, self.train_split), self.class_names)

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
    return preprocess.decode(tf.io.read_file(ref))


class _TfdsSource:
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
    return preprocess.decode(ref)


class _NpzSource:
  """DIR/<split>.npz arrays (sources.read_npz), the same files the device pipeline reads."""

  cheap_refs = True  # The images are in memory already: a full shuffle buffer adds nothing.

  def __init__(self, config: ml_collections.ConfigDict):
    self.root, self.train_split = config.data.dir, config.data.train_split
    self.class_names = sources.npz_class_names(config)

  def _arrays(self, split: str) -> dict[str, np.ndarray]:
    arrays = sources.read_npz(self.root, split, self.train_split)
    where = sources.npz_path(self.root, split)
    sources.check_labels(arrays["labels"], len(self.class_names), where)
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


_field = sources.split_field


_LABEL_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}


_Source = _FolderSource | _NpzSource | _TfdsSource


def _source(config: ml_collections.ConfigDict) -> _Source:
  """Opens config.data's source and checks its class count against config.data.num_classes."""
  kinds = {"folder": _FolderSource, "npz": _NpzSource}
  source = kinds.get(config.data.name, _TfdsSource)(config)
  if len(source.class_names) != config.data.num_classes:
    raise errors.ConfigError(
      f"config.data.num_classes={config.data.num_classes} but the data "
      f"({config.data.name}, {config.data.dir}) has {len(source.class_names)} classes; set "
      f"--config.data.num_classes={len(source.class_names)}"
    )
  return source


def _train_subset(source: _Source, config: ml_collections.ConfigDict):
  """The official subset of the training split, by file name where the source knows them (tfds
  imagenet2012's file_name, cifar10's id), so tfds and an image folder of the same images select
  the same ones."""
  split = config.data.train_split
  return subset_indices(source.labels(split), config.data.train_fraction, source.file_names(split))


# ---------------------------------------------------------------------------------------------
# Public API.


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
  return _source(config).labels(split)


def dataset_info(config: ml_collections.ConfigDict) -> DatasetInfo:
  source = _source(config)
  if config.data.train_fraction == 1.0:
    num_train = source.count(config.data.train_split)
  else:
    num_train = len(_train_subset(source, config))
  return DatasetInfo(
    num_train_examples=num_train,
    num_eval_examples=source.count(config.data.eval_split),
    num_classes=len(source.class_names),
    steps_per_epoch=sources.steps_per_epoch(config, num_train),
    class_names=source.class_names,
  )


def split_arrays(
  config: ml_collections.ConfigDict, split: str, *, subset: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [N, H, W, 3], labels, index) of a split, decoded here for the device pipeline
  (sources.split_arrays without TensorFlow for folders and .npz); `subset`: the train subset."""
  source = _source(config)
  keep = None
  if subset and config.data.train_fraction < 1.0:
    keep = _train_subset(source, config)
  ds = source.examples(split, keep).map(
    lambda ex: (source.fetch(ex["ref"]), ex["label"], ex["index"]),
    num_parallel_calls=_AUTOTUNE,
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
    message = _find_unreadable(config, split, e)
    if message is None:
      raise
    raise UnreadableImageError(message) from None
  if not images:
    return np.zeros([0, 0, 0, 3], np.uint8), np.zeros([0], np.int64), np.zeros([0], np.int64)
  return np.stack(images), np.asarray(labels, np.int64), np.asarray(index, np.int64)


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
  source = _source(config)
  split = config.data.train_split
  if config.data.train_fraction == 1.0:
    num = source.count(split)
    base = source.examples(split)
  else:
    keep = _train_subset(source, config)
    num = len(keep)
    base = source.examples(split, keep)
  steps = sources.steps_per_epoch(config, num)
  start_epoch, skip_steps = divmod(start_step, steps)

  fetch = source.fetch
  if config.data.cache:
    base = base.map(
      lambda ex: {**ex, "ref": fetch(ex["ref"])}, num_parallel_calls=_AUTOTUNE, deterministic=True
    ).cache()
  decoded = bool(config.data.cache)
  buffer = num if (decoded or source.cheap_refs) else max(1, min(num, config.data.shuffle_buffer))
  seed = int(config.seed)

  def epoch(e: tf.Tensor) -> tf.data.Dataset:
    shuffle_seed = tf.random.stateless_uniform(
      [], preprocess.stream_key(seed, device_preprocess.SHUFFLE_STREAM, e), None, None, tf.int64
    )
    ds = base.shuffle(buffer, seed=shuffle_seed, reshuffle_each_iteration=False)
    skip = tf.where(tf.equal(e, start_epoch), tf.constant(skip_steps * glob, tf.int64), 0)
    ds = ds.take(steps * glob).skip(skip)  # skip is a multiple of glob: row slots unchanged.
    ds = ds.enumerate().filter(lambda j, ex: (j % glob) // local == p)
    return ds.map(lambda j, ex: {**ex, "epoch": e})

  train_fn = preprocess.make_train_fn(config)

  def augment(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    image = ex["ref"] if decoded else fetch(ex["ref"])
    image = train_fn(image, preprocess.example_seed(seed, ex["epoch"], ex["index"]))
    return {"image": image, "label": tf.cast(ex["label"], tf.int32)}

  ds = tf.data.Dataset.counter(start_epoch).flat_map(epoch)
  ds = ds.map(augment, num_parallel_calls=_AUTOTUNE, deterministic=True)
  ds = ds.batch(local, drop_remainder=True).prefetch(_AUTOTUNE)
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
  process_index: int | None = None,
  process_count: int | None = None,
) -> tf.data.Dataset:
  """This process's share of the eval split, padded with masked examples (see eval_batches)."""
  p, num_p = _processes(process_index, process_count)
  local = _local_batch(config.data.eval_batch_size, num_p, "data.eval_batch_size")
  source = _source(config)
  split = config.data.eval_split
  num = source.count(split)
  start, stop = num * p // num_p, num * (p + 1) // num_p
  largest_share = -(-num // num_p)
  num_batches = max(1, -(-largest_share // local))
  eval_fn = preprocess.make_eval_fn(config)
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
    ds = source.range_examples(split, start, stop)
    ds = ds.map(decode, num_parallel_calls=_AUTOTUNE, deterministic=True)
    if config.data.cache:
      # Decoded images before the resize (CIFAR: 30 MB): an evaluation every epoch would
      # otherwise decode the whole split again, which on a 2-core CPU costs as much as running
      # the models. The cache lives as long as this dataset: build it once per run.
      ds = ds.cache()
    ds = ds.map(prepare, num_parallel_calls=_AUTOTUNE, deterministic=True)
    ds = ds.concatenate(padding_ds)
  else:  # More processes than examples: this one only pads.
    ds = padding_ds
  ds = ds.take(num_batches * local).batch(local, drop_remainder=True)
  # A new iterator per evaluation: with autotuning on, tearing each one down took 8-10 s on
  # 2 cores (a quarter of a 32-px evaluation; docs/performance.md). Maps then run one thread
  # per core.
  return ds.prefetch(2).with_options(_options(autotune=False))


def eval_batches(
  config: ml_collections.ConfigDict,
  *,
  process_index: int | None = None,
  process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """{"image", "label", "mask"} batches of eval_batch_size // process_count; mask 0 = padding.

  Every example of config.data.eval_split appears once across processes; every process yields
  the same number of batches.
  """
  ds = eval_dataset(config, process_index=process_index, process_count=process_count)
  return numpy_batches(ds, config, config.data.eval_split)


def numpy_batches(
  ds: tf.data.Dataset, config: ml_collections.ConfigDict, split: str
) -> Iterator[dict[str, np.ndarray]]:
  """Iterates `ds` as numpy; a decoding failure names the unreadable file(s) of `split`."""
  try:
    yield from ds.as_numpy_iterator()
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError, tf.errors.NotFoundError) as e:
    message = _find_unreadable(config, split, e)
    if message is None and "config.data.stored_size" in str(e):
      raise errors.ConfigError(_wrong_size_message(config, split, e)) from None
    if message is None:  # Every file decodes: the failure is not about a file.
      raise
    raise UnreadableImageError(message) from None


def tfds_record(config: ml_collections.ConfigDict) -> tuple[str, dict[str, int]]:
  """(version, examples per split) of a tfds dataset, for the workdir's data record."""
  source = _TfdsSource(config)
  splits = dict.fromkeys((config.data.train_split, config.data.eval_split))
  return str(source.builder.info.version), {split: source.count(split) for split in splits}


# ---------------------------------------------------------------------------------------------
# Unreadable inputs: found only after TensorFlow failed to decode one, whose error names no file.


def _decoded_shapes(paths: np.ndarray) -> dict[str, tuple[int, ...]]:
  """The decoded shape of every file that decodes, decoding in parallel."""

  def decoded_shape(path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return path, tf.shape(preprocess.decode(tf.io.read_file(path)))  # Output keeps the decode.

  ds = tf.data.Dataset.from_tensor_slices(paths).map(decoded_shape, num_parallel_calls=_AUTOTUNE)
  return {p.decode(): tuple(shape) for p, shape in ds.ignore_errors().as_numpy_iterator()}


def _wrong_size_message(config: ml_collections.ConfigDict, split: str, error: Exception) -> str:
  """Names the image(s) of `split` that are not config.data.stored_size square."""
  stored = int(config.data.stored_size)
  if config.data.name != "folder":
    cause = str(error).strip().split("\n", 1)[0][:300]
    return (
      f"config.data.stored_size={stored} but an image of split {split!r} is not: {cause}; "
      + sources.STORED_SIZE_FIX
    )
  shapes = _decoded_shapes(_FolderSource(config)._listing(split)[0])
  wrong = [f"{p} ({s[0]}x{s[1]})" for p, s in shapes.items() if s[:2] != (stored, stored)]
  return sources.wrong_size_message(stored, wrong)


def unreadable_files(paths: np.ndarray) -> str | None:
  """The message naming those of `paths` TensorFlow cannot decode (None: all decode)."""
  good_paths = _decoded_shapes(paths)
  bad = [p for p in paths.tolist() if p not in good_paths]
  if not bad:
    return None
  try:
    preprocess.decode(tf.io.read_file(bad[0]))
    why = "TensorFlow cannot decode it"
  except tf.errors.OpError as own_error:  # The file's own error: "Invalid PNG data, size 1586".
    why = own_error.message.split(" [Op:", 1)[0].strip()
  return sources.unreadable_message(bad, f"it is not a complete JPEG/PNG image: {why}")


def _find_unreadable(config: ml_collections.ConfigDict, split: str, error: Exception) -> str | None:
  """Decodes every image of `split` in parallel to name those TensorFlow cannot read (None: all
  decode)."""
  cause = str(error).strip().split("\n", 1)[0][:300]
  if config.data.name != "folder":
    if not any(word in str(error) for word in ("JPEG", "PNG", "ecode", "DataLoss", "corrupt")):
      return None
    return (
      f"tfds dataset {config.data.name!r} (data_dir={config.data.dir}) has a record that cannot "
      f"be decoded in split {split!r} ({type(error).__name__}: {cause}). Its prepared files are "
      "damaged: delete the dataset's directory and prepare it again."
    )
  return unreadable_files(_FolderSource(config)._listing(split)[0])
