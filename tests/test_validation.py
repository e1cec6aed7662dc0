"""The validation split (config.data.val_split): held out of the training split, disjoint from
the training rows, class-balanced, the same images every run, on both pipelines and every
source, refused where it would overlap; evaluations report it beside the test split."""

import json

import numpy as np
import pytest

from tests.config_files import load_config
from tests.runs import TINY, run
from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.data import device_pipeline, read_npz, splits, tfdata_pipeline

CLASSES = ("ant", "bee", "cow")
PER_CLASS = {"train": 20, "test": 4}


def held_out(train_fraction=1.0, val_fraction=0.25, **data):
  c = configlib.base_config()
  c.data.update(train_fraction=train_fraction, val_split="held_out", val_fraction=val_fraction)
  c.data.update(data)
  return c


# ---------------------------------------------------------------------------------------------
# The rows.


def test_held_out_rows_are_disjoint_balanced_and_the_same_for_every_fraction():
  labels = np.random.default_rng(0).integers(0, 7, size=700)
  counts = np.bincount(labels)
  val = splits.validation_rows(held_out(0.2, 0.3), labels)
  np.testing.assert_array_equal(np.bincount(labels[val]), [round(n * 0.3) for n in counts])
  for fraction in (0.1, 0.2, 0.5, 0.7):
    config = held_out(fraction, 0.3)
    train = splits.training_rows(config, labels)
    # The paper's subset is untouched by holding validation out, and never meets it.
    np.testing.assert_array_equal(train, splits.subset_indices(labels, fraction))
    assert not set(train) & set(val)
    np.testing.assert_array_equal(splits.validation_rows(config, labels), val)
  # train_fraction=1.0 trains on every image not held out.
  train = splits.training_rows(held_out(1.0, 0.3), labels)
  np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.arange(700))


def test_file_names_order_the_held_out_rows_as_the_subset():
  """A source in another stored order (tfds) holds out the same named images."""
  names = np.array([f"{k:03d}" for k in range(60)])
  labels = np.arange(60) % 3
  shuffled = np.random.default_rng(1).permutation(60)
  config = held_out(0.5, 0.2)
  want = set(names[splits.validation_rows(config, labels)])
  got = splits.validation_rows(config, labels[shuffled], names[shuffled])
  assert set(names[shuffled][got]) == want


def test_without_validation_the_rows_are_the_subset():
  labels = np.arange(90) % 3
  config = configlib.base_config()
  config.data.train_fraction = 0.4
  whole = configlib.base_config()
  assert splits.takes_rows(held_out(1.0, 0.1)) and splits.takes_rows(config)
  assert not splits.takes_rows(whole)
  np.testing.assert_array_equal(splits.training_rows(whole, labels), np.arange(90))
  np.testing.assert_array_equal(
    splits.training_rows(config, labels), splits.subset_indices(labels, 0.4)
  )
  assert splits.validation_split(config) is None


def test_a_validation_that_overlaps_the_training_subset_is_refused_in_one_line():
  labels = np.arange(60) % 3
  with pytest.raises(errors.ConfigError) as error:
    splits.training_rows(held_out(0.9, 0.2), labels, class_names=CLASSES)
  message = str(error.value)
  assert "\n" not in message
  assert "config.data.val_fraction=0.2" in message and "train_fraction=0.9" in message
  assert "class 'ant' has 20 images, 18 to train on and 4 held out" in message
  assert "train_fraction <= 0.8" in message


