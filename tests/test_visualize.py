"""The figure tool: PNG helpers, every figure of a fresh init and of a trained checkpoint."""

import json
import os
import pathlib
import re
import subprocess
import sys
from unittest import mock

import jax
import numpy as np
import pytest
import tensorflow as tf

from tests import tiny_config
from vitboot_jax import kernel_sets
from vitboot_jax.base import errors
from vitboot_jax.models import common
from vitboot_jax.tools import figures, visualize

REPO = pathlib.Path(__file__).resolve().parents[1]
LAYERS = 2  # vit_tiny's depth.
HEADS = 9
TILE = 128  # 32-px images up-sampled x4 to figures.MIN_TILE.
PAD = figures.PAD


def _grid_shape(rows, cols, size=TILE, pad=PAD):
  return (rows * (size + pad) + pad, cols * (size + pad) + pad, 3)


def _figure_shape(rows, cols):
  """(height, width) of a figure of rows x cols panels: matplotlib's, or the plain tiles'."""
  if figures._matplotlib() is None:
    return _grid_shape(rows, cols)[:2]
  return figures.figure_pixels(rows, cols)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
  """2 classes x 4 random 32x32 PNGs in train and test."""
  root = tmp_path_factory.mktemp("folder")
  rng = np.random.default_rng(0)
  for split in ("train", "test"):
    for c in range(2):
      d = root / split / f"class{c}"
      d.mkdir(parents=True)
      for i in range(4):
        img = rng.integers(0, 60, (32, 32, 3)) + np.array([c * 150, 100, 200 - c * 150])
        (d / f"{i}.png").write_bytes(
          tf.io.encode_png(np.clip(img, 0, 255).astype(np.uint8)).numpy()
        )
  return root


def _config(folder, **model):
  config = tiny_config.get_config("classes=2")
  config.data.dir = str(folder)
  config.batch_size = 8  # 8 training images; a multiple of the 8 test devices.
  config.data.eval_batch_size = 8
  config.model.update(model)
  return config


def _expected_files():
  files = []
  for layer in range(LAYERS):
    files += [f"attention_layer{layer}.png", f"attention_heads_layer{layer}.png"]
  files += [f"features_vit_layer{layer}.png" for layer in range(LAYERS)]
  files += [f"features_agent_layer{layer}.png" for layer in range(LAYERS)]
  return files


def _decode(path):
  return tf.io.decode_png(pathlib.Path(path).read_bytes()).numpy()


@pytest.fixture(scope="module")
def fresh(image_folder, tmp_path_factory):
  """(out dir, result, variables) of one run on the fresh init; the init compiles once."""
  out = tmp_path_factory.mktemp("fresh")
  loaded = []

  def spy(*args, **kwargs):
    loaded.append(load(*args, **kwargs))
    return loaded[-1]

  load = visualize.load_variables
  with mock.patch.object(visualize, "load_variables", spy):
    result = visualize.run(_config(image_folder), str(out), num_images=2)
  return out, result, loaded[0][0]


@pytest.fixture(scope="module")
def trained_run(image_folder, tmp_path_factory):
  """A shared-mode run trained for 2 steps; its only checkpoint is the final one."""
  from vitboot_jax import train

  workdir = tmp_path_factory.mktemp("run")
  config = _config(image_folder)
  config.num_epochs = 2  # One step per epoch with 8 images at batch 8.
  config.total_steps = 2
  config.checkpoint_every_steps = 100  # Only the final (forced) save.
  train.train_and_evaluate(config, str(workdir))
  return config, workdir


# ---------------------------------------------------------------------------------------------
# Helpers.


def test_colourise_maps_min_and_max_to_the_table_ends():
  image = figures.colourise(np.array([[0.0, 1.0], [2.0, 4.0]]))
  assert image.shape == (2, 2, 3) and image.dtype == np.uint8
  np.testing.assert_array_equal(image[0, 0], [68, 1, 84])
  np.testing.assert_array_equal(image[1, 1], [253, 231, 37])
  # A constant or NaN map is one colour, not a crash.
  assert len(np.unique(figures.colourise(np.full((3, 3), 5.0)).reshape(-1, 3), axis=0)) == 1
  assert figures.colourise(np.array([[np.nan, 1.0]])).dtype == np.uint8
  with pytest.raises(ValueError, match="2-D"):
    figures.colourise(np.zeros((2, 2, 2)))


