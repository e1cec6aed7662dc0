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

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from vitboot_jax import configlib, errors, preprocess

# TensorFlow is only the input pipeline here: keep it off every accelerator so it never reserves
# GPU memory that JAX needs. This fails harmlessly if TF has already initialised its devices.
try:
  tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):
  pass

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
_AUTOTUNE = tf.data.AUTOTUNE
_FOLDER_HINT = "point --config.data.dir at a folder with {split}/<class>/*.jpg (or .jpeg/.png)"


class UnreadableImageError(errors.UsageError, ValueError):
  """An image file or record that cannot be decoded; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Sizes the trainer needs before it sees any batch (schedules, logging, eval padding)."""

  num_train_examples: int  # After config.data.train_fraction.
  num_eval_examples: int
  num_classes: int
  steps_per_epoch: int  # num_train_examples // config.batch_size (the official drop_last).
  class_names: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# The paper's subsets.


def subset_indices(
  labels: np.ndarray, fraction: float, file_names: np.ndarray | None = None
) -> np.ndarray:
  """Sorted indices of the official class-balanced subset (docs/reference/official_pytorch_code.md
  §5, `make_partial`).

  Class c's examples, sorted by file name (the official code lists each class folder sorted;
  without `file_names`: in the split's canonical order, which for an image folder is the same),
  are permuted with `np.random.default_rng(seed=c)` and the first round(n_c * fraction) kept.
  The permutation does not depend on `fraction`, so smaller subsets are nested in larger ones.
  `fraction` is in (0, 1] (configlib.validate); one that keeps no example is refused here.
  """
  labels = np.asarray(labels, np.int64)
  if labels.size and labels.min() < 0:
    raise ValueError(f"labels must be non-negative class indices, got {labels.min()}")
  if fraction == 1.0:
    return np.arange(labels.size, dtype=np.int64)
  by_name = np.arange(labels.size) if file_names is None else np.argsort(file_names, kind="stable")
  by_class = by_name[np.argsort(labels[by_name], kind="stable")]  # Within a class: by name.
  counts = np.bincount(labels)
  keep = []
  for c, members in enumerate(np.split(by_class, np.cumsum(counts)[:-1])):
    order = np.random.default_rng(seed=c).permutation(len(members))
    keep.append(members[order[: round(len(members) * fraction)]])
  out = np.sort(np.concatenate(keep)) if keep else np.zeros([0], np.int64)
  if out.size == 0:
    raise ValueError(
      f"config.data.train_fraction={fraction} leaves no training example; use a larger fraction"
    )
  return out


# ---------------------------------------------------------------------------------------------
# Sources. Both give examples as {"index", "ref", "label"} in the split's canonical order, where
# "ref" is what `fetch` turns into a uint8 image (a file path or encoded bytes).


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
    self.class_names = tuple(_class_folders(self.root, config.data.train_split, "train_split"))

  def _listing(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    return _list_folder(self.root, split, _field(split, self.train_split), self.class_names)

  def labels(self, split: str) -> np.ndarray:
    return self._listing(split)[1]

  def files_digest(self, split: str) -> str:
    """sha256 of the split's image paths (relative to the split) and sizes."""
    self._listing(split)
    return _FILES_DIGEST[(self.root, split, self.class_names)]

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


def _field(split: str, train_split: str) -> str:
  """The config field an error about `split` should name."""
  return "train_split" if split == train_split else "eval_split"


_LABEL_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}
_LISTING_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
# sha256 of each listed split's relative paths and sizes, for the workdir's data record.
_FILES_DIGEST: dict[tuple, str] = {}


def _class_folders(root: str, split: str, field: str) -> list[str]:
  split_dir = os.path.join(root, split)
  if not os.path.isdir(split_dir):
    raise errors.DataError(
      f"config.data.dir={root!r} has no {split!r} folder (config.data.{field}={split!r}); "
      + _FOLDER_HINT.format(split=split)
    )
  classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and e.name[0] != ".")
  if not classes:
    raise errors.DataError(
      f"config.data.dir={root!r}: {split_dir} has no class subfolders; "
      + _FOLDER_HINT.format(split=split)
    )
  return classes