@pytest.mark.parametrize(
  ("data", "message"),
  [
    (dict(val_split="test"), "is the test split"),
    (dict(val_split="train"), "is the training split itself"),
    (dict(val_split="held_out", val_fraction=0.0), "val_fraction=0.0 must be in (0, 1)"),
    (dict(val_split="held_out", val_fraction=1.0), "val_fraction=1.0 must be in (0, 1)"),
  ],
)
def test_validate_refuses_a_validation_split_that_is_not_one(data, message):
  config = load_config(TINY)
  config.data.update(data)
  with pytest.raises(errors.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    configlib.validate(config)


# ---------------------------------------------------------------------------------------------
# Every source and both pipelines read the same validation images.


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """3 classes x 20 train + 4 test PNGs of constant colours: the pixel says which image it is."""
  from PIL import Image

  root = tmp_path_factory.mktemp("val_folder")
  k = 0
  for split, n in PER_CLASS.items():
    for name in CLASSES:
      (root / split / name).mkdir(parents=True)
      for i in range(n):
        Image.fromarray(np.full([32, 32, 3], k, np.uint8)).save(root / split / name / f"{i}.png")
        k += 1
  return root


def folder_config(root, **data):
  config = load_config(TINY)
  config.data.update(
    dir=str(root), num_classes=3, val_split="held_out", val_fraction=0.25, train_fraction=0.5
  )
  config.data.update(data)
  config.data.eval_batch_size = 8
  config.batch_size = 6
  return config


def ids_of(images) -> list[int]:
  return sorted(int(image[0, 0, 0]) for image in images)


def test_both_pipelines_and_sources_read_the_same_validation(folder, tmp_path):
  config = folder_config(folder)
  images, labels, index = device_pipeline.read_split(config, "val")
  assert len(labels) == 15 and np.bincount(labels).tolist() == [5, 5, 5]
  want = ids_of(images)
  train_images, _, train_index = device_pipeline.read_split(config, "train")
  assert len(train_index) == 30 and not set(ids_of(train_images)) & set(want)
  assert not set(index.tolist()) & set(train_index.tolist())

  # tf.data, as the training loop evaluates it: padded batches, masked.
  config.image_size, config.data.stored_size = 32, 32
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  seen = []
  for batch in tfdata_pipeline.eval_batches(config, part="val"):
    real = batch["image"][batch["mask"] == 1][:, 0, 0, 0]
    seen.extend(np.round((real * std[0] + mean[0]) * 255).astype(int).tolist())
  assert sorted(seen) == want

  # The same images as .npz arrays.
  npz = tmp_path / "npz"
  whole = folder_config(folder, val_split="", train_fraction=1.0)
  for split in ("train", "test"):
    whole.data.eval_split = split
    arrays = device_pipeline.read_split(whole, "eval")
    read_npz.write_npz(read_npz.npz_path(str(npz), split), arrays[0], arrays[1])
  npz_config = folder_config(npz, name="npz")
  assert ids_of(device_pipeline.read_split(npz_config, "val")[0]) == want

  # The device pipeline's on-device batches.
  import jax

  from vitboot_jax import sharding

  dataset = device_pipeline.DeviceDataset(config, sharding.make_mesh(jax.devices()[:1]))
  assert (dataset.info.num_val_examples, dataset.info.num_train_examples) == (15, 30)
  on_device = []
  for batch in dataset.eval_batches("val"):
    real = np.asarray(batch["mask"]) == 1
    on_device.extend(int(x) for x in np.asarray(batch["image"])[real][:, 0, 0, 0])
  assert sorted(on_device) == want
  info = tfdata_pipeline.dataset_info(config)
  assert (info.num_val_examples, info.num_train_examples, info.num_train_split) == (15, 30, 60)
  assert splits.describe(config, info) == (
    "30 of 60 training images in 3 classes (config.data.train_fraction=0.5), 15 held out for "
    "validation (config.data.val_fraction=0.25), 12 test ('test')"
  )


def test_a_validation_folder_of_its_own(folder, tmp_path):
  """config.data.val_split=NAME reads ROOT/NAME/<class>/ whole; training keeps every image."""
  import shutil

  root = tmp_path / "with_val"
  shutil.copytree(folder, root)
  shutil.copytree(root / "test", root / "val")
  config = folder_config(root, val_split="val", train_fraction=1.0)
  info = tfdata_pipeline.dataset_info(config)
  assert (info.num_train_examples, info.num_val_examples) == (60, 12)
  assert splits.describe(config, info).endswith(
    "in 3 classes (all of them), 12 validation ('val'), 12 test ('test')"
  )
  assert ids_of(device_pipeline.read_split(config, "val")[0]) == list(range(60, 72))


# ---------------------------------------------------------------------------------------------
# A run evaluates both and says what it trains on.


@pytest.mark.slow
def test_a_run_reports_validation_beside_test(image_folder, tmp_path):
  workdir = tmp_path / "run"
  proc = run(
    workdir,
    image_folder,
    "--config.mode=vit",
    "--config.num_epochs=1",
    "--config.data.val_split=held_out",
    "--config.data.val_fraction=0.25",
    "--config.data.pipeline=device",
    "--config.data.stored_size=32",
  )
  line = (
    "Data: 120 of 160 training images in 10 classes (every image not held out), 40 held out "
    "for validation (config.data.val_fraction=0.25), 40 test ('test')."
  )
  assert line in proc.stderr
  records = [json.loads(r) for r in (workdir / "metrics.jsonl").read_text().splitlines()]
  evaluated = [r for r in records if "eval/top1_vit" in r]
  assert evaluated and all(r["val/count"] == 40 and r["eval/count"] == 40 for r in evaluated)
  final = json.loads((workdir / "final.json").read_text())
  assert final["val_top1_vit"] == evaluated[-1]["val/top1_vit"]
  assert final["top1_vit"] == evaluated[-1]["eval/top1_vit"]
  data = json.loads((workdir / "data.json").read_text())
  assert data["validation"] == {
    "split": "train",
    "held_out": True,
    "examples": 40,
    "val_fraction": 0.25,
  }
  assert data["summary"] + "." == line.removeprefix("Data: ")
  assert "validation vit" in proc.stderr  # The evaluation's line names both.
