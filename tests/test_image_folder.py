"""configs/image_folder.py, a user's own folder: every image trained on, validation held out (or
ROOT/val), the classes counted from the folders, the models sized for the input, and one line
that says what the run trains on."""

import json
import shutil

import numpy as np
import pytest

from tests.config_files import load_config
from tests.runs import REPO, env
from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.run import startup

CLASSES = ("apple", "kiwi", "plum")
PER_CLASS = {"train": 10, "test": 3}


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
  """3 classes of 8x8 grey PNGs, 24x24 RGB JPEGs and 40x40 RGBA PNGs, as a user's folder is."""
  from PIL import Image

  root = tmp_path_factory.mktemp("mine")
  rng = np.random.default_rng(0)
  for split, n in PER_CLASS.items():
    for name in CLASSES:
      (root / split / name).mkdir(parents=True)
      for i in range(n):
        kind = i % 3
        if kind == 0:
          image = Image.fromarray(rng.integers(0, 255, (8, 8), np.uint8), "L")
          image.save(root / split / name / f"{i}.png")
        elif kind == 1:
          image = Image.fromarray(rng.integers(0, 255, (24, 24, 3), np.uint8), "RGB")
          image.save(root / split / name / f"{i}.jpg")
        else:
          image = Image.fromarray(rng.integers(0, 255, (40, 40, 4), np.uint8), "RGBA")
          image.save(root / split / name / f"{i}.png")
  return root


def settled(root, arg=None):
  config = load_config("image_folder", arg)
  config.data.dir = str(root)
  startup.from_data(config)
  configlib.validate(config)
  return config


def test_the_folder_settles_the_classes_and_the_validation(mixed_folder, tmp_path):
  config = settled(mixed_folder)
  assert config.data.num_classes == 3 and config.data.val_split == "held_out"
  assert config.data.train_fraction == 1.0 and config.mode == "vit"
  assert (config.image_size, config.model.patch_size, config.agent.downsample_after) == (
    32,
    4,
    (0,),
  )
  # A folder with ROOT/val: that is the validation split.
  root = tmp_path / "with_val"
  shutil.copytree(mixed_folder, root)
  shutil.copytree(root / "test", root / "val")
  assert settled(root).data.val_split == "val"
  assert settled(root, "val=0").data.val_split == ""


@pytest.mark.parametrize(("size", "patch", "after"), [(64, 8, (0, 1)), (128, 16, (0, 1, 2))])
def test_the_models_are_sized_for_the_input(mixed_folder, size, patch, after):
  config = settled(mixed_folder, f"size={size}")
  assert (config.model.patch_size, config.agent.downsample_after) == (patch, after)
  assert config.image_size // config.model.patch_size == 8  # The ViT's grid stays 8x8.


@pytest.mark.parametrize(("arg", "message"), [("size=20", "multiple of 8"), ("val=1", "in [0, 1)")])
def test_bad_args_are_refused(arg, message):
  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
    load_config("image_folder", arg)


def test_a_missing_folder_is_one_line(tmp_path):
  config = load_config("image_folder")
  with pytest.raises(errors.DataError, match="config.data.dir is not set"):
    startup.from_data(config)
  config.data.dir = str(tmp_path / "nowhere")
  with pytest.raises(errors.DataError, match="has no 'train' folder"):
    startup.from_data(config)


@pytest.mark.slow
def test_a_run_trains_on_every_image_and_says_so(mixed_folder, tmp_path):
  import subprocess
  import sys

  workdir = tmp_path / "run"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "vitboot_jax.main",
      "--config=configs/image_folder.py:epochs=1",
      f"--workdir={workdir}",
      f"--config.data.dir={mixed_folder}",
      "--config.batch_size=8",
      "--config.data.eval_batch_size=8",
      "--config.data.val_fraction=0.2",
    ],
    env=env(1),
    capture_output=True,
    text=True,
    timeout=600,
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = (
    "Data: 24 of 30 training images in 3 classes (every image not held out), 6 held out for "
    "validation (config.data.val_fraction=0.2), 9 test ('test')."
  )
  assert line in proc.stderr
  final = json.loads((workdir / "final.json").read_text())
  assert "val_top1_vit" in final and "top1_vit" in final
  recorded = json.loads((workdir / "config.json").read_text())
  assert recorded["data"]["num_classes"] == 3 and recorded["data"]["val_split"] == "held_out"
  # The same command again: a finished run, its results logged (the settled config is its own).
  again = subprocess.run(proc.args, env=env(1), capture_output=True, text=True, cwd=REPO)
  assert again.returncode == 0 and "nothing to do" in again.stderr
