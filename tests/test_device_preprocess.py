"""On-device upscaling: the host ships uint8 crops at their stored size, the steps resize them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from vitboot_jax import configlib, errors, evaluate, kernel_sets, optim, steps
from vitboot_jax.data import device_preprocess, input_pipeline
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


def test_shipped_crops_resize_on_device_as_on_the_host(noisy_folder):
  device = make_config(noisy_folder, stored_size=32)
  host = make_config(noisy_folder, stored_size=0)
  assert configlib.device_resize_from(device) == 32 and not configlib.device_resize_from(host)
  prepare = jax.jit(device_preprocess.make_prepare(device))
  shipped = next(input_pipeline.train_batches(device))
  want = next(input_pipeline.train_batches(host))
  assert shipped["image"].dtype == np.uint8 and shipped["image"].shape == (4, 32, 32, 3)
  assert shipped["image"].nbytes // 4 == 3072
  assert want["image"].dtype == np.float32 and want["image"].shape == (4, 224, 224, 3)
  np.testing.assert_array_equal(shipped["label"], want["label"])
  np.testing.assert_allclose(prepare(shipped["image"]), want["image"], rtol=0, atol=1e-5)
  # Eval: the same on real examples (padding rows are masked out either way).
  (shipped,), (want,) = (list(input_pipeline.eval_batches(c)) for c in (device, host))
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
  assert device_preprocess.make_prepare(config)(images) is images
  assert device_preprocess.shipped_image(config) == ((32, 32, 3), jnp.float32)


def test_wrong_stored_size_fails_naming_the_field(noisy_folder):
  config = make_config(noisy_folder, stored_size=28)
  with pytest.raises(errors.ConfigError, match="config.data.stored_size=28"):
    next(input_pipeline.train_batches(config))


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
  shape, dtype = device_preprocess.shipped_image(config)
  assert (shape, dtype) == ((32, 32, 3), jnp.uint8)
  batch = {
    "image": jax.ShapeDtypeStruct((4, *shape), dtype),
    "label": jax.ShapeDtypeStruct((4,), jnp.int32),
  }
  step = steps.make_train_step(config, models, tx, schedule, steps_per_epoch=4)
  new_state, metrics = jax.eval_shape(step, state, batch)
  assert metrics["train/loss_vit"].shape == ()
  eval_step = evaluate.make_eval_step(models, device_preprocess.make_prepare(config))
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