def _list_folder(
  root: str, split: str, field: str, class_names: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
  """(paths, labels) in canonical order: classes sorted, then file names sorted."""
  folders = _class_folders(root, split, field)
  split_dir = os.path.join(root, split)
  # Cached per directory state, so repeated calls (info, train, eval) list a big folder once.
  key = (
    root,
    split,
    class_names,
    tuple(os.stat(os.path.join(split_dir, c)).st_mtime_ns for c in folders),
  )
  if key in _LISTING_CACHE:
    return _LISTING_CACHE[key]
  class_index = {name: i for i, name in enumerate(class_names)}
  unknown = [c for c in folders if c not in class_index]
  missing = [c for c in class_names if c not in folders]
  if unknown or missing:
    what = (
      f"classes {unknown[:5]} are only in {split!r}"
      if unknown
      else f"classes {missing[:5]} of the training split have no folder in {split!r}"
    )
    raise errors.DataError(
      f"config.data.dir={root!r}: {what} (config.data.{field}={split!r}); every split must have "
      "the same class folders: add or remove folders so they match"
    )
  paths, labels, sizes, unsupported = [], [], [], []
  for name in folders:
    class_dir = os.path.join(split_dir, name)
    entries = sorted(
      (e for e in os.scandir(class_dir) if e.is_file() and e.name[0] != "."), key=lambda e: e.name
    )
    for e in entries:
      if not e.name.lower().endswith(IMAGE_EXTENSIONS):
        unsupported.append(e.path)
        continue
      paths.append(e.path)
      labels.append(class_index[name])
      sizes.append(e.stat().st_size)  # One stat each: empty files and the data fingerprint.
  if unsupported:
    logging.warning(
      "Skipping %d file(s) in %s that are not %s images: %s%s. Convert them to JPEG/PNG to use "
      "them.",
      len(unsupported),
      split_dir,
      "/".join(IMAGE_EXTENSIONS),
      ", ".join(unsupported[:5]),
      ", ..." if len(unsupported) > 5 else "",
    )
  if not paths:
    raise errors.DataError(
      f"config.data.dir={root!r}: no images under {split_dir}/<class>/; "
      + _FOLDER_HINT.format(split=split)
    )
  empty = [p for p, size in zip(paths, sizes) if size == 0]  # Interrupted copies.
  if empty:
    raise UnreadableImageError(_unreadable_message(empty, "it is empty (0 bytes)"))
  out = np.array(paths), np.array(labels, np.int64)
  digest = hashlib.sha256()
  for path, size in zip(paths, sizes):
    digest.update(f"{os.path.relpath(path, split_dir)}\t{size}\n".encode())
  _LISTING_CACHE[key] = out
  _FILES_DIGEST[key[:3]] = digest.hexdigest()
  return out


def _source(config: ml_collections.ConfigDict) -> _FolderSource | _TfdsSource:
  """Opens config.data's source and checks its class count against config.data.num_classes."""
  source = _FolderSource(config) if config.data.name == "folder" else _TfdsSource(config)
  if len(source.class_names) != config.data.num_classes:
    raise errors.ConfigError(
      f"config.data.num_classes={config.data.num_classes} but the data "
      f"({config.data.name}, {config.data.dir}) has {len(source.class_names)} classes; set "
      f"--config.data.num_classes={len(source.class_names)}"
    )
  return source


def _train_subset(source: _FolderSource | _TfdsSource, config: ml_collections.ConfigDict):
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


def _steps_per_epoch(config: ml_collections.ConfigDict, num_train: int) -> int:
  """Full batches per epoch (the official drop_last); at least one, or the batch is too large."""
  steps = num_train // config.batch_size
  if steps == 0:
    raise ValueError(
      f"config.batch_size={config.batch_size} is larger than the {num_train} training examples "
      f"(config.data.train_fraction={config.data.train_fraction}); use a smaller batch or a "
      "larger fraction"
    )
  return steps


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
    steps_per_epoch=_steps_per_epoch(config, num_train),
    class_names=source.class_names,
  )


def data_fingerprint(config: ml_collections.ConfigDict, info: DatasetInfo) -> dict[str, Any]:
  """What a run trains on, recorded in its workdir so a resume on other data is refused.

  An image folder: example counts and a hash of the file list (relative paths and sizes) per
  split; a tfds dataset: its version and split counts. Both: class names and steps per epoch.
  """
  source = _source(config)
  splits = {}
  for split in dict.fromkeys((config.data.train_split, config.data.eval_split)):
    entry: dict[str, Any] = {"examples": source.count(split)}
    if isinstance(source, _FolderSource):
      entry["files_sha256"] = source.files_digest(split)
    splits[split] = entry
  record: dict[str, Any] = {"name": config.data.name}
  if isinstance(source, _TfdsSource):
    record["version"] = str(source.builder.info.version)
  record.update(
    splits=splits,
    class_names=list(info.class_names),
    num_train_examples=info.num_train_examples,
    steps_per_epoch=info.steps_per_epoch,
  )
  return record


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
  steps = _steps_per_epoch(config, num)
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
      [], preprocess.stream_key(seed, preprocess.SHUFFLE_STREAM, e), None, None, tf.int64
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


