"""Tests for tfdata_pipeline.py and tfdata_augment.py on tiny folders, tfds (mocked and
prepared), CIFAR.

Every test image is a constant colour 20 + 4k, so the centre pixel of any output (even after
pad-crop-flip, which moves pixels by at most 4) tells which example k it came from.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.config_files import load_config
from vitboot_jax import configlib
from vitboot_jax.data import splits, tfdata_augment, tfdata_pipeline, tfdata_sources

MEAN, STD = configlib.NORMALISATION["cifar10"]
CLASSES = ("cat", "dog", "emu")
NUM_TRAIN_PER_CLASS, NUM_EVAL = 10, 21


def colour(k: int) -> int:
  return 20 + 4 * k


def example_ids(images: np.ndarray) -> np.ndarray:
  """Recovers k from the (normalised) centre pixel of each image."""
  value = (images[:, 16, 16, 0] * STD[0] + MEAN[0]) * 255.0
  return np.round((value - 20.0) / 4.0).astype(int)


def write_image(path, value: int) -> None:
  image = np.full([32, 32, 3], value, np.uint8)
  if str(path).endswith(".jpg"):
    data = tf.io.encode_jpeg(image, quality=100)
  else:
    data = tf.io.encode_png(image)
  tf.io.write_file(str(path), data)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """3 classes x 10 train images (k = 0..29, class-major) and 21 test images (k = 30..50)."""
  root = tmp_path_factory.mktemp("folder")
  k = 0
  for c, name in enumerate(CLASSES):
    class_dir = root / "train" / name
    class_dir.mkdir(parents=True)
    (class_dir / "notes.txt").write_text("not an image")
    for i in range(NUM_TRAIN_PER_CLASS):
      ext = ".jpg" if c == 2 and i % 2 else ".png"  # Both decoders, and mixed extensions.
      write_image(class_dir / f"{i:04d}{ext}", colour(k))
      k += 1
  for j in range(NUM_EVAL):
    class_dir = root / "test" / CLASSES[j % 3]
    class_dir.mkdir(parents=True, exist_ok=True)
    write_image(class_dir / f"{j:04d}.png", colour(k))
    k += 1
  return root


def make_config(root=None, **data):
  c = configlib.base_config()
  c.seed = 0
  c.image_size = 32
  c.batch_size = 6
  c.data.name = "folder"
  c.data.dir = None if root is None else str(root)
  c.data.num_classes = 3
  c.data.normalisation = "cifar10"
  c.data.augment = "cifar"
  c.data.eval_batch_size = 8
  c.data.cache = False
  c.data.update(data)
  return c


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Image folder: sizes, batches, order.


def test_dataset_info_and_canonical_labels(folder):
  info = tfdata_pipeline.dataset_info(make_config(folder))
  assert info == splits.DatasetInfo(30, NUM_EVAL, 3, 5, CLASSES, num_train_split=30)
  labels = tfdata_pipeline.split_labels(make_config(folder), "train")
  np.testing.assert_array_equal(labels, np.repeat([0, 1, 2], NUM_TRAIN_PER_CLASS))


def test_batches_shapes_dtypes_and_normalisation(folder):
  config = make_config(folder, augment="none")
  config.image_size = 48  # Exercises the resize; a constant image stays constant.
  batch = next(tfdata_pipeline.train_batches(config))
  assert batch["image"].shape == (6, 48, 48, 3) and batch["image"].dtype == np.float32
  assert batch["label"].shape == (6,) and batch["label"].dtype == np.int32
  ids = example_ids(batch["image"])
  np.testing.assert_array_equal(batch["label"], ids // NUM_TRAIN_PER_CLASS)
  for image, k in zip(batch["image"], ids):
    if k < 20:  # PNGs are lossless: exact normalisation.
      expected = (colour(k) / 255.0 - np.array(MEAN)) / np.array(STD)
      np.testing.assert_allclose(image, np.broadcast_to(expected, image.shape), atol=1e-5)


@pytest.mark.slow
def test_epochs_are_seeded_permutations_and_cache_is_transparent(folder):
  config = make_config(folder)
  batches = take(tfdata_pipeline.train_batches(config), 10)
  epochs = [
    np.concatenate([example_ids(b["image"]) for b in batches[e * 5 : e * 5 + 5]]) for e in (0, 1)
  ]
  for ids in epochs:
    np.testing.assert_array_equal(np.sort(ids), np.arange(30))
  assert not np.array_equal(epochs[0], epochs[1])

  again = take(tfdata_pipeline.train_batches(config), 10)
  cached = take(tfdata_pipeline.train_batches(make_config(folder, cache=True)), 10)
  for a, b, c in zip(batches, again, cached):
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["image"], c["image"])
    np.testing.assert_array_equal(a["label"], c["label"])

  other_seed = make_config(folder)
  other_seed.seed = 1
  other = next(tfdata_pipeline.train_batches(other_seed))
  assert not np.array_equal(example_ids(other["image"]), example_ids(batches[0]["image"]))


@pytest.mark.parametrize("start_step", [3, 5, 7])  # 5 steps per epoch: mid, on and past a boundary.
def test_resume_matches_uninterrupted_run(folder, start_step):
  config = make_config(folder, cache=True)
  full = take(tfdata_pipeline.train_batches(config), 11)
  resumed = take(tfdata_pipeline.train_batches(config, start_step=start_step), 11 - start_step)
  for a, b in zip(full[start_step:], resumed):
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], b["label"])


@pytest.mark.slow
def test_processes_take_disjoint_blocks_of_the_global_batch(folder):
  config = make_config(folder)
  whole = take(tfdata_pipeline.train_batches(config, process_index=0, process_count=1), 6)
  parts = [
    take(tfdata_pipeline.train_batches(config, process_index=p, process_count=2), 6) for p in (0, 1)
  ]
  for step, batch in enumerate(whole):
    a, b = parts[0][step], parts[1][step]
    assert a["image"].shape == (3, 32, 32, 3)
    assert not set(example_ids(a["image"])) & set(example_ids(b["image"]))
    np.testing.assert_array_equal(np.concatenate([a["image"], b["image"]]), batch["image"])
    np.testing.assert_array_equal(np.concatenate([a["label"], b["label"]]), batch["label"])


def test_cached_eval_dataset_decodes_once(folder, tmp_path):
  """With data.cache the eval split is decoded on the first pass only (the trainer evaluates
  every epoch); later passes give the same batches even when the files are gone."""
  import shutil

  copy = tmp_path / "copy"
  shutil.copytree(folder, copy)
  uncached = list(tfdata_pipeline.eval_batches(make_config(folder)))
  dataset = tfdata_pipeline.eval_dataset(make_config(copy, cache=True))
  first = list(dataset.as_numpy_iterator())
  shutil.rmtree(copy / "test")
  second = list(dataset.as_numpy_iterator())
  assert len(first) == len(second) == len(uncached) == 3
  for a, b, c in zip(first, second, uncached):
    for key in ("image", "label", "mask"):
      np.testing.assert_array_equal(a[key], b[key])
      np.testing.assert_array_equal(a[key], c[key])


@pytest.mark.parametrize("process_count", [1, 2])
def test_eval_sees_every_example_once_with_padding_mask(folder, process_count):
  config = make_config(folder)
  local = config.data.eval_batch_size // process_count
  per_process = [
    list(tfdata_pipeline.eval_batches(config, process_index=p, process_count=process_count))
    for p in range(process_count)
  ]
  assert len({len(batches) for batches in per_process}) == 1  # Collectives line up.
  seen = []
  for batches in per_process:
    for batch in batches:
      assert batch["image"].shape == (local, 32, 32, 3) and batch["mask"].dtype == np.float32
      real = batch["mask"] == 1.0
      assert set(np.unique(batch["mask"])) <= {0.0, 1.0}
      assert np.all(batch["image"][~real] == 0) and np.all(batch["label"][~real] == 0)
      ids = example_ids(batch["image"][real])
      np.testing.assert_array_equal(batch["label"][real], (ids - 30) % 3)
      seen.extend(ids)
  np.testing.assert_array_equal(np.sort(seen), np.arange(30, 30 + NUM_EVAL))
  assert sum(len(b) for b in per_process) == (3 if process_count == 1 else 6)


# ---------------------------------------------------------------------------------------------
# Subsets.


def reference_subset(labels, fraction):
  """The official algorithm, written as a loop over classes with list shuffles."""
  keep = []
  for c in range(max(labels) + 1):
    members = [i for i, label in enumerate(labels) if label == c]
    np.random.default_rng(seed=c).shuffle(members)
    keep.extend(members[: round(len(members) * fraction)])
  return sorted(keep)


def test_subset_indices_are_official_balanced_and_nested():
  labels = np.random.default_rng(0).integers(0, 7, size=500)
  small = splits.subset_indices(labels, 0.2)
  large = splits.subset_indices(labels, 0.5)
  np.testing.assert_array_equal(small, reference_subset(labels.tolist(), 0.2))
  np.testing.assert_array_equal(large, reference_subset(labels.tolist(), 0.5))
  np.testing.assert_array_equal(small, splits.subset_indices(labels, 0.2))
  counts = np.bincount(labels)
  np.testing.assert_array_equal(np.bincount(labels[small]), [round(n * 0.2) for n in counts])
  assert set(small) <= set(large)
  np.testing.assert_array_equal(splits.subset_indices(labels, 1.0), np.arange(500))


@pytest.mark.parametrize("fraction", [0.0, -0.1, 0.001])
def test_subset_indices_reject_bad_fractions(fraction):
  with pytest.raises(ValueError, match="config.data.train_fraction"):
    splits.subset_indices(np.array([0, 0, 1, 1, 2]), fraction)


def test_subset_in_pipeline(folder):
  config = make_config(folder, train_fraction=0.5)
  info = tfdata_pipeline.dataset_info(config)
  assert (info.num_train_examples, info.steps_per_epoch) == (15, 2)
  expected = splits.subset_indices(tfdata_pipeline.split_labels(config, "train"), 0.5)
  seen = set()
  for batch in take(tfdata_pipeline.train_batches(config), 8):  # 4 epochs of 12 of the 15.
    seen.update(example_ids(batch["image"]))
  assert seen == set(expected)


# ---------------------------------------------------------------------------------------------
# Errors name the field and the fix.


def test_errors(folder, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"config.data.dir=None not found; point --config"):
    tfdata_pipeline.dataset_info(make_config(None))
  with pytest.raises(FileNotFoundError, match="config.data.dir=.* not found"):
    tfdata_pipeline.dataset_info(make_config(tmp_path / "missing"))
  with pytest.raises(FileNotFoundError, match="config.data.eval_split='val'"):
    tfdata_pipeline.dataset_info(make_config(folder, eval_split="val"))
  (tmp_path / "train" / "cat").mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match="no images"):
    tfdata_pipeline.dataset_info(make_config(tmp_path, num_classes=1))
  with pytest.raises(ValueError, match="set --config.data.num_classes=3"):
    tfdata_pipeline.dataset_info(make_config(folder, num_classes=10))
  bad = load_config("tiny_config")
  bad.data.train_fraction = 1.5
  with pytest.raises(ValueError, match="config.data.train_fraction"):
    configlib.validate(bad)  # Checked once, at entry.
  with pytest.raises(ValueError, match="config.batch_size=6 .* multiple of 4"):
    tfdata_pipeline.train_batches(make_config(folder), process_index=0, process_count=4)
  with pytest.raises(ValueError, match="config.data.eval_batch_size"):
    tfdata_pipeline.eval_batches(make_config(folder), process_index=0, process_count=3)
  bad.data.update(train_fraction=1.0, augment="randaugment")
  with pytest.raises(ValueError, match="config.data.augment='randaugment' is unknown"):
    configlib.validate(bad)
  big = make_config(folder)
  big.batch_size = 64
  with pytest.raises(ValueError, match="config.batch_size=64 is larger"):
    tfdata_pipeline.train_batches(big)
  with pytest.raises(ValueError, match="config.data.name='no_such_dataset'"):
    tfdata_pipeline.dataset_info(make_config(tmp_path, name="no_such_dataset"))
  with pytest.raises(FileNotFoundError, match=r"not prepared .*prepare_data cifar10 --data_dir="):
    tfdata_pipeline.dataset_info(make_config(tmp_path, name="cifar10", num_classes=10))


# ---------------------------------------------------------------------------------------------
# tfds: mocked, and a tiny dataset prepared on disk (real tfrecords, split metadata, sub-splits).


@pytest.mark.slow
def test_tfds_mock_data(tmp_path):
  config = make_config(tmp_path, name="cifar10", num_classes=10, eval_batch_size=16)
  config.batch_size = 8
  with tfds.testing.mock_data(num_examples=40):
    labels = tfdata_pipeline.split_labels(config, "train")
    assert labels.shape == (40,)
    batch = next(tfdata_pipeline.train_batches(config))
    assert batch["image"].shape == (8, 32, 32, 3) and batch["label"].dtype == np.int32
    evals = list(tfdata_pipeline.eval_batches(config))
    assert [b["mask"].sum() for b in evals] == [16, 16, 8]
    config.data.train_fraction = 0.5
    info = tfdata_pipeline.dataset_info(config)
    assert info.num_train_examples == sum(round(n * 0.5) for n in np.bincount(labels))
    assert info.num_train_examples == len(splits.subset_indices(labels, 0.5))
    assert next(tfdata_pipeline.train_batches(config))["image"].shape == (8, 32, 32, 3)


class VitbootTinyImages(tfds.core.GeneratorBasedBuilder):
  """30 train / 21 test constant-colour images (k = 0..50), 3 classes."""

  VERSION = tfds.core.Version("1.0.0")
  url_infos = None  # Nothing to download; also skips tfds' search for a checksums file.

  def _info(self):
    features = tfds.features.FeaturesDict(
      {
        "image": tfds.features.Image(shape=(32, 32, 3)),
        "label": tfds.features.ClassLabel(names=list(CLASSES)),
      }
    )
    return tfds.core.DatasetInfo(
      builder=self, features=features, supervised_keys=("image", "label")
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(0, 30), "test": self._generate_examples(30, 51)}

  def _generate_examples(self, first, end):
    for k in range(first, end):
      image = np.full([32, 32, 3], colour(k), np.uint8)
      yield k, {"image": image, "label": (k // NUM_TRAIN_PER_CLASS) if k < 30 else (k - 30) % 3}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  config = tfds.download.DownloadConfig(
    try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
  )
  VitbootTinyImages(data_dir=str(data_dir)).download_and_prepare(download_config=config)
  return data_dir


@pytest.mark.slow
def test_tfds_prepared_dataset(tfds_dir):
  config = make_config(tfds_dir, name="vitboot_tiny_images", train_fraction=0.5)
  want = splits.DatasetInfo(15, 21, 3, 2, CLASSES, num_train_split=30)
  assert tfdata_pipeline.dataset_info(config) == want
  labels = tfdata_pipeline.split_labels(config, "train")  # tfds stores examples shuffled.
  expected = splits.subset_indices(labels, 0.5)
  full = take(tfdata_pipeline.train_batches(config), 6)
  seen = np.concatenate([example_ids(b["image"]) for b in full])
  assert set(seen) <= set(range(30)) and len(set(seen)) == 15
  np.testing.assert_array_equal(np.bincount(labels[expected]), [5, 5, 5])
  for b in full:
    np.testing.assert_array_equal(b["label"], example_ids(b["image"]) // NUM_TRAIN_PER_CLASS)
  resumed = take(tfdata_pipeline.train_batches(config, start_step=3), 3)
  for a, b in zip(full[3:], resumed):
    np.testing.assert_array_equal(a["image"], b["image"])

  seen, counts = [], set()
  for p in range(2):  # Each process reads its own sub-split ("test[0:10]", "test[10:21]").
    batches = list(tfdata_pipeline.eval_batches(config, process_index=p, process_count=2))
    counts.add(len(batches))
    for b in batches:
      seen.extend(example_ids(b["image"][b["mask"] == 1]))
  assert counts == {3}
  np.testing.assert_array_equal(np.sort(seen), np.arange(30, 51))


def test_tfds_data_record_is_the_version_and_split_counts(tfds_dir):
  from vitboot_jax.data import workdir_record

  config = make_config(tfds_dir, name="vitboot_tiny_images", train_fraction=0.5)
  data = workdir_record.data_fingerprint(config, tfdata_pipeline.dataset_info(config))
  assert data["version"] == str(VitbootTinyImages.VERSION)
  assert data["splits"] == {"train": {"examples": 30}, "test": {"examples": 21}}
  assert data["num_train_examples"] == 15 and data["class_names"] == list(CLASSES)


# ---------------------------------------------------------------------------------------------
# ImageNet subsets: tfds records carry their original file names (imagenet2012's `file_name`);
# the subset must hold the images the official code picks from the sorted class folders.

NAMED_PER_CLASS = 13
# Train image k (class k // 13) has file name NAMED_FILES[k]; sorted names are not in k order.
NAMED_FILES = [
  f"{name}_{n}.png"
  for name in CLASSES
  for n in np.random.default_rng(7).choice(10_000, NAMED_PER_CLASS, replace=False)
]
NAMED_TEST = 3  # Test images k = 39, 40, 41, one per class.


class VitbootNamedImages(tfds.core.GeneratorBasedBuilder):
  """A stand-in for tfds imagenet2012: images with a label and their original `file_name`."""

  VERSION = tfds.core.Version("1.0.0")
  url_infos = None

  def _info(self):
    features = tfds.features.FeaturesDict(
      {
        "image": tfds.features.Image(shape=(32, 32, 3)),
        "label": tfds.features.ClassLabel(names=list(CLASSES)),
        "file_name": tfds.features.Text(),
      }
    )
    return tfds.core.DatasetInfo(
      builder=self, features=features, supervised_keys=("image", "label")
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    test = [(len(NAMED_FILES) + c, f"test_{c}.png", c) for c in range(NAMED_TEST)]
    train = [(k, name, k // NAMED_PER_CLASS) for k, name in enumerate(NAMED_FILES)]
    return {"train": self._generate_examples(train), "test": self._generate_examples(test)}

  def _generate_examples(self, examples):
    for k, name, label in examples:
      image = np.full([32, 32, 3], colour(k), np.uint8)
      yield name, {"image": image, "label": label, "file_name": name}


@pytest.fixture(scope="module")
def named_images(tmp_path_factory):
  """The same images and file names as a prepared tfds dataset and as an image folder."""
  data_dir = tmp_path_factory.mktemp("named_tfds")
  config = tfds.download.DownloadConfig(
    try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
  )
  VitbootNamedImages(data_dir=str(data_dir)).download_and_prepare(download_config=config)
  root = tmp_path_factory.mktemp("named_folder")
  for split, examples in (
    ("train", [(k, name, k // NAMED_PER_CLASS) for k, name in enumerate(NAMED_FILES)]),
    ("test", [(len(NAMED_FILES) + c, f"test_{c}.png", c) for c in range(NAMED_TEST)]),
  ):
    for k, name, label in examples:
      class_dir = root / split / CLASSES[label]
      class_dir.mkdir(parents=True, exist_ok=True)
      write_image(class_dir / name, colour(k))
  return data_dir, root


def _selected_names(config) -> set[str]:
  source = tfdata_sources.open_source(config)
  keep = tfdata_sources.part_rows(source, config)
  if config.data.name == "folder":
    paths = source._listing(config.data.train_split)[0]
    return {str(p).rsplit("/", 1)[-1] for p in paths[keep]}
  return {n.decode() for n in source.file_names(config.data.train_split)[keep]}


def test_tfds_subset_selects_the_image_folder_images(named_images):
  data_dir, root = named_images
  tfds_names = None
  for fraction in (0.1, 0.3, 0.5, 0.8):
    folder = make_config(root, train_fraction=fraction)
    tfds_config = make_config(data_dir, name="vitboot_named_images", train_fraction=fraction)
    want = _selected_names(folder)
    assert len(want) == 3 * round(NAMED_PER_CLASS * fraction)
    assert _selected_names(tfds_config) == want, fraction
    source = tfdata_sources.open_source(tfds_config)
    tfds_names = source.file_names("train")
    assert sorted(n.decode() for n in tfds_names) == sorted(NAMED_FILES)
    # The rule applied to tfds' stored record order picks other images: what this guards.
    old_rule = splits.subset_indices(source.labels("train"), fraction)
    assert {n.decode() for n in tfds_names[old_rule]} != want, fraction

  # End to end: one epoch of the 50% subset (18 images, 3 batches of 6) sees the same images.
  seen = []
  for config in (
    make_config(root, train_fraction=0.5),
    make_config(data_dir, name="vitboot_named_images", train_fraction=0.5),
  ):
    assert tfdata_pipeline.dataset_info(config).num_train_examples == 18
    batches = take(tfdata_pipeline.train_batches(config), 3)
    seen.append(set(np.concatenate([example_ids(b["image"]) for b in batches]).tolist()))
  want = {NAMED_FILES.index(n) for n in _selected_names(make_config(root, train_fraction=0.5))}
  assert seen[0] == seen[1] == want


def test_tfds_holds_out_the_image_folder_validation_images(named_images):
  data_dir, root = named_images
  names = []
  for config in (make_config(root), make_config(data_dir, name="vitboot_named_images")):
    config.data.update(train_fraction=0.5, val_split="held_out", val_fraction=0.2)
    source = tfdata_sources.open_source(config)
    val, train = (tfdata_sources.part_rows(source, config, part) for part in ("val", "train"))
    assert len(val) == 3 * round(NAMED_PER_CLASS * 0.2) and not set(val) & set(train)
    if config.data.name == "folder":
      paths = source._listing("train")[0]
      names.append({str(p).rsplit("/", 1)[-1] for p in paths[val]})
    else:
      names.append({n.decode() for n in source.file_names("train")[val]})
  assert names[0] == names[1]


# CIFAR: tfds cifar10 has no file names but an `id` ("train_00042", the index in the original
# files); the image-folder copy numbers each class's images in that same order (NNNN.jpg).

ID_PER_CLASS = 12


class VitbootIdImages(tfds.core.GeneratorBasedBuilder):
  """A stand-in for tfds cifar10: classes interleaved, each record with its original `id`."""

  VERSION = tfds.core.Version("1.0.0")
  url_infos = None

  def _info(self):
    features = tfds.features.FeaturesDict(
      {
        "id": tfds.features.Text(),
        "image": tfds.features.Image(shape=(32, 32, 3)),
        "label": tfds.features.ClassLabel(names=list(CLASSES)),
      }
    )
    return tfds.core.DatasetInfo(
      builder=self, features=features, supervised_keys=("image", "label")
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {
      "train": self._generate_examples("train_", 36),
      "test": self._generate_examples("test_", 3),
    }

  def _generate_examples(self, prefix, n):
    for k in range(n):  # As cifar.py: keyed by the index, which tfds hashes into its order.
      image = np.full([32, 32, 3], colour(k), np.uint8)
      yield k, {"id": f"{prefix}{k:05d}", "image": image, "label": k % 3}


def test_tfds_cifar_subset_follows_the_original_order(tmp_path):
  download = tfds.download.DownloadConfig(
    try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
  )
  VitbootIdImages(data_dir=str(tmp_path / "tfds")).download_and_prepare(download_config=download)
  root = tmp_path / "folder"
  for split, n in (("train", 36), ("test", 3)):
    for k in range(n):  # Image k is number k // 3 of its class, as in the folder copy.
      class_dir = root / split / CLASSES[k % 3]
      class_dir.mkdir(parents=True, exist_ok=True)
      write_image(class_dir / f"{k // 3:04d}.png", colour(k))
  for fraction in (0.25, 0.5):
    tfds_config = make_config(tmp_path / "tfds", name="vitboot_id_images", train_fraction=fraction)
    source = tfdata_sources.open_source(tfds_config)
    ids = source.file_names("train")
    assert sorted(ids) != list(ids)  # Stored in tfds' hashed order, not the original one.
    keep = tfdata_sources.part_rows(source, tfds_config)
    from_tfds = {int(i.decode()[len("train_") :]) for i in ids[keep]}
    folder = make_config(root, train_fraction=fraction)
    paths = tfdata_sources.open_source(folder)._listing("train")[0]
    kept_paths = paths[tfdata_sources.part_rows(tfdata_sources.open_source(folder), folder)]
    from_folder = {
      3 * int(p.rsplit("/", 1)[1][:4]) + CLASSES.index(p.rsplit("/", 2)[1]) for p in kept_paths
    }
    assert from_tfds == from_folder and len(from_tfds) == 3 * round(ID_PER_CLASS * fraction)


# ---------------------------------------------------------------------------------------------
# The real CIFAR-10 folder in ../shared (counts from listings; one decoded batch).


@pytest.mark.slow
def test_real_cifar10_folder(cifar10_dir):
  config = make_config(cifar10_dir, num_classes=10, eval_batch_size=100)
  config.batch_size = 50
  info = tfdata_pipeline.dataset_info(config)
  assert (info.num_train_examples, info.num_eval_examples, info.num_classes) == (50_000, 10_000, 10)
  assert info.class_names[0] == "airplane" and info.class_names[-1] == "truck"
  labels = tfdata_pipeline.split_labels(config, "train")
  subset = splits.subset_indices(labels, 0.1)
  np.testing.assert_array_equal(np.bincount(labels[subset]), [500] * 10)
  config.data.train_fraction = 0.1
  assert tfdata_pipeline.dataset_info(config).num_train_examples == 5_000
  batch = next(tfdata_pipeline.train_batches(config))
  assert batch["image"].shape == (50, 32, 32, 3) and np.isfinite(batch["image"]).all()
  assert -3.0 < batch["image"].mean() < 3.0 and batch["image"].std() > 0.3
  evals = next(tfdata_pipeline.eval_batches(config))
  assert evals["image"].shape == (100, 32, 32, 3) and evals["mask"].all()


# ---------------------------------------------------------------------------------------------
# tfdata_augment.py


def random_image(shape=(32, 32, 3), seed=0):
  return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def test_pad_crop_flip_is_a_shift_and_maybe_a_flip_and_stateless():
  image = random_image()
  padded = np.pad(image, [(4, 4), (4, 4), (0, 0)])
  found = set()
  for s in range(24):
    seed = tf.constant([s, 7], tf.int64)
    out = tfdata_augment.pad_crop_flip(tf.constant(image), seed).numpy()
    np.testing.assert_array_equal(
      out, tfdata_augment.pad_crop_flip(tf.constant(image), seed).numpy()
    )
    matches = [
      (dy, dx, flip)
      for dy in range(9)
      for dx in range(9)
      for flip in (False, True)
      if np.array_equal(
        out, (lambda w: w[:, ::-1] if flip else w)(padded[dy : dy + 32, dx : dx + 32])
      )
    ]
    assert len(matches) == 1, matches
    found.add(matches[0])
  assert {flip for _, _, flip in found} == {False, True}
  assert len(found) > 12  # Many different offsets.


def test_train_and_eval_fns():
  config = make_config(augment="cifar")
  train_fn = tfdata_augment.make_train_fn(config)
  image = tf.constant(random_image())
  seed = tfdata_augment.example_seed(0, 3, 11)
  out = train_fn(image, seed).numpy()
  assert out.shape == (32, 32, 3) and out.dtype == np.float32
  np.testing.assert_array_equal(out, train_fn(image, seed).numpy())
  assert not np.array_equal(out, train_fn(image, tfdata_augment.example_seed(0, 4, 11)).numpy())
  evaluated = tfdata_augment.make_eval_fn(config)(image).numpy()
  np.testing.assert_allclose(evaluated * STD + np.array(MEAN), random_image() / 255.0, atol=1e-6)

  seeds = {
    tuple(tfdata_augment.example_seed(s, e, i).numpy())
    for s in (0, 1)
    for e in (0, 1)
    for i in (0, 1)
  }
  assert len(seeds) == 8


def test_imagenet_ops():
  config = make_config(augment="imagenet")
  config.image_size = 24
  image = tf.constant(random_image((40, 60, 3)))
  for s in range(5):
    seed = tf.constant([s, 0], tf.int64)
    top, left, h, w = (int(v) for v in tfdata_augment.random_resized_crop_box(40, 60, seed))
    assert 0.6 * 2400 - 60 <= h * w <= 2400 and 0 <= top <= 40 - h and 0 <= left <= 60 - w
    assert 3 / 4 - 0.1 <= w / h <= 4 / 3 + 0.1
    out = tfdata_augment.make_train_fn(config)(image, seed).numpy()
    assert out.shape == (24, 24, 3)
  # Eval: short side 40 -> round(24 * 256 / 224) = 27, long side int(27 * 60 / 40) = 40, crop 24.
  ramp = np.broadcast_to(np.arange(60, dtype=np.uint8)[None, :, None] * 4, (40, 60, 3))
  out = tfdata_augment.resize_short_centre_crop(tf.constant(ramp), 24).numpy()
  assert out.shape == (24, 24, 3)
  assert abs(out[:, 12, 0].mean() - 30 * 4 / 255) < 3 / 255  # The centre column is the centre.
  assert np.all(np.diff(out[0, :, 0]) > 0)