def test_tile_and_upsample_shapes():
  ims = [np.full((4, 6, 3), i, np.uint8) for i in range(5)]
  grid = figures.tile(ims, cols=2, pad=1)
  assert grid.shape == (3 * 5 + 1, 2 * 7 + 1, 3)
  np.testing.assert_array_equal(grid[1:5, 8:14], 1)  # Second tile of the first row.
  assert grid[0, 0, 0] == 255 and grid[-2, -2, 0] == 255  # Frame and the empty sixth slot.
  with pytest.raises(ValueError, match="one shape"):
    figures.tile([np.zeros((2, 2, 3), np.uint8), np.zeros((3, 2, 3), np.uint8)], cols=2)
  up = figures.upsample(np.arange(4).reshape(2, 2), 4, 6)
  np.testing.assert_array_equal(up[:2, :3], 0)
  np.testing.assert_array_equal(up[2:, 3:], 3)


def test_save_png_round_trips(tmp_path):
  image = np.random.default_rng(0).integers(0, 256, (5, 7, 3)).astype(np.uint8)
  figures.save_png(tmp_path / "x.png", image)
  np.testing.assert_array_equal(_decode(tmp_path / "x.png"), image)


# ---------------------------------------------------------------------------------------------
# The tool.


@pytest.mark.slow
def test_fresh_init_writes_every_figure(fresh):
  out, result, _ = fresh
  assert result.step is None
  assert result.files == _expected_files()
  index = json.loads((out / "index.json").read_text())
  assert index["files"] == _expected_files() and index["step"] is None
  assert index["images"] == ["test[0]", "test[1]"]
  assert sorted(os.listdir(out)) == sorted([*_expected_files(), "index.json"])
  for name in result.files:
    image = _decode(out / name)[..., :3]
    if name.startswith("attention_heads"):
      # Input + 9 heads in rows of HEAD_COLUMNS.
      assert image.shape[:2] == _figure_shape(2, figures.HEAD_COLUMNS), name
    else:
      assert image.shape[:2] == _figure_shape(2, 3), name  # 2 images x (input, map, overlay).
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 10, name  # Not blank.


def test_figures_have_titles_axis_labels_and_colour_bars():
  pytest.importorskip("matplotlib")
  rng = np.random.default_rng(0)
  pictures = rng.integers(0, 256, (2, 16, 16, 3)).astype(np.uint8)
  maps = rng.random((2, 4, 4))
  fig = figures.rows_figure(
    pictures, maps, "block 0", "mean over heads", "probability", "patch", side=8
  )
  assert fig.get_suptitle() == "block 0"
  colour_bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
  assert len(colour_bars) == 2 and colour_bars[0].get_ylabel() == "probability"
  panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
  assert [ax.get_title() for ax in panels] == ["input", "mean over heads", "overlay"] * 2
  assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in panels[:3]] == [
    ("x (px)", "y (px)"),
    ("patch column", "patch row"),
    ("x (px)", "y (px)"),
  ]
  # Up-sampled tiles, axes in the model input's pixels (an 8-px input shown at 16 px).
  assert panels[0].get_xlim() == (0.0, 8.0) and panels[2].get_xlim() == (0.0, 8.0)
  heads = figures.heads_figure(pictures[0], rng.random((9, 4, 4)), "heads", side=8)
  assert heads.get_suptitle() == "heads"
  assert [ax.get_label() for ax in heads.axes].count("<colorbar>") == 1  # One shared scale.
  assert [ax.get_title() for ax in heads.axes[1:10]] == [f"head {h}" for h in range(9)]


