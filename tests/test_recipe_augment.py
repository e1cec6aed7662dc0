"""The field's recipe in the step (data/recipe_augment.py, models' drop path): each part's
distribution, the targets, both pipelines' inputs, the step with each switch off and on, and the
teacher's terms computed on the mixed batch."""

import functools
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import common
from tests import runs, tiny_steps
from tests.config_files import load_config
from vitboot_jax import configlib
from vitboot_jax.base.errors import ConfigError
from vitboot_jax.data import randaugment_policy, recipe_augment, step_preprocess
from vitboot_jax.models import common as model_common


def _mix(mixup=0.8, cutmix=1.0, prob=1.0, switch=0.5):
  return ml_collections.ConfigDict(
    dict(mixup_alpha=mixup, cutmix_alpha=cutmix, prob=prob, switch_prob=switch)
  )


def _draws(fn, n=4000, seed=0):
  return jax.jit(jax.vmap(fn))(jax.random.split(jax.random.key(seed), n))


@pytest.mark.parametrize("alpha", [0.8, 1.0])
def test_mixup_lambda_follows_beta_alpha_alpha(alpha):
  lam, cut = _draws(lambda k: recipe_augment.mix_choice(k, _mix(mixup=alpha, cutmix=0.0)))
  lam = np.asarray(lam)
  assert not np.asarray(cut).any()
  variance = 1 / (4 * (2 * alpha + 1))  # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
  assert abs(lam.mean() - 0.5) < 5 * np.sqrt(variance / lam.size)
  assert abs(lam.var() - variance) < 0.1 * variance
  assert lam.min() >= 0 and lam.max() <= 1


def test_deit_mixing_switches_to_cutmix_half_the_time_and_mixes_every_batch():
  lam, cut = _draws(lambda k: recipe_augment.mix_choice(k, _mix()))
  assert abs(np.asarray(cut).mean() - 0.5) < 5 * np.sqrt(0.25 / 4000)
  assert (np.asarray(lam) < 1).mean() > 0.99  # prob 1: always mixed.
  lam, cut = _draws(lambda k: recipe_augment.mix_choice(k, _mix(prob=0.3)))
  mixed = np.asarray(lam) < 1
  assert abs(mixed.mean() - 0.3) < 5 * np.sqrt(0.21 / 4000)
  assert not np.asarray(cut)[~mixed].any()  # An unmixed batch is never cut.


