"""The dataset on the devices: .npz files, batches made in the step, augmentation, TF-free runs."""

import json
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import without_tensorflow
from tests.runs import REPO, TINY
from tests.runs import env as _env
from tests.runs import metrics as _metrics
from tests.runs import train_losses as _train_losses
from vitboot_jax import configlib, sharding
from vitboot_jax.base import errors
from vitboot_jax.data import (
  device_pipeline,
  read_npz,
  splits,
  step_preprocess,
  workdir_record,
)
from vitboot_jax.tools import prepare_data


def _write_npz(root, n_train=160, n_test=40, size=32, seed=0):
  """10 classes of class-coloured noise (the models learn something in a few steps)."""
  rng = np.random.default_rng(seed)
  for split, n in (("train", n_train), ("test", n_test)):
    labels = np.repeat(np.arange(10), n // 10)
    colour = np.stack([labels * 20, 255 - labels * 20, np.full(n, 100)], -1)[:, None, None, :]
    images = np.clip(rng.integers(0, 60, (n, size, size, 3)) + colour, 0, 255).astype(np.uint8)
    read_npz.write_npz(str(root / f"{split}.npz"), images, labels)
  return root


def _config(root, **data):
  from tests.config_files import load_config

  config = load_config(TINY)
  config.data.name = "npz"
  config.data.dir = str(root)
  config.data.pipeline = "device"
  config.data.update(data)
  return config


@pytest.fixture(scope="module")
def npz_dir(tmp_path_factory):
  return _write_npz(tmp_path_factory.mktemp("npz"))


def test_npz_errors_name_the_key_dtype_and_shape(tmp_path):
  cases = {
    "keys": (dict(pixels=np.zeros([2, 4, 4, 3], np.uint8), labels=np.zeros([2])), "no ['images']"),
    "dtype": (
      dict(images=np.zeros([2, 4, 4, 3], np.float32), labels=np.zeros([2], int)),
      "float32",
    ),
    "shape": (dict(images=np.zeros([2, 4, 4], np.uint8), labels=np.zeros([2], int)), "[2, 4, 4]"),
    "labels": (dict(images=np.zeros([2, 4, 4, 3], np.uint8), labels=np.zeros([3], int)), "[3]"),
  }
  for name, (arrays, expected) in cases.items():
    np.savez(tmp_path / f"{name}.npz", **arrays)
    with pytest.raises(errors.DataError, match="must|not") as info:
      read_npz.read_npz(str(tmp_path), name)
    assert expected in str(info.value) and f"{name}.npz" in str(info.value), str(info.value)
  with pytest.raises(errors.DataError, match="has no missing.npz"):
    read_npz.read_npz(str(tmp_path), "missing")


def test_subset_and_order_are_the_tfdata_pipelines(npz_dir):
  from vitboot_jax.data import tfdata_pipeline, tfdata_sources

  config = _config(npz_dir, train_fraction=0.5)
  images, labels, index = device_pipeline.read_split(config, "train")
  all_labels = read_npz.read_npz(str(npz_dir), "train")["labels"]
  want = splits.subset_indices(all_labels, 0.5)
  np.testing.assert_array_equal(index, want)
  np.testing.assert_array_equal(labels, all_labels[want])
  # The tf.data pipeline reads the same files and selects the same examples.
  assert tfdata_pipeline.dataset_info(config).num_train_examples == len(want) == 80
  ex = list(tfdata_sources.open_source(config).examples("train", want).as_numpy_iterator())
  np.testing.assert_array_equal([e["index"] for e in ex], want)
  np.testing.assert_array_equal(np.stack([e["ref"] for e in ex]), images)


def _place(config, mesh):
  dataset = device_pipeline.DeviceDataset(config, mesh)
  return dataset, jax.jit(
    lambda data, step: device_pipeline.batch_at(
      config, data, step, dataset.info.steps_per_epoch, sharding.batch_sharded(mesh)
    )
  )


def test_batches_are_a_function_of_the_step(npz_dir):
  config = _config(npz_dir, train_fraction=0.5, augment="none")
  mesh = sharding.make_mesh()
  dataset, batch_at = _place(config, mesh)
  steps = dataset.info.steps_per_epoch
  assert steps == 5  # 80 examples, batch 16.
  arrays = device_pipeline.read_split(config, "train")
  lookup = {arr.tobytes(): i for i, arr in enumerate(arrays[0])}
  epochs = []
  for epoch in range(2):
    rows = []
    for step in range(epoch * steps, (epoch + 1) * steps):
      batch = jax.device_get(batch_at(dataset.train, step))
      assert batch["image"].dtype == np.uint8 and batch["image"].shape == (16, 32, 32, 3)
      found = [lookup[image.tobytes()] for image in batch["image"]]
      np.testing.assert_array_equal(batch["label"], arrays[1][found])
      rows += found
    assert sorted(rows) == list(range(80))  # Each example once an epoch.
    epochs.append(rows)
  assert epochs[0] != epochs[1]  # Reshuffled every epoch.
  again = jax.device_get(batch_at(dataset.train, 7))  # Same step, same batch (resume).
  np.testing.assert_array_equal(again["image"], arrays[0][epochs[1][32:48]])


@pytest.mark.slow
def test_augmentation_is_keyed_by_seed_epoch_and_index(npz_dir):
  config = _config(npz_dir, train_fraction=1.0)
  mesh = sharding.make_mesh()
  dataset, batch_at = _place(config, mesh)
  steps = dataset.info.steps_per_epoch
  raw = _config(npz_dir, train_fraction=1.0, augment="none")
  _, raw_batch_at = _place(raw, mesh)
  for step in (0, steps + 3):
    got = jax.device_get(batch_at(dataset.train, step))
    plain = jax.device_get(raw_batch_at(dataset.train, step))
    np.testing.assert_array_equal(got["label"], plain["label"])
    # Each crop is pad_crop_flip of its source image under the key of (seed, epoch, index).
    epoch = step // steps
    key = device_pipeline.stream_key(config.seed, step_preprocess.AUGMENT_STREAM, epoch)
    index = np.asarray(jax.device_get(dataset.train["index"]))
    lookup = {im.tobytes(): i for i, im in enumerate(jax.device_get(dataset.train["image"]))}
    rows = [lookup[image.tobytes()] for image in plain["image"]]
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(index[rows]))
    want = jax.jit(jax.vmap(step_preprocess.pad_crop_flip))(jnp.asarray(plain["image"]), keys)
    np.testing.assert_array_equal(got["image"], np.asarray(want))
    assert (got["image"] != plain["image"]).any()


