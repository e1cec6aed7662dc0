"""On-device image ops: uint8 crops the host ships resized in the steps, and the ImageNet recipe's
random-resized crops and eval transform of the device pipeline, against the tf.data ones."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from vitboot_jax import configlib, evaluate, kernel_sets, optim
from vitboot_jax.base import errors
from vitboot_jax.data import step_preprocess, tfdata_augment, tfdata_pipeline
from vitboot_jax.method import steps
from vitboot_jax.models.build import build_models
from vitboot_jax.state import create_state

CLASSES = ("cat", "dog")


@pytest.fixture(scope="module")
def noisy_folder(tmp_path_factory):
  """2 classes x 6 train and 3 test images of uniform noise (every pixel matters to a resize)."""
  root = tmp_path_factory.mktemp("noisy")
  rng = np.random.default_rng(0)
  for split, count in (("train", 6), ("test", 3)):
    for name in CLASSES:
      (root / split / name).mkdir(parents=True)
      for i in range(count):
        image = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        tf.io.write_file(str(root / split / name / f"{i}.png"), tf.io.encode_png(image))
  return root


def make_config(root, stored_size: int, image_size: int = 224):
  c = configlib.base_config()
  c.image_size = image_size
  c.batch_size = 4
  c.data.update(name="folder", dir=str(root), num_classes=2, normalisation="cifar10")
  c.data.update(augment="cifar", eval_batch_size=8, cache=False, stored_size=stored_size)
  return c


@pytest.mark.slow
def test_shipped_crops_resize_on_device_as_on_the_host(noisy_folder):
  device = make_config(noisy_folder, stored_size=32)
  host = make_config(noisy_folder, stored_size=0)
  assert configlib.device_resize_from(device) == 32 and not configlib.device_resize_from(host)
  prepare = jax.jit(step_preprocess.make_prepare(device))
  shipped = next(tfdata_pipeline.train_batches(device))
  want = next(tfdata_pipeline.train_batches(host))
  assert shipped["image"].dtype == np.uint8 and shipped["image"].shape == (4, 32, 32, 3)
  assert shipped["image"].nbytes // 4 == 3072
  assert want["image"].dtype == np.float32 and want["image"].shape == (4, 224, 224, 3)
  np.testing.assert_array_equal(shipped["label"], want["label"])
  np.testing.assert_allclose(prepare(shipped["image"]), want["image"], rtol=0, atol=1e-5)
  # Eval: the same on real examples (padding rows are masked out either way).
  (shipped,), (want,) = (list(tfdata_pipeline.eval_batches(c)) for c in (device, host))
  assert shipped["image"].dtype == np.uint8
  np.testing.assert_array_equal(shipped["mask"], want["mask"])
  real = want["mask"] > 0
  assert real.sum() == 6 and not real.all()
  got = np.asarray(prepare(shipped["image"]))[real]
  np.testing.assert_allclose(got, want["image"][real], rtol=0, atol=1e-5)


def test_float_images_pass_through_and_no_upscale_ships_floats(noisy_folder):
  config = make_config(noisy_folder, stored_size=32, image_size=32)
  assert configlib.device_resize_from(config) == 0  # Nothing to upscale: the host finishes it.
  images = jnp.ones((2, 32, 32, 3))
  assert step_preprocess.make_prepare(config)(images) is images
  assert step_preprocess.shipped_image(config) == ((32, 32, 3), jnp.float32)


def test_wrong_stored_size_fails_naming_the_field(noisy_folder):
  config = make_config(noisy_folder, stored_size=28)
  with pytest.raises(errors.ConfigError, match="config.data.stored_size=28"):
    next(tfdata_pipeline.train_batches(config))


def test_steps_take_uint8_batches():
  config = make_config("unused", stored_size=32, image_size=64)
  config.update(mode="shared", num_epochs=240)
  config.optim.update(lr=1e-3, weight_decay=0.05)
  config.loss.update(ce_vit=0.5, ce_agent=0.5, kd_vit=0.5, kd_agent=0.5, feature_vit=5.0)
  config.model.update(patch_size=16, embed_dim=36, depth=2, num_heads=9, mlp_dim=72, ln_eps=1e-5)
  config.agent.update(stem="small", downsample_after=(0,))
  models = build_models(config, kernel_sets.for_config(config))
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=4)
  state = jax.eval_shape(lambda: create_state(models, tx, jax.random.key(0), (64, 64, 3)))
  shape, dtype = step_preprocess.shipped_image(config)
  assert (shape, dtype) == ((32, 32, 3), jnp.uint8)
  batch = {
    "image": jax.ShapeDtypeStruct((4, *shape), dtype),
    "label": jax.ShapeDtypeStruct((4,), jnp.int32),
  }
  step = steps.make_train_step(
    config, models, tx, schedule, 4, step_preprocess.make_prepare(config)
  )
  new_state, metrics = jax.eval_shape(step, state, batch)
  assert metrics["train/loss_vit"].shape == ()
  eval_step = evaluate.make_eval_step(models, step_preprocess.make_prepare(config))
  mask = {"mask": jax.ShapeDtypeStruct((4,), jnp.float32)}
  sums = jax.eval_shape(eval_step, state.params, state.batch_stats, {**batch, **mask})
  assert sums["vit"]["top1"].shape == ()


def test_benchmark_input_reports_the_shipped_stream(noisy_folder):
  from vitboot_jax.tools.perf import benchmark_input

  row = benchmark_input.measure(make_config(noisy_folder, stored_size=32), batches=3)
  assert row["bytes_per_image"] == 32 * 32 * 3 and row["dtype"] == "uint8"
  assert row["image_shape"] == [32, 32, 3] and row["batch"] == 4 and row["img_per_s"] > 0
  row = benchmark_input.measure(make_config(noisy_folder, stored_size=0), batches=1, warmup=0)
  assert row["bytes_per_image"] == 224 * 224 * 3 * 4 and row["dtype"] == "float32"


# ---------------------------------------------------------------------------------------------
# The ImageNet recipe on the device (config.data.pipeline="device").


def test_resized_crops_are_the_hosts_crop_then_resize():
  """Every kind of box: shrink, enlarge, one of each, the whole image; mirrored or not."""
  image = np.random.default_rng(1).integers(0, 256, (40, 48, 3), dtype=np.uint8)
  crop = jax.jit(step_preprocess.resized_crop, static_argnums=2)
  boxes = [((3, 5, 30, 20), 16), ((0, 0, 40, 48), 64), ((10, 7, 12, 30), 24), ((1, 2, 8, 6), 32)]
  for box, size in boxes + [((0, 0, 40, 48), 40), ((39, 47, 1, 1), 8)]:
    cut = tf.slice(image, [box[0], box[1], 0], [box[2], box[3], 3])
    want = tfdata_augment.resize(tfdata_augment.to_float(cut), size, size).numpy()
    for flip in (False, True):
      got = crop(jnp.asarray(image), jnp.asarray(box), size, jnp.asarray(flip))
      expected = want[:, ::-1] if flip else want
      np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5, err_msg=f"{box} {flip}")


def _boxes(draws, height, width, scale=step_preprocess.IMAGENET_SCALE):
  """(tf.data's boxes, the device's boxes): int [draws, 4] of (top, left, height, width)."""
  host = next(
    tf.data.Dataset.range(draws)
    .map(
      lambda i: tf.stack(
        tfdata_augment.random_resized_crop_box(height, width, tfdata_augment.example_seed(0, 0, i))
      )
    )
    .batch(draws)
    .as_numpy_iterator()
  )
  keys = jax.random.split(jax.random.key(1), draws)
  box = functools.partial(
    step_preprocess.random_resized_crop_box, height=height, width=width, scale=scale
  )
  return host, np.asarray(jax.jit(jax.vmap(box))(keys))


@pytest.mark.slow
def test_crop_area_and_aspect_match_the_tfdata_distribution():
  """Two-sample KS tests on 4000 boxes each; 56x32 makes a third of the draws the fallback."""
  from scipy import stats

  height, width, draws = 32, 56, 4000
  host, device = _boxes(draws, height, width)

  def summary(boxes):
    area = boxes[:, 2] * boxes[:, 3] / (height * width)
    aspect = boxes[:, 3] / boxes[:, 2]
    # Where the box lies in the room it leaves (0.5: centred, as the fallback is).
    room = np.maximum(1, np.array([height, width]) - boxes[:, 2:])
    return area, aspect, boxes[:, :2] / room

  (area, aspect, where), (area_d, aspect_d, where_d) = summary(host), summary(device)
  for name, a, b in (("area", area, area_d), ("aspect", aspect, aspect_d)):
    assert stats.ks_2samp(a, b).pvalue > 1e-3, name
  for axis in (0, 1):
    assert stats.ks_2samp(where[:, axis], where_d[:, axis]).pvalue > 1e-3
  fallback = (height, round(height * 4 / 3))  # 32x43: no box fitted, the centre crop.
  shares = [np.mean((b[:, 2] == fallback[0]) & (b[:, 3] == fallback[1])) for b in (host, device)]
  assert 0.25 < shares[0] < 0.4 and abs(shares[0] - shares[1]) < 0.04, shares
  assert np.all(device[:, :2] >= 0) and np.all(device[:, :2] + device[:, 2:] <= (height, width))
  # Rounded sides: a little below 60% of the area and outside 3/4..4/3 on 32 px.
  assert area_d.min() > 0.55 and aspect_d.min() > 0.7 and aspect_d.max() < 1.4
  # The test can fail: a scale range of (0.3, 1) is told apart from the recipe's (0.6, 1).
  _, wide = _boxes(draws, height, width, scale=(0.3, 1.0))
  assert stats.ks_2samp(area, summary(wide)[0]).pvalue < 1e-6


def test_no_box_fits_falls_back_to_the_centre_crop():
  """8x64: every box of at least 60% of the area is too tall; both pipelines crop 8x11."""
  host, device = _boxes(50, 8, 64)
  want = [0, (64 - 11) // 2, 8, 11]
  assert (host == want).all() and (device == want).all()


def _imagenet_config(root, image_size):
  c = make_config(root, stored_size=0, image_size=image_size)
  c.data.update(augment="imagenet", normalisation="imagenet")
  return c


@pytest.mark.parametrize("stored", [(40, 48), (24, 20), (32, 32)])
def test_imagenet_eval_transform_on_device_is_the_hosts(stored):
  """Stored uint8 images -> short side to 37 (for 32 px), centre crop, normalised."""
  config = _imagenet_config("unused", image_size=32)
  images = np.random.default_rng(2).integers(0, 256, (3, *stored, 3), dtype=np.uint8)
  want = np.stack([tfdata_augment.make_eval_fn(config)(im).numpy() for im in images])
  got = jax.jit(step_preprocess.make_prepare(config))(jnp.asarray(images))
  assert got.shape == (3, 32, 32, 3)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_imagenet_augment_is_normalised_crops_at_the_image_size():
  config = _imagenet_config("unused", image_size=24)
  images = np.random.default_rng(3).integers(0, 256, (4, 40, 48, 3), dtype=np.uint8)
  keys = jax.random.split(jax.random.key(0), 4)
  got = jax.jit(step_preprocess.make_augment(config))(jnp.asarray(images), keys)
  assert got.dtype == jnp.float32 and got.shape == (4, 24, 24, 3)
  crops = [
    step_preprocess.random_resized_crop_flip(jnp.asarray(im), k, 24) for im, k in zip(images, keys)
  ]
  mean, std = configlib.NORMALISATION["imagenet"]
  np.testing.assert_allclose(got, (np.stack(crops) - mean) / std, rtol=0, atol=1e-5)
  assert step_preprocess.make_prepare(config)(got) is got  # The step does not touch them again.