def _labelled_batch(n=8, size=16, classes=10):
  """Image i is the constant i (so each pixel says whose it is), label i % classes."""
  images = jnp.broadcast_to(
    jnp.arange(n, dtype=jnp.float32)[:, None, None, None], (n, size, size, 3)
  )
  labels = jnp.arange(n) % classes
  return images, recipe_augment.targets(labels, classes, 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_cutmix_box_area_is_its_lambda_and_targets_follow(seed):
  images, targets = _labelled_batch()
  n = images.shape[0]
  out, mixed, lam = jax.jit(lambda k: recipe_augment.mix_batch(images, targets, k, _mix(0.0, 1.0)))(
    jax.random.key(seed)
  )
  out, mixed, lam = np.asarray(out), np.asarray(mixed), float(lam)
  for i in range(n):
    own = (out[i] == i).mean()
    assert set(np.unique(out[i])) <= {float(i), float(n - 1 - i)}
    assert own == pytest.approx(lam, abs=1e-6) or i == n - 1 - i
  np.testing.assert_allclose(mixed.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(mixed[0, 0], lam, atol=1e-6)
  np.testing.assert_allclose(mixed[0, (n - 1) % 10], 1 - lam, atol=1e-6)


def test_cutmix_box_is_the_nominal_size_where_it_fits():
  boxes = _draws(lambda k: recipe_augment.cutmix_box(k, jnp.float32(0.75), 32, 32), n=500)
  heights = np.asarray(boxes[:, 1] - boxes[:, 0])
  # sqrt(1 - 0.75) = 1/2 of 32: 16 rows when the centre is at least 8 from both edges.
  assert heights.max() == 16 and heights.min() >= 8


def test_mixup_blends_images_and_targets_by_one_lambda():
  images, targets = _labelled_batch()
  out, mixed, lam = recipe_augment.mix_batch(images, targets, jax.random.key(1), _mix(0.8, 0.0))
  n = images.shape[0]
  expected = lam * np.arange(n) + (1 - lam) * np.arange(n)[::-1]
  np.testing.assert_allclose(np.asarray(out)[:, 0, 0, 0], expected, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(mixed).sum(-1), 1.0, atol=1e-6)


def test_label_smoothing_values():
  t = np.asarray(recipe_augment.targets(jnp.array([3, 0]), 10, 0.1))
  assert t[0, 3] == pytest.approx(0.91) and t[0, 0] == pytest.approx(0.01)
  np.testing.assert_allclose(t.sum(-1), 1.0, atol=1e-6)
  assert (np.asarray(recipe_augment.targets(jnp.array([3]), 10, 0.0))[0] == np.eye(10)[3]).all()


def test_random_erasing_replaces_one_box_with_noise_at_its_rate():
  image = jnp.zeros((32, 32, 3))
  erased = np.asarray(_draws(lambda k: recipe_augment.random_erase(image, k, 1.0), n=400))
  changed = (erased != 0).any(-1)
  area = changed.mean(axis=(1, 2))
  assert (area > 0).mean() > 0.95  # Almost always one box fits in 10 attempts.
  hit = area[area > 0]
  assert hit.min() >= 0.015 and hit.max() <= 0.36  # U(0.02, 1/3) of the area, sides rounded.
  for mask in changed[:20]:  # One rectangle: its bounding box is all changed.
    rows, cols = np.nonzero(mask)
    if rows.size:
      assert mask[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()
  noise = erased[changed]
  assert abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05  # N(0, 1) per pixel.
  some = np.asarray(_draws(lambda k: recipe_augment.random_erase(image, k, 0.25), n=2000))
  assert abs((some != 0).any(axis=(1, 2, 3)).mean() - 0.25) < 0.05
  assert not np.asarray(_draws(lambda k: recipe_augment.random_erase(image, k, 0.0), n=50)).any()


def test_drop_path_keeps_the_expectation_and_is_the_identity_in_evaluation():
  layer = model_common.DropPath(0.25)
  x = jnp.ones((20000, 4, 3))
  y = np.asarray(layer.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)}))
  dropped = (y == 0).all(axis=(1, 2))
  assert abs(dropped.mean() - 0.25) < 0.02
  assert ((y == 0) | (np.isclose(y, 1 / 0.75))).all()  # Whole images dropped, the rest scaled.
  assert abs(y.mean() - 1.0) < 0.02
  assert (np.asarray(layer.apply({}, x, deterministic=True)) == 1).all()
  assert model_common.drop_path_rates(0.1, 6) == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08, 0.1])


def _config(mode="vit", **arg):
  spec = ",".join(f"{k}={v}" for k, v in {"mode": mode, **arg}.items())
  return load_config("tiny_config", spec)


def test_recipe_deit_sets_deits_values_and_each_part_overrides():
  c = _config(recipe="deit")
  assert c.data.randaugment == randaugment_policy.DEIT_POLICY
  assert (c.data.random_erase, c.mix.mixup_alpha, c.mix.cutmix_alpha) == (0.25, 0.8, 1.0)
  assert (c.mix.prob, c.mix.switch_prob, c.loss.label_smoothing) == (1.0, 0.5, 0.1)
  assert (c.model.drop_path, c.agent.drop_path) == (0.1, 0.0)  # Mode vit has no agent.
  assert _config("shared", recipe="deit").agent.drop_path == 0.1
  assert _config("agent", recipe="deit").agent.drop_path == 0.1
  c = _config(recipe="deit", mixup=0, smoothing=0.2)
  assert (c.mix.mixup_alpha, c.loss.label_smoothing, c.mix.cutmix_alpha) == (0.0, 0.2, 1.0)
  # A frozen teacher is not trained: no drop path in it.
  c = _config("joint", recipe="deit", frozen=1, teacher="/x")
  assert (c.model.drop_path, c.agent.drop_path) == (0.1, 0.0)
  off = _config()
  assert not recipe_augment.enabled(off) and off.model.drop_path == 0 == off.agent.drop_path


