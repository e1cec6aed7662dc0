"""A trained CNN as the ViT's frozen teacher (joint mode, teacher_cnn=NAME in the agent's place):
its pairs of stages and ViT layers, the resampled and projected hint, the frozen steps, the
teacher read from a mode=cnn run, and a teacher of other classes or size refused at start-up."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.config_files import load_config
from tests.tiny_steps import batch_of
from vitboot_jax import configlib, kernel_sets, optim
from vitboot_jax.base import errors
from vitboot_jax.data import step_preprocess
from vitboot_jax.method import losses, steps
from vitboot_jax.models import choices, cifar_resnet
from vitboot_jax.models.build import build_models
from vitboot_jax.state import create_state

STUDENT = "mode=joint,teacher_cnn=resnet20,frozen=1,form=corr"


def test_a_cnn_teachers_stages_feed_evenly_spaced_vit_layers():
  config = load_config("quickstart", STUDENT)  # A 144-wide ViT of 6 layers, 8x8 tokens.
  configlib.validate(config)
  models = build_models(config, kernel_sets.for_config(config))
  assert isinstance(models.agent, cifar_resnet.CifarResNet)
  assert models.hint_pairs == ((0, 1), (1, 3), (2, 5))  # Stage t feeds layer (t+1)*2 - 1.
  assert models.hint_projectors == {1: 16, 3: 32, 5: 64}  # ViT tokens to the stage's width.
  variables = jax.eval_shape(models.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  shapes = {k: v["kernel"].shape for k, v in variables["params"]["hint_vit"].items()}
  assert shapes == {"layer_1": (144, 16), "layer_3": (144, 32), "layer_5": (144, 64)}
  # Named pairs replace the default; the agent teacher keeps the official index pairing.
  config.loss.hint_pairs = "2:0,0:4"
  configlib.validate(config)
  models = build_models(config, kernel_sets.for_config(config))
  assert models.hint_pairs == ((2, 0), (0, 4)) and models.hint_projectors == {0: 64, 4: 16}
  agent = build_models(load_config("quickstart", "mode=joint,frozen=1"), kernel_sets.XLA)
  assert agent.hint_pairs is None and agent.hint_projectors == {}
  assert choices.spaced_pairs(3, 12) == ((0, 3), (1, 7), (2, 11))
  assert choices.spaced_pairs(4, 2) == ((2, 0), (3, 1))  # More stages than layers: the last.


def test_the_hint_reads_each_stage_on_the_vit_grid_for_its_layer_only():
  rng = np.random.default_rng(0)
  normal = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  vits = [normal(2, 1 + 16, 8) for _ in range(3)]  # 4x4 tokens, width 8.
  maps = [normal(2, 16, 16, 4), normal(2, 8, 8, 8), normal(2, 2, 2, 8)]
  projectors = {"layer_0": {"kernel": normal(8, 4), "bias": normal(4)}}
  pairs = ((0, 0), (2, 2))
  total, per_layer = losses.feature_losses(
    vits, maps, pairs=pairs, projectors=projectors, formula="corr"
  )
  assert set(per_layer) == {0, 2}
  pooled = maps[0].reshape(2, 4, 4, 4, 4, 4).mean(axis=(2, 4))  # 16x16 averaged to 4x4.
  projected = vits[0] @ projectors["layer_0"]["kernel"] + projectors["layer_0"]["bias"]
  np.testing.assert_allclose(
    per_layer[0], losses.feature_loss(projected, pooled, formula="corr"), rtol=1e-6
  )
  upsampled = losses.resample_to_grid(maps[2], (4, 4))  # 2x2 resized up to the 4x4 grid.
  assert upsampled.shape == (2, 4, 4, 8)
  np.testing.assert_allclose(
    per_layer[2], losses.feature_loss(vits[2], upsampled, formula="corr"), rtol=1e-6
  )
  np.testing.assert_allclose(total, per_layer[0] + per_layer[2], rtol=1e-6)
  # A stage no pair names does not enter; the teacher gets no gradient.
  other = losses.feature_losses(
    vits, [maps[0], maps[1] + 1, maps[2]], pairs=pairs, projectors=projectors, formula="corr"
  )
  np.testing.assert_array_equal(other[0], total)
  grad = jax.grad(lambda m: losses.feature_losses(vits, m, pairs=pairs, projectors=projectors)[0])(
    maps
  )
  assert all(not np.any(g) for g in grad)


def _setup(arg):
  config = load_config("tiny_config", arg)
  configlib.validate(config)
  models = build_models(config, kernel_sets.for_config(config))
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=4)
  state = jax.jit(lambda r: create_state(models, tx, r, (32, 32, 3)))(jax.random.key(0))
  step = steps.make_train_step(
    config, models, tx, schedule, 4, step_preprocess.make_prepare(config)
  )
  return config, models, state, jax.jit(step)


def test_a_frozen_cnn_teacher_is_unchanged_and_teaches_by_kd_and_the_hint():
  _, models, state, step = _setup(STUDENT + ",teacher_eval=1")
  assert models.hint_pairs == ((1, 0), (2, 1))  # 3 stages, a 2-layer ViT: the last two stages.
  new = state
  for seed in range(2):
    new, metrics = step(new, batch_of(n=16, seed=seed))
  jax.tree.map(np.testing.assert_array_equal, new.params["agent"], state.params["agent"])
  jax.tree.map(np.testing.assert_array_equal, new.batch_stats["agent"], state.batch_stats["agent"])
  moved = lambda a, b: jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.any(x != y)), a, b))
  assert all(moved(new.params["vit"]["head"], state.params["vit"]["head"]))
  assert all(moved(new.params["hint_vit"], state.params["hint_vit"]))
  for term in ("kd_vit", "feature_0", "feature_1", "ce_agent"):
    assert np.isfinite(float(metrics[f"train/{term}"])), term
  assert float(metrics["train/grad_norm_agent"]) == 0.0


@pytest.mark.parametrize(
  "arg, field, value, message",
  [
    ("mode=vit", "cnn.name", "resnet20", "mode 'vit' trains no CNN"),
    (STUDENT, "loss.hint_pairs", "0-1", "is not TEACHER:LAYER"),
    (STUDENT, "loss.hint_pairs", "3:0", "maps 0..2 .* not 3:0"),
    (STUDENT, "loss.hint_pairs", "0:1,1:1", "each layer at most once"),
    (STUDENT + ",layers=1", "loss.hint_pairs", "0:1", "feature_layers left at 0"),
    ("mode=joint,feature=0", "loss.hint_pairs", "0:1", "has no feature term"),
  ],
)
def test_what_the_teacher_and_pairs_cannot_be_fails_in_one_line(arg, field, value, message):
  config = load_config("tiny_config", arg)
  block, name = field.split(".")
  config[block][name] = value
  with pytest.raises(errors.ConfigError, match=message) as error:
    configlib.validate(config)
  assert "\n" not in str(error.value)


def _cnn_run(root, step=8, **fields):
  """A mode=cnn run's directory as start-up sees it (config.json, data.json, a complete step,
  final.json); `fields` ("block.name") change its config."""
  from vitboot_jax.run import workdir_rules

  config = load_config("tiny_cifar_resnet")
  for field, value in fields.items():
    block, name = field.rsplit(".", 1) if "." in field else (None, field)
    (config[block] if block else config)[name] = value
  root.mkdir(parents=True)
  (root / workdir_rules.CONFIG_FILE).write_text(config.to_json_best_effort())
  (root / workdir_rules.DATA_FILE).write_text(json.dumps({"steps_per_epoch": 10}))
  step_dir = root / workdir_rules.CHECKPOINT_SUBDIR / str(step)
  step_dir.mkdir(parents=True)
  (step_dir / workdir_rules.COMMIT_MARKER).write_text("")
  (root / workdir_rules.FINAL_FILE).write_text(json.dumps({"step": step}))
  return root


@pytest.mark.parametrize(
  "fields, student, message",
  [
    ({"data.num_classes": 100}, STUDENT, "data.num_classes=100 where this config has 10"),
    ({"image_size": 64}, STUDENT, "image_size=64 where this config has 32"),
    ({"cnn.name": "resnet56"}, STUDENT, "cnn.name='resnet56' where this config has 'resnet20'"),
    ({}, "mode=joint,frozen=1", "mode 'cnn', which has no agent.*teacher_cnn=resnet20"),
  ],
)
def test_a_teacher_that_does_not_fit_is_refused_before_anything_is_written(
  tmp_path, image_folder, fields, student, message
):
  from vitboot_jax.run import startup

  teacher = _cnn_run(tmp_path / "teacher", **fields)
  config = load_config("tiny_config", f"{student},teacher={teacher}")
  config.data.dir = str(image_folder)
  workdir = tmp_path / "student"
  with pytest.raises(errors.ConfigError, match=message) as error:
    startup.check(config, workdir, single_process=True)
  assert "\n" not in str(error.value)
  assert not workdir.exists()
  good = load_config("tiny_config", f"{STUDENT},teacher={_cnn_run(tmp_path / 'fits')}")
  assert startup.source_warnings(good) == []


@pytest.mark.slow
def test_the_teacher_is_restored_from_a_mode_cnn_runs_checkpoint(tmp_path, image_folder):
  from vitboot_jax import init_from, sharding, train

  teacher = load_config("tiny_cifar_resnet")
  teacher.data.dir = str(image_folder)
  teacher.total_steps = 2
  train.train_and_evaluate(teacher, str(tmp_path / "teacher"))
  config, models, state, _ = _setup(f"{STUDENT},teacher={tmp_path / 'teacher'}")
  shardings = jax.tree.map(lambda _: sharding.replicated(sharding.make_mesh()), state)
  tx, _ = optim.mode_optimizer(config, models.names, steps_per_epoch=4)
  new = init_from.initialise_agent(state, config, tx, shardings)
  params, stats = init_from.read_orbax_agent(str(tmp_path / "teacher"), "cnn")
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(new.params["agent"]), params)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(new.batch_stats["agent"]), stats)
  jax.tree.map(np.testing.assert_array_equal, new.params["vit"], state.params["vit"])
  assert any(
    jax.tree.leaves(
      jax.tree.map(lambda a, b: bool(np.any(a != b)), new.params["agent"], state.params["agent"])
    )
  )