def test_without_matplotlib_the_figures_are_plain_tiles(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(figures, "_matplotlib", lambda: None)
  rng = np.random.default_rng(0)
  pictures = rng.integers(0, 256, (2, TILE, TILE, 3)).astype(np.uint8)
  attention = [rng.random((2, HEADS, 17, 17))]
  vit_maps = [rng.random((2, 4, 4))]
  files = figures.write_figures(str(tmp_path), pictures, attention, vit_maps, [], side=32)
  assert files == ["attention_layer0.png", "attention_heads_layer0.png", "features_vit_layer0.png"]
  assert _decode(tmp_path / files[0]).shape == _grid_shape(2, 3)
  assert _decode(tmp_path / files[1]).shape == _grid_shape(2, figures.HEAD_COLUMNS)
  note = capsys.readouterr().err.strip().splitlines()
  assert len(note) == 1 and "matplotlib is not installed" in note[0]


@pytest.mark.slow
def test_maps_have_the_models_shapes_and_attention_rows_sum_to_one(fresh):
  _, result, _ = fresh
  assert result.images.shape == (2, 32, 32, 3)
  assert len(result.attention) == LAYERS
  for probs in result.attention:
    assert probs.shape == (2, HEADS, 17, 17)  # 4x4 patches + cls.
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert (probs >= 0).all()
  assert [m.shape for m in result.vit_maps] == [(2, 4, 4)] * LAYERS
  assert len(result.agent_maps) == LAYERS
  assert all(m.ndim == 3 and m.shape[0] == 2 for m in result.agent_maps)


def _captured_attention(config, variables, images):
  """The model's own attention probabilities: the output of each attn's (identity) dropout."""
  from vitboot_jax.models.build import build_models

  vit = build_models(config, kernel_sets.for_config(config)).vit
  _, state = vit.apply(
    {"params": variables["params"]["vit"]},
    images,
    train=False,
    capture_intermediates=lambda module, _: isinstance(module, common.Dropout),
    mutable=["intermediates"],
  )
  inter = state["intermediates"]
  return [
    np.asarray(inter[f"block_{i}"]["attn"]["Dropout_0"]["__call__"][0]) for i in range(LAYERS)
  ]


@pytest.mark.parametrize("attention", ["softmax", "entmax"])
@pytest.mark.slow
def test_attention_is_the_one_a_forward_pass_computes(image_folder, fresh, attention):
  from vitboot_jax.models.build import build_models

  config = visualize.inspection_config(_config(image_folder, attention=attention))
  models = build_models(config, kernel_sets.for_config(config))
  variables = jax.tree.map(np.asarray, fresh[2])
  if attention == "entmax":  # The softmax tree plus one alpha per layer, away from its init.
    for i in range(LAYERS):
      variables["params"]["vit"][f"block_{i}"]["attn"]["entmax_alpha"] = np.float32(1.3 + 0.4 * i)
  images = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype(np.float32)
  ours, _, _ = visualize.compute_maps(config, models, variables, images)
  for got, want in zip(ours, _captured_attention(config, variables, images)):
    np.testing.assert_allclose(got, want, atol=2e-5)
  if attention == "entmax":
    assert (ours[0] == 0).any()  # Sparse, as entmax attention should be.


def test_image_files_are_preprocessed_like_eval(image_folder, tmp_path):
  files = []
  for i, (h, w) in enumerate([(48, 40), (32, 32)]):
    path = tmp_path / f"in{i}.png"
    path.write_bytes(tf.io.encode_png(np.full((h, w, 3), 200, np.uint8)).numpy())
    files.append(str(path))
  images, names = visualize.load_images(_config(image_folder), 0, files)
  assert names == files and images.shape == (2, 32, 32, 3)
  mean, std = visualize.configlib.NORMALISATION["cifar10"]
  np.testing.assert_allclose(
    images[:, 5, 5], np.tile((200 / 255 - np.array(mean)) / std, (2, 1)), rtol=1e-5
  )
  np.testing.assert_array_equal(visualize.denormalise(_config(image_folder), images), 200)


@pytest.mark.slow
def test_sampled_images_are_drawn_from_the_whole_split_not_its_first_class(image_folder):
  config = _config(image_folder)
  split, split_labels = visualize.sample_images(config, 8)  # All 8, in the split's order.
  np.testing.assert_array_equal(split_labels, [0, 0, 0, 0, 1, 1, 1, 1])
  seen = set()
  for seed in range(20):
    images, labels = visualize.sample_images(config, 4, seed=seed)
    at = [int(np.flatnonzero((split == image).all(axis=(1, 2, 3)))[0]) for image in images]
    assert at == sorted(at) and len(set(at)) == 4  # Distinct examples, in the split's order.
    np.testing.assert_array_equal(labels, split_labels[at])
    seen.update(at)
  assert seen == set(range(8))  # The first four (one class) would never reach past index 3.
  again = visualize.sample_images(config, 4, seed=19)
  np.testing.assert_array_equal(again[0], images)
  with pytest.raises(visualize.errors.UsageError, match="has only 8"):
    visualize.sample_images(config, 9)


def test_a_workdir_needs_its_config_and_a_checkpoint_and_is_left_untouched(image_folder, tmp_path):
  run = tmp_path / "run"
  with pytest.raises(errors.WorkdirError, match="config.json"):
    visualize.run(None, workdir=str(run))
  assert not run.exists()
  run.mkdir()
  (run / "config.json").write_text(_config(image_folder).to_json_best_effort())
  with pytest.raises(errors.WorkdirError, match="checkpoints"):
    visualize.run(None, workdir=str(run))
  assert sorted(os.listdir(run)) == ["config.json"]


def test_config_or_workdir_exactly_one(image_folder, tmp_path):
  with pytest.raises(errors.UsageError, match="leave --config out"):
    visualize.run(_config(image_folder), workdir=str(tmp_path))
  with pytest.raises(errors.UsageError, match="--workdir=RUN"):
    visualize.run(None, str(tmp_path / "out"))
  with pytest.raises(errors.UsageError, match="--out"):
    visualize.run(_config(image_folder))


@pytest.mark.slow
def test_loads_the_newest_checkpoint_of_a_run(trained_run, tmp_path, fresh):
  config, workdir = trained_run
  out = tmp_path / "out"
  result = visualize.run(None, str(out), workdir=str(workdir), num_images=2)
  assert result.step == 2
  assert json.loads((out / "index.json").read_text())["step"] == 2
  assert sorted(result.files) == sorted(_expected_files())
  # Trained weights, not the init: the attention moved after two AdamW steps at lr 1e-3.
  init = fresh[1]
  assert not np.allclose(result.attention[0], init.attention[0], atol=1e-6)
  np.testing.assert_allclose(result.attention[1].sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_a_relative_workdir_reads_and_a_damaged_step_is_refused_by_name(
  trained_run, tmp_path, monkeypatch
):
  import shutil

  from vitboot_jax.checkpoint import failures

  shutil.copytree(trained_run[1], tmp_path / "run")
  monkeypatch.chdir(tmp_path)
  assert visualize.run(None, "figures", workdir="run", num_images=1).step == 2
  step_dir = tmp_path / "run" / "checkpoints" / "2"
  data = max(
    (p for p in step_dir.rglob("*") if p.is_file() and "/d/" in str(p)),
    key=lambda p: p.stat().st_size,
  )
  data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # A truncated copy.
  with pytest.raises(failures.CorruptCheckpointError) as info:
    visualize.run(None, "figures", workdir="run", num_images=1)
  message = str(info.value)
  assert isinstance(info.value, errors.UsageError) and "\n" not in message  # Exit 2.
  assert message.startswith(f"Checkpoint {step_dir} (step 2) is damaged: default/")
  assert "where the save wrote" in message and "It is the only checkpoint" in message
  assert sorted(os.listdir(step_dir.parent)) == ["2"]  # Nothing moved.


@pytest.mark.slow
def test_command_line_on_a_checkpoint(trained_run):
  """The run's own config and newest checkpoint, figures into RUN/figures. One device here (the
  run had 8): the restore must not depend on the saving mesh."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "vitboot_jax.tools.visualize",
      f"--workdir={trained_run[1]}",
      "--num_images=1",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  python_info = [x for x in proc.stderr.splitlines() if re.match(r"I\d{4} \d\d:\d\d:\d\d\.", x)]
  assert len(python_info) <= 2, python_info  # Orbax's INFO chatter stays off the console.
  out = trained_run[1] / visualize.FIGURES_SUBDIR
  index = json.loads((out / "index.json").read_text())
  assert "checkpoint step 2" in proc.stdout
  assert index["files"] == _expected_files() and index["images"] == ["test[0]"]
  assert index["step"] == 2
  assert _decode(out / "attention_layer0.png").shape[:2] == _figure_shape(1, 3)