def test_the_small_data_recipe_is_the_baseline_grids_winner_and_init_still_wins():
  """recipe=small_data is the config of the grid's winning row (its args and its --config flags),
  field for field; init= given still wins over the recipe's init."""
  from tests.config_files import apply_flags
  from vitboot_jax.tools.sweep import tables

  winner = next(r for r in tables.rows("baseline") if r.name == tables.BASELINE_WINNER)
  spec = "configs/quickstart.py:mode=vit,epochs=100"
  recipe = load_config(f"{spec},recipe=small_data")
  grid = apply_flags(load_config(winner.config), winner.overrides)
  assert recipe.to_dict() == grid.to_dict()
  assert recipe.model.init == "standard" and recipe.optim.clip_norm == 1.0
  assert load_config(f"{spec},recipe=small_data,init=mimetic").model.init == "mimetic"
  assert load_config(spec).model.init == "official"  # No recipe, no init=: the official one.


@pytest.mark.parametrize(
  "field, value, needle",
  [
    ("data.randaugment", "rand-m9-foo1", "unknown part 'foo1'"),
    ("data.randaugment", "rand-n0", "'n0' is out of range"),
    ("mix.mixup_alpha", -1.0, ">= 0"),
    ("mix.cutmix_alpha", -0.1, ">= 0"),
    ("mix.switch_prob", 1.5, "[0, 1]"),
    ("data.random_erase", -0.5, ">= 0"),
    ("model.drop_path", 1.0, "below 1"),
  ],
)
def test_bad_recipe_values_are_refused_naming_the_field(field, value, needle):
  c = _config()
  group, name = field.split(".")
  c[group][name] = value
  with pytest.raises(ConfigError, match=None) as error:
    configlib.validate(c)
  assert f"config.{field}=" in str(error.value) and needle in str(error.value)
  assert "\n" not in str(error.value)


def _uint8_batch(n=16, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "image": jnp.asarray(rng.integers(0, 256, (n, 32, 32, 3)), jnp.uint8),
    "label": jnp.asarray(rng.integers(0, 10, (n,)), jnp.int32),
  }


def _host_finished(config, batch):
  """What tf.data ships at 32 px: the normalised floats of the same crops."""
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  x = np.asarray(batch["image"], np.float32) / 255.0
  return {**batch, "image": jnp.asarray((x - np.array(mean)) / np.array(std), jnp.float32)}


def test_the_same_key_gives_the_same_batch_from_both_pipelines():
  config = _config(recipe="deit")
  batch_fn = jax.jit(recipe_augment.make_batch_fn(config, step_preprocess.make_prepare(config)))
  device = _uint8_batch()
  key = jax.random.key(5)
  a, b = batch_fn(device, key), batch_fn(_host_finished(config, device), key)
  np.testing.assert_allclose(np.asarray(a["image"]), np.asarray(b["image"]), atol=2e-5)
  np.testing.assert_array_equal(np.asarray(a["target"]), np.asarray(b["target"]))
  again = batch_fn(device, key)
  np.testing.assert_array_equal(np.asarray(again["image"]), np.asarray(a["image"]))
  other = batch_fn(device, jax.random.key(6))
  assert not np.allclose(np.asarray(other["image"]), np.asarray(a["image"]))
  assert a["image"].shape == (16, 32, 32, 3) and a["image"].dtype == jnp.float32


def test_recipe_off_is_prepare_alone():
  config = _config()
  batch = _uint8_batch()
  out = recipe_augment.make_batch_fn(config, step_preprocess.make_prepare(config))(
    batch, jax.random.key(0)
  )
  assert set(out) == {"image", "label"}
  prepared = step_preprocess.make_prepare(config)(batch["image"])
  np.testing.assert_array_equal(np.asarray(out["image"]), np.asarray(prepared))


@functools.cache
def _step_metrics(mode, items):
  config, models, tx, state, step = tiny_steps.setup(mode, **dict(items))
  state, metrics = jax.jit(step)(state, tiny_steps.batch_of(16))
  return jax.device_get(metrics), jax.device_get(state.params)