def _recover(crops, pad=4):
  """(top, left, flipped) of pad-crop-flips of the coordinate image (pixel = (row+1, col+1, 1),
  padding 0)."""
  out = []
  for crop in np.asarray(crops).astype(np.int64):
    rows, cols = np.nonzero(crop[..., 2])
    line = cols[rows == rows[0]]
    flipped = crop[rows[0], line[0], 1] > crop[rows[0], line[-1], 1]
    view = crop[:, ::-1] if flipped else crop
    rows, cols = np.nonzero(view[..., 2])
    i, j = rows[0], cols[0]
    out.append((int(view[i, j, 0] - 1 + pad - i), int(view[i, j, 1] - 1 + pad - j), bool(flipped)))
  return out


def _coordinate_image(size=32):
  rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
  return np.stack([rows + 1, cols + 1, np.ones_like(rows)], -1).astype(np.uint8)


def _chi2_same(a, b):
  """p-value of a chi-square test that two samples of categories share one distribution."""
  from scipy import stats

  cats = sorted(set(a) | set(b))
  table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]])
  return stats.chi2_contingency(table)[1]


@pytest.mark.slow
def test_crop_offsets_and_flips_match_the_tfdata_distribution():
  import tensorflow as tf

  from vitboot_jax.data import tfdata_augment

  draws = 4000
  image = _coordinate_image()
  tf_crops = next(
    tf.data.Dataset.range(draws)
    .map(
      lambda i: tfdata_augment.pad_crop_flip(
        tf.constant(image), tfdata_augment.example_seed(0, 0, i)
      )
    )
    .batch(draws)
    .as_numpy_iterator()
  )
  keys = jax.random.split(jax.random.key(1), draws)
  batch = jnp.broadcast_to(jnp.asarray(image), (draws, *image.shape))
  jax_crops = np.asarray(jax.jit(step_preprocess.make_augment(_cifar()))(batch, keys))
  tf_draws, jax_draws = _recover(tf_crops), _recover(jax_crops)
  # Recovery is exact: the crop of the recovered offsets is the crop.
  padded = np.pad(image, [(4, 4), (4, 4), (0, 0)])
  for (top, left, flipped), crop in list(zip(jax_draws, jax_crops))[:50]:
    want = padded[top : top + 32, left : left + 32]
    np.testing.assert_array_equal(crop, want[:, ::-1] if flipped else want)
  # Both ways: offsets (81 cells x flip) have the same distribution, and each is uniform.
  assert _chi2_same(tf_draws, jax_draws) > 1e-3
  assert _chi2_same([d[2] for d in tf_draws], [d[2] for d in jax_draws]) > 1e-3
  for draws_ in (tf_draws, jax_draws):
    offsets = [d[0] * 9 + d[1] for d in draws_]
    from scipy import stats

    assert stats.chisquare(np.bincount(offsets, minlength=81)).pvalue > 1e-3
    assert 0.45 < np.mean([d[2] for d in draws_]) < 0.55
  # The test can fail: a 3-pixel pad is told apart from the tf.data 4-pixel one.
  narrow = jax.jit(jax.vmap(lambda im, k: step_preprocess.pad_crop_flip(im, k, pad=3)))
  narrow_draws = [(t + 1, left + 1, f) for t, left, f in _recover(narrow(batch, keys), pad=3)]
  assert _chi2_same(tf_draws, narrow_draws) < 1e-6