def check_split(config: ml_collections.ConfigDict, split: str, max_files: int = 20000) -> None:
  """Checks an image folder's `split` before training if it has at most `max_files` (CIFAR's
  test split), so a bad file stops the run at once rather than at its first evaluation.

  Reads only each file's first and last bytes (CIFAR's 10k test files: well under a second;
  decoding them all took 21 s on 2 cores): a file that does not start and end like a complete
  JPEG/PNG (an interrupted copy) is then decoded to make sure, so a valid file is never refused.
  A PNG's size is checked against config.data.stored_size from its header; a JPEG's, and any
  damage inside a file, are found when the file is read. Larger splits and tfds datasets are
  checked as they are read.

  Raises:
    UnreadableImageError: A file does not decode (named).
    errors.ConfigError: A PNG's size differs from config.data.stored_size (named).
  """
  if config.data.name != "folder":
    return
  paths = _FolderSource(config)._listing(split)[0]
  if len(paths) > max_files:
    return
  stored = configlib.device_resize_from(config)
  suspects, wrong = [], []
  for path in paths.tolist():
    with open(path, "rb") as f:
      head = f.read(24)
      f.seek(max(0, os.fstat(f.fileno()).st_size - 32))
      tail = f.read()
    if head.startswith(_PNG_SIGNATURE):
      complete = tail.endswith(_PNG_END)
      size = (int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big"))
      if stored and complete and size != (stored, stored):
        wrong.append(f"{path} ({size[0]}x{size[1]})")
    else:
      complete = head.startswith(b"\xff\xd8") and b"\xff\xd9" in tail
    if not complete:
      suspects.append(path)
  if suspects:
    message = _find_unreadable(config, split, None, paths=np.array(suspects))
    if message is not None:
      raise UnreadableImageError(message)
  if wrong:
    raise errors.ConfigError(_wrong_size_message(config, split, None, wrong))


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"


# ---------------------------------------------------------------------------------------------
# Unreadable inputs: found only after TensorFlow failed to decode one, whose error names no file.


def _unreadable_message(paths: list[str], why: str) -> str:
  more = f" (and {len(paths) - 1} more: {', '.join(paths[1:4])}{', ...' if len(paths) > 4 else ''})"
  return (
    f"Cannot read image file {paths[0]}: {why}{more if len(paths) > 1 else ''}. Replace or "
    "delete the file(s) and re-run the same command (a run in progress resumes from its last "
    "checkpoint)."
  )


def _decoded_shapes(paths: np.ndarray) -> dict[str, tuple[int, ...]]:
  """The decoded shape of every file that decodes, decoding in parallel."""

  def decoded_shape(path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return path, tf.shape(preprocess.decode(tf.io.read_file(path)))  # Output keeps the decode.

  ds = tf.data.Dataset.from_tensor_slices(paths).map(decoded_shape, num_parallel_calls=_AUTOTUNE)
  return {p.decode(): tuple(shape) for p, shape in ds.ignore_errors().as_numpy_iterator()}


def _wrong_sizes(config: ml_collections.ConfigDict, split: str) -> list[str]:
  stored = int(config.data.stored_size)
  paths = _FolderSource(config)._listing(split)[0]
  shapes = _decoded_shapes(paths)
  return [f"{p} ({shapes[p][0]}x{shapes[p][1]})" for p in shapes if shapes[p][:2] != (stored,) * 2]


def _wrong_size_message(
  config: ml_collections.ConfigDict, split: str, error: Exception | None, wrong=None
) -> str:
  stored = config.data.stored_size
  fix = "set --config.data.stored_size=0 (resize on the host) or resize the images"
  if config.data.name != "folder":
    cause = str(error).strip().split("\n", 1)[0][:300]
    return (
      f"config.data.stored_size={stored} but an image of split {split!r} is not: {cause}; {fix}"
    )
  wrong = _wrong_sizes(config, split) if wrong is None else wrong
  more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
  first = wrong[0] if wrong else "one of them"
  return (
    f"config.data.stored_size={stored} but image file {first}{more} is not {stored}x{stored}; {fix}"
  )


def _find_unreadable(
  config: ml_collections.ConfigDict,
  split: str,
  error: Exception | None,
  paths: np.ndarray | None = None,
) -> str | None:
  """Decodes every image of `split` (or `paths` of it) in parallel to name those TensorFlow
  cannot read (None: all decode)."""
  cause = str(error).strip().split("\n", 1)[0][:300]
  if config.data.name != "folder":
    if not any(word in str(error) for word in ("JPEG", "PNG", "ecode", "DataLoss", "corrupt")):
      return None
    return (
      f"tfds dataset {config.data.name!r} (data_dir={config.data.dir}) has a record that cannot "
      f"be decoded in split {split!r} ({type(error).__name__}: {cause}). Its prepared files are "
      "damaged: delete the dataset's directory and prepare it again."
    )
  if paths is None:
    paths = _FolderSource(config)._listing(split)[0]
  good_paths = _decoded_shapes(paths)
  bad = [p for p in paths.tolist() if p not in good_paths]
  if not bad:
    return None
  try:
    preprocess.decode(tf.io.read_file(bad[0]))
    why = "TensorFlow cannot decode it"
  except tf.errors.OpError as own_error:  # The file's own error: "Invalid PNG data, size 1586".
    why = own_error.message.split(" [Op:", 1)[0].strip()
  return _unreadable_message(bad, f"it is not a complete JPEG/PNG image: {why}")