SWITCH_FIELDS = {
  "randaug": ("data.randaugment", randaugment_policy.DEIT_POLICY),
  "erase": ("data.random_erase", 0.25),
  "mixup": ("mix.mixup_alpha", 0.8),
  "cutmix": ("mix.cutmix_alpha", 1.0),
  "smoothing": ("loss.label_smoothing", 0.1),
  "drop_path": ("model.drop_path", 0.1),
}


@pytest.mark.parametrize("switch", sorted(SWITCH_FIELDS))
def test_each_switch_changes_the_step_and_its_off_value_does_not(switch):
  field, on = SWITCH_FIELDS[switch]
  off_value = "" if switch == "randaug" else 0.0
  base, base_params = _step_metrics("vit", ())
  off, off_params = _step_metrics("vit", ((field, off_value),))
  jax.tree.map(np.testing.assert_array_equal, off_params, base_params)
  assert off["train/loss_vit"] == base["train/loss_vit"]
  changed, _ = _step_metrics("vit", ((field, on),))
  assert changed["train/loss_vit"] != base["train/loss_vit"]


def test_teachers_terms_are_computed_on_the_mixed_batch():
  """Joint with the recipe: the step equals the plain step fed the recipe's batch, so the KD
  targets and the hint come from the agent's outputs on the same augmented, mixed images."""
  on = {"data.randaugment": randaugment_policy.DEIT_POLICY, "mix.mixup_alpha": 0.8}
  on |= {"mix.cutmix_alpha": 1.0, "loss.label_smoothing": 0.1, "data.random_erase": 0.25}
  config, models, tx, state, step = tiny_steps.setup("joint", **on)
  _, _, _, state_off, step_off = tiny_steps.setup("joint")
  batch = _uint8_batch()
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  mixed = recipe_augment.make_batch_fn(config, step_preprocess.make_prepare(config))(batch, rng)
  assert not np.allclose(
    np.asarray(mixed["image"]), np.asarray(_host_finished(config, batch)["image"])
  )
  _, with_recipe = jax.jit(step)(state, batch)
  _, fed_mixed = jax.jit(step_off)(state_off, mixed)
  for key in ("train/kd_vit", "train/kd_agent", "train/feature", "train/ce_vit", "train/ce_agent"):
    np.testing.assert_allclose(with_recipe[key], fed_mixed[key], rtol=1e-5, err_msg=key)


def test_no_paper_row_uses_the_recipe():
  for name in ("vits_cifar100", "vitb_cifar10", "vits_imagenet", "quickstart"):
    for mode in ("vit", "agent", "joint", "shared"):
      c = load_config(name, f"mode={mode}")
      assert not recipe_augment.enabled(c), (name, mode)
      assert c.model.drop_path == 0 == c.agent.drop_path, (name, mode)
  assert common.RECIPES["none"]["drop_path"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["tfdata", "device"])
def test_the_recipe_trains_the_quickstart_vit_on_both_pipelines(pipeline, image_folder, tmp_path):
  workdir = tmp_path / "run"
  runs.run(
    workdir,
    image_folder,
    "--config.data.name=folder",
    f"--config.data.pipeline={pipeline}",
    "--config.total_steps=6",
    "--config.eval_every_steps=6",
    "--config.batch_size=16",
    "--config.data.train_fraction=1.0",
    devices=2,
    config=f"{runs.REPO / 'configs' / 'quickstart.py'}:mode=vit,recipe=deit",
  )
  recorded = json.loads((workdir / "config.json").read_text())
  assert recorded["data"]["randaugment"] == randaugment_policy.DEIT_POLICY
  assert recorded["mix"]["cutmix_alpha"] == 1.0 and recorded["model"]["drop_path"] == 0.1
  final = json.loads((workdir / "final.json").read_text())
  assert final["step"] == 6 and np.isfinite(final["ce_vit"])
  losses = list(runs.train_losses(runs.metrics(workdir)).values())
  assert len(losses) >= 6 and np.isfinite(losses).all()