def _cifar():
  config = configlib.base_config()
  config.data.augment = "cifar"
  return config


def test_too_large_a_dataset_fails_before_training(npz_dir, monkeypatch):
  monkeypatch.setattr(device_pipeline, "free_bytes", lambda device: 100_000)
  with pytest.raises(errors.DataError) as info:
    device_pipeline.DeviceDataset(_config(npz_dir), sharding.make_mesh())
  message = str(info.value)
  assert "160 train + 40 eval images" in message and "pipeline=tfdata" in message
  assert "GiB free" in message and "\n" not in message


def test_a_wrong_stored_size_is_named_as_the_arrays_load(npz_dir):
  config = _config(npz_dir, stored_size=28)  # Below image_size: the steps would resize from 28.
  config.image_size = 64
  with pytest.raises(errors.ConfigError) as info:
    device_pipeline.DeviceDataset(config, sharding.make_mesh())
  message = str(info.value)
  assert f"{npz_dir / 'train.npz'} are 32x32, not 28x28" in message and "\n" not in message
  assert "stored_size=0" in message


def test_device_pipeline_refuses_augmentations_it_lacks(npz_dir):
  configlib.validate(_config(npz_dir, augment="imagenet", normalisation="imagenet"))
  config = _config(npz_dir, augment="autoaugment")
  with pytest.raises(errors.ConfigError, match="config.data.augment='autoaugment' is unknown"):
    configlib.validate(config)


