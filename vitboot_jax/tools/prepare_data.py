r"""Downloads and prepares a tfds dataset once, for runs that must not download themselves.

  python -m vitboot_jax.tools.prepare_data cifar10 --data_dir=/data/tfds

A single-process training run does this by itself on first use; a multi-process run (a pod, a
SLURM job) does not, since its processes would race to write the same files. Run this once on a
machine with internet, copy DIR where the run can read it if needed, and train with
`--config.data.dir=DIR`. Without --data_dir: tfds' default ($TFDS_DATA_DIR, else
~/tensorflow_datasets). Datasets that tfds cannot download (imagenet2012) get tfds' manual
instructions: put the archives in DIR/downloads/manual and run this again.

  python -m vitboot_jax.tools.prepare_data cifar10 --npz_dir=OUT [--data_dir=DIR]
  python -m vitboot_jax.tools.prepare_data folder --data_dir=ROOT --npz_dir=OUT

pack whole splits (--splits, default train,test) into OUT/<split>.npz, the compact form to carry
to a machine without TensorFlow: train there with `--config.data.name=npz --config.data.dir=OUT`
(either pipeline; config.data.train_fraction selects the same subset as from the source).

  python -m vitboot_jax.tools.prepare_data folder --data_dir=ROOT --folder_out=OUT \
    --train_fraction=0.1 --val_fraction=0.1

copies the image files of a run with `--config.data.train_fraction=F --config.data.val_split=
held_out --config.data.val_fraction=V` on ROOT into a folder of their own: OUT/train (the training
rows: the paper's subset), OUT/val (the held-out validation rows) and OUT/test (the evaluation
split), the same files under the same names (splits.training_rows and validation_rows choose
them), so `--config.data.dir=OUT --config.data.train_fraction=1.0 --config.data.val_split=val`
trains and validates on the same images (CIFAR-10 at 0.1/0.1: 5,000 + 5,000 + 10,000 JPEGs, 18 MB,
what launch/gpu_carry.sh carries to a GPU).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
from absl import app, flags, logging

from vitboot_jax.base import cli, errors, library_logs

_DATA_DIR = flags.DEFINE_string(
  "data_dir", None, "tfds data directory (default: tfds' own), or the image folder's root."
)
_NPZ_DIR = flags.DEFINE_string("npz_dir", None, "Also pack the splits into NPZ_DIR/<split>.npz.")
_SPLITS = flags.DEFINE_list("splits", ["train", "test"], "Splits to pack with --npz_dir.")
_FRACTION = flags.DEFINE_float(
  "train_fraction", 1.0, "Pack only this official subset of the first split (to carry less)."
)
_FOLDER_OUT = flags.DEFINE_string(
  "folder_out",
  None,
  "Copy an image folder's training, held-out validation and test files into FOLDER_OUT/{train,"
  "val,test} (with --train_fraction and --val_fraction).",
)
_VAL_FRACTION = flags.DEFINE_float(
  "val_fraction", 0.1, "With --folder_out: each class's share held out for validation."
)
# With --folder_out: what was packed, from where, and the training command's data flags.
FOLDER_MANIFEST = "manifest.json"


def prepare(name: str, data_dir: str | None) -> str:
  """Prepares tfds dataset `name` in `data_dir` (a no-op if it is); returns its directory."""
  from vitboot_jax.data import prepare

  builder = prepare.tfds_builder(name, data_dir)
  if prepare.is_prepared(builder):
    logging.info("%s is already prepared in %s.", name, builder.data_dir)
    return builder.data_dir
  if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
    manual = builder.data_dir_root / "downloads" / "manual"
    if not manual.exists():
      raise errors.DataError(
        f"tfds cannot download {name!r} by itself: put its files in {manual} and run this again. "
        "tfds' instructions: " + " ".join(builder.MANUAL_DOWNLOAD_INSTRUCTIONS.split())
      )
  prepare.download_and_prepare(builder)
  logging.info("Prepared %s in %s.", name, builder.data_dir)
  return builder.data_dir


def pack_npz(
  name: str,
  data_dir: str | None,
  out_dir: str,
  splits: tuple[str, ...] = ("train", "test"),
  train_fraction: float = 1.0,
) -> list[str]:
  """Writes each split of tfds `name` or of the image folder `data_dir` (name "folder") to
  OUT/<split>.npz in canonical order, with class_names and (tfds) file_names; returns paths.
  `train_fraction` < 1 packs that subset of the first split (train it with fraction 1)."""
  from vitboot_jax import configlib
  from vitboot_jax.data import device_pipeline, read_folders, read_npz

  config = configlib.base_config()
  config.data.name, config.data.dir = name, data_dir
  config.data.train_split = splits[0]
  config.data.train_fraction = train_fraction
  if name == "folder":
    class_names = read_folders.class_folders(data_dir, splits[0], "train_split")
    file_names = {}
  else:
    from vitboot_jax.data import tfdata_sources

    info = tfdata_sources.TfdsSource(config)
    class_names = info.class_names
    file_names = {split: info.file_names(split) for split in splits}
  config.data.num_classes = len(class_names)
  paths = []
  for split in splits:
    config.data.eval_split = split  # Every split after the first is read whole.
    images, labels, index = device_pipeline.read_split(
      config, "train" if split == splits[0] else "eval"
    )
    extra = {"class_names": np.asarray(class_names, str)}
    if file_names.get(split) is not None:
      extra["file_names"] = np.asarray(file_names[split], str)[index]
    path = read_npz.npz_path(out_dir, split)
    read_npz.write_npz(path, images, labels, **extra)
    logging.info("Wrote %s: %d images of %s.", path, len(labels), images.shape[1:])
    paths.append(path)
  return paths


def folder_selection(
  data_dir: str,
  train_fraction: float,
  val_fraction: float,
  train_split: str = "train",
  eval_split: str = "test",
) -> dict[str, np.ndarray]:
  """The source files of each part ("train", "val", "test") of a run on the image folder
  `data_dir` with train_fraction, val_split=held_out and val_fraction, in canonical order."""
  from vitboot_jax import configlib
  from vitboot_jax.data import read_folders, splits

  config = configlib.base_config()
  config.data.name, config.data.dir = "folder", data_dir
  config.data.train_split, config.data.eval_split = train_split, eval_split
  config.data.train_fraction = train_fraction
  config.data.val_split, config.data.val_fraction = splits.HELD_OUT, val_fraction
  classes = tuple(read_folders.class_folders(data_dir, train_split, "train_split"))
  paths, labels = read_folders.list_folder(data_dir, train_split, "train_split", classes)
  test, _ = read_folders.list_folder(data_dir, eval_split, "eval_split", classes)
  return {
    "train": paths[splits.training_rows(config, labels, class_names=classes)],
    "val": paths[splits.validation_rows(config, labels, class_names=classes)],
    "test": test,
  }


def pack_folder(
  data_dir: str,
  out_dir: str,
  train_fraction: float = 0.1,
  val_fraction: float = 0.1,
  train_split: str = "train",
  eval_split: str = "test",
) -> dict[str, int]:
  """Copies folder_selection's files to OUT/{train,val,test}/<class>/<name> (the same names,
  so each part keeps its canonical order) and OUT/manifest.json; returns each part's count.

  OUT must not exist, or hold a manifest of the same selection (then nothing is copied).
  """
  parts = folder_selection(data_dir, train_fraction, val_fraction, train_split, eval_split)
  manifest = {
    "source": os.path.abspath(data_dir),
    "train_split": train_split,
    "eval_split": eval_split,
    "train_fraction": train_fraction,
    "val_fraction": val_fraction,
    "counts": {part: len(files) for part, files in parts.items()},
    "data_flags": [
      f"--config.data.dir={out_dir}",
      "--config.data.train_fraction=1.0",
      "--config.data.val_split=val",
    ],
  }
  manifest_path = os.path.join(out_dir, FOLDER_MANIFEST)
  if os.path.exists(out_dir):
    if os.path.isfile(manifest_path):
      with open(manifest_path) as f:
        old = json.load(f)
      same = ("source", "train_split", "eval_split", "train_fraction", "val_fraction", "counts")
      if all(old.get(k) == manifest[k] for k in same):
        logging.info("%s already holds this selection; nothing copied.", out_dir)
        return manifest["counts"]
    raise errors.UsageError(
      f"--folder_out={out_dir} exists and holds another selection (or none); remove it or pick "
      "another folder"
    )
  partial = out_dir.rstrip("/") + ".partial"
  shutil.rmtree(partial, ignore_errors=True)  # Ours: a copy interrupted before its rename.
  for part, files in parts.items():
    for path in files.tolist():
      class_dir = os.path.join(partial, part, os.path.basename(os.path.dirname(path)))
      os.makedirs(class_dir, exist_ok=True)
      shutil.copyfile(path, os.path.join(class_dir, os.path.basename(path)))
  with open(os.path.join(partial, FOLDER_MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1)
  os.rename(partial, out_dir)
  return manifest["counts"]


def main(argv):
  if len(argv) != 2:
    cli.fail("give one tfds dataset name, e.g. prepare_data cifar10 --data_dir=DIR")
  library_logs.libraries()
  name = argv[1]
  if name == "folder" and _FOLDER_OUT.value:
    if not _DATA_DIR.value or len(_SPLITS.value) != 2:
      cli.fail("--folder_out needs --data_dir=ROOT and --splits=TRAIN,TEST (default train,test)")
    try:
      counts = pack_folder(
        _DATA_DIR.value, _FOLDER_OUT.value, _FRACTION.value, _VAL_FRACTION.value, *_SPLITS.value
      )
    except errors.UsageError as error:
      cli.fail(str(error))
    print(
      f"Packed {counts} into {_FOLDER_OUT.value}; train on it with --config.data.name=folder ",
      end="",
    )
    print(f"--config.data.dir={_FOLDER_OUT.value} --config.data.train_fraction=1.0 ", end="")
    print("--config.data.val_split=val")
    return
  if name == "folder":
    if not _NPZ_DIR.value or not _DATA_DIR.value:
      cli.fail("packing an image folder needs --data_dir=ROOT and --npz_dir=OUT")
    try:
      paths = pack_npz(name, _DATA_DIR.value, _NPZ_DIR.value, tuple(_SPLITS.value), _FRACTION.value)
    except errors.UsageError as error:
      cli.fail(str(error))
    print(f"Packed: {', '.join(paths)}\nTrain on it with --config.data.name=npz ", end="")
    print(f"--config.data.dir={_NPZ_DIR.value}")
    return
  library_logs.import_tensorflow()
  try:
    path = prepare(name, _DATA_DIR.value)
    if _NPZ_DIR.value:
      paths = pack_npz(name, _DATA_DIR.value, _NPZ_DIR.value, tuple(_SPLITS.value), _FRACTION.value)
  except errors.UsageError as error:
    cli.fail(str(error))
  if _NPZ_DIR.value:
    print(f"Packed: {', '.join(paths)}; train on it with --config.data.name=npz ", end="")
    print(f"--config.data.dir={_NPZ_DIR.value}")
  print(f"Prepared: {path}\nTrain on it with --config.data.name={argv[1]} ", end="")
  print(f"--config.data.dir={_DATA_DIR.value}" if _DATA_DIR.value else "(tfds' default dir)")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