@pytest.mark.slow
def test_imagenet_batches_are_random_resized_crops_keyed_by_seed_epoch_and_index(npz_dir):
  config = _config(npz_dir, augment="imagenet", normalisation="imagenet")
  config.image_size = 24  # Below the stored 32: the crops shrink or grow by their box.
  mesh = sharding.make_mesh()
  dataset, batch_at = _place(config, mesh)
  _, raw_batch_at = _place(_config(npz_dir, augment="none"), mesh)
  step = dataset.info.steps_per_epoch + 2
  got = jax.device_get(batch_at(dataset.train, step))
  plain = jax.device_get(raw_batch_at(dataset.train, step))
  assert got["image"].dtype == np.float32 and got["image"].shape == (16, 24, 24, 3)
  np.testing.assert_array_equal(got["label"], plain["label"])
  key = device_pipeline.stream_key(config.seed, step_preprocess.AUGMENT_STREAM, 1)
  lookup = {im.tobytes(): i for i, im in enumerate(jax.device_get(dataset.train["image"]))}
  index = np.asarray(jax.device_get(dataset.train["index"]))
  rows = [lookup[image.tobytes()] for image in plain["image"]]
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(index[rows]))
  want = jax.jit(step_preprocess.make_augment(config))(jnp.asarray(plain["image"]), keys)
  np.testing.assert_allclose(got["image"], np.asarray(want), rtol=0, atol=1e-5)
  # Evaluation: the recipe's resize and centre crop, on the devices.
  batch = next(dataset.eval_batches())
  images = jax.jit(step_preprocess.make_prepare(config))(batch["image"])
  assert batch["image"].dtype == jnp.uint8 and images.shape == (
    config.data.eval_batch_size,
    24,
    24,
    3,
  )


def test_data_record_and_test_split_check_need_no_tensorflow(image_folder, npz_dir, tmp_path):
  """What train.py records and checks before training, for a folder and an .npz, TF-free."""
  import shutil

  folder = tmp_path / "folder"
  shutil.copytree(image_folder, folder)
  bad = folder / "test" / "class2" / "001.png"
  bad.write_bytes(bad.read_bytes()[:100])  # An interrupted copy: PIL must be what finds it.
  code = (
    "import json\n"
    "from tests.config_files import load_config\n"
    "from vitboot_jax.base import errors\n"
    "from vitboot_jax.data import device_pipeline, splits, workdir_record\n"
    f"config = load_config({TINY!r})\n"
    f"config.data.update(name='folder', dir={str(folder)!r}, pipeline='device')\n"
    "info = splits.DatasetInfo(160, 40, 10, 10, tuple(f'class{c}' for c in range(10)))\n"
    "records = [workdir_record.data_fingerprint(config, info)]\n"
    "try:\n"
    "  device_pipeline.read_split(config, 'eval')\n"
    "  message = None\n"
    "except errors.UsageError as error:\n"
    "  message = str(error)\n"
    f"config.data.update(name='npz', dir={str(npz_dir)!r})\n"
    "records.append(workdir_record.data_fingerprint(config, info))\n"
    "print(json.dumps([records, message, 'tensorflow' in sys.modules]))\n"
  )
  proc = without_tensorflow.run(code)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (folder_record, npz_record), message, imported_tf = json.loads(proc.stdout.splitlines()[-1])
  assert not imported_tf
  assert message and str(bad) in message and "\n" not in message, message
  assert folder_record["splits"]["test"]["examples"] == 40
  assert len(folder_record["splits"]["train"]["files_sha256"]) == 64
  assert [s["examples"] for s in npz_record["splits"].values()] == [160, 40]
  assert len(npz_record["splits"]["test"]["arrays_sha256"]) == 64


def test_a_changed_npz_of_the_same_size_is_another_dataset(tmp_path):
  root = _write_npz(tmp_path / "data")
  config = _config(root)
  info = splits.DatasetInfo(160, 40, 10, 10, tuple(str(c) for c in range(10)))
  before = workdir_record.data_fingerprint(config, info)
  arrays = dict(np.load(root / "test.npz"))
  read_npz.write_npz(str(root / "test.npz"), arrays["images"], arrays["labels"])
  assert (
    workdir_record.data_fingerprint(config, info) == before
  )  # Same arrays, new file: same data.
  arrays["images"][0, 0, 0, 0] ^= 1
  read_npz.write_npz(str(root / "test.npz"), arrays["images"], arrays["labels"])
  after = workdir_record.data_fingerprint(config, info)
  assert after["splits"]["train"] == before["splits"]["train"]
  assert after["splits"]["test"]["arrays_sha256"] != before["splits"]["test"]["arrays_sha256"]


def test_pack_npz_from_an_image_folder(image_folder, tmp_path):
  out = tmp_path / "packed"
  prepare_data.pack_npz("folder", str(image_folder), str(out))
  arrays = read_npz.read_npz(str(out), "train")
  assert arrays["images"].shape == (160, 32, 32, 3) and arrays["labels"].tolist()[:17] == [
    0
  ] * 16 + [1]
  assert arrays["class_names"].tolist()[:2] == ["class0", "class1"]


# ---------------------------------------------------------------------------------------------
# End to end, in processes that cannot import TensorFlow.


def _main_args(workdir, root, *overrides):
  return [
    f"--config={TINY}",
    f"--workdir={workdir}",
    "--config.data.name=npz",
    f"--config.data.dir={root}",
    "--config.data.pipeline=device",
    "--config.num_epochs=2",
    "--config.checkpoint_every_steps=4",
    *overrides,
  ]


def test_tfdata_without_tensorflow_is_one_line_naming_the_extra(npz_dir, tmp_path):
  args = [a for a in _main_args(tmp_path, npz_dir) if a != "--config.data.pipeline=device"]
  proc = without_tensorflow.run_module("vitboot_jax.main", args, env=_env(1))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.startswith("error: config.data.pipeline='tfdata' (the default) needs")
  assert "pip install -e '.[tfdata]'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def device_run(npz_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("device_run")
  proc = without_tensorflow.run_module(
    "vitboot_jax.main", _main_args(workdir, npz_dir), env=_env(1)
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return workdir


@pytest.mark.slow
def test_main_trains_without_tensorflow(device_run):
  final = json.loads((device_run / "final.json").read_text())
  assert final["step"] == 20 and final["count"] == 40.0
  assert list(device_run.glob("events.out.tfevents*"))
  assert sorted(r["step"] for r in _metrics(device_run) if "eval/top1_vit" in r) == [10, 20]
  data = json.loads((device_run / "data.json").read_text())  # What a resume must match.
  assert data["name"] == "npz" and data["steps_per_epoch"] == 10
  assert len(data["splits"]["train"]["arrays_sha256"]) == 64
  assert not (device_run / "claim.json").exists()  # Released at the end.


@pytest.mark.slow
def test_resume_mid_epoch_continues_the_same_stream(device_run, npz_dir, tmp_path):
  workdir = tmp_path / "killed"
  code = without_tensorflow._REFUSE_TENSORFLOW + (
    "import runpy\n"
    f"sys.argv = ['vitboot_jax.main'] + {_main_args(workdir, npz_dir)!r}\n"
    "runpy.run_module('vitboot_jax.main', run_name='__main__', alter_sys=True)\n"
  )
  proc = subprocess.Popen(
    [sys.executable, "-c", code], cwd=REPO, env=_env(1), stderr=subprocess.PIPE
  )
  ckpt_dir, deadline = workdir / "checkpoints", time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    done = (
      [int(p.name) for p in ckpt_dir.glob("*") if p.name.isdigit()] if ckpt_dir.exists() else []
    )
    if any(s >= 4 for s in done):  # Step 4 of 10 in the first epoch.
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.05)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
  resumed = without_tensorflow.run_module(
    "vitboot_jax.main", _main_args(workdir, npz_dir), env=_env(1)
  )
  assert resumed.returncode == 0, resumed.stderr[-4000:]
  got = json.loads((workdir / "final.json").read_text())
  assert 4 <= got["resumed_from_step"] < 20 and got["resumed_from_step"] % 10
  want_losses, got_losses = _train_losses(_metrics(device_run)), _train_losses(_metrics(workdir))
  assert sorted(got_losses) == list(range(1, 21))
  for step, loss in want_losses.items():
    assert got_losses[step] == pytest.approx(loss, rel=1e-5), step
  want = json.loads((device_run / "final.json").read_text())
  for key in ("top1_vit", "top1_agent", "ce_vit", "ce_agent"):
    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
