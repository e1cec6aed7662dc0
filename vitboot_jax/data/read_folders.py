"""Image folders, ROOT/<split>/<class>/*.{jpg,jpeg,png}, without TensorFlow.

The listing in canonical order (classes sorted, then file names) and its checks (a class in one
split, unsupported or empty files), images decoded with PIL for the device pipeline, and a quick
look at each file's first and last bytes that finds interrupted copies before a run trains (the
tf.data pipeline then decodes only the suspects: tfdata_undecodable.py).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os

import ml_collections
import numpy as np
from absl import logging

from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.data import splits
from vitboot_jax.data.splits import UnreadableImageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
FOLDER_HINT = "point --config.data.dir at a folder with {split}/<class>/*.jpg (or .jpeg/.png)"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"

LISTING_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
# sha256 of each listed split's relative paths and sizes, for the workdir's data record.
FILES_DIGEST: dict[tuple, str] = {}


def class_folders(root: str, split: str, field: str) -> list[str]:
  split_dir = os.path.join(root, split)
  if not os.path.isdir(split_dir):
    raise errors.DataError(
      f"config.data.dir={root!r} has no {split!r} folder (config.data.{field}={split!r}); "
      + FOLDER_HINT.format(split=split)
    )
  classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and e.name[0] != ".")
  if not classes:
    raise errors.DataError(
      f"config.data.dir={root!r}: {split_dir} has no class subfolders; "
      + FOLDER_HINT.format(split=split)
    )
  return classes


def list_folder(
  root: str, split: str, field: str, class_names: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
  """(paths, labels) in canonical order: classes sorted, then file names sorted."""
  folders = class_folders(root, split, field)
  split_dir = os.path.join(root, split)
  # Cached per directory state, so repeated calls (info, train, eval) list a big folder once.
  key = (
    root,
    split,
    class_names,
    tuple(os.stat(os.path.join(split_dir, c)).st_mtime_ns for c in folders),
  )
  if key in LISTING_CACHE:
    return LISTING_CACHE[key]
  class_index = {name: i for i, name in enumerate(class_names)}
  unknown = [c for c in folders if c not in class_index]
  missing = [c for c in class_names if c not in folders]
  if unknown or missing:
    what = (
      f"classes {unknown[:5]} are only in {split!r}"
      if unknown
      else f"classes {missing[:5]} of the training split have no folder in {split!r}"
    )
    raise errors.DataError(
      f"config.data.dir={root!r}: {what} (config.data.{field}={split!r}); every split must have "
      "the same class folders: add or remove folders so they match"
    )
  paths, labels, sizes, unsupported = [], [], [], []
  for name in folders:
    class_dir = os.path.join(split_dir, name)
    entries = sorted(
      (e for e in os.scandir(class_dir) if e.is_file() and e.name[0] != "."), key=lambda e: e.name
    )
    for e in entries:
      if not e.name.lower().endswith(IMAGE_EXTENSIONS):
        unsupported.append(e.path)
        continue
      paths.append(e.path)
      labels.append(class_index[name])
      sizes.append(e.stat().st_size)  # One stat each: empty files and the data fingerprint.
  if unsupported:
    logging.warning(
      "Skipping %d file(s) in %s that are not %s images: %s%s. Convert them to JPEG/PNG to use "
      "them.",
      len(unsupported),
      split_dir,
      "/".join(IMAGE_EXTENSIONS),
      ", ".join(unsupported[:5]),
      ", ..." if len(unsupported) > 5 else "",
    )
  if not paths:
    raise errors.DataError(
      f"config.data.dir={root!r}: no images under {split_dir}/<class>/; "
      + FOLDER_HINT.format(split=split)
    )
  empty = [p for p, size in zip(paths, sizes) if size == 0]  # Interrupted copies.
  if empty:
    raise UnreadableImageError(splits.unreadable_message(empty, "it is empty (0 bytes)"))
  out = np.array(paths), np.array(labels, np.int64)
  digest = hashlib.sha256()
  for path, size in zip(paths, sizes):
    digest.update(f"{os.path.relpath(path, split_dir)}\t{size}\n".encode())
  LISTING_CACHE[key] = out
  FILES_DIGEST[key[:3]] = digest.hexdigest()
  return out


def split_paths(config: ml_collections.ConfigDict, split: str) -> np.ndarray:
  """The file paths of config.data's image folder `split`, in canonical order."""
  root, train_split = config.data.dir, config.data.train_split
  classes = tuple(class_folders(root, train_split, "train_split"))
  return list_folder(root, split, splits.split_field(split, train_split), classes)[0]


def read_image(path: str) -> np.ndarray:
  """uint8 [H, W, 3] of a JPEG/PNG file with PIL (grey, palette and CMYK become RGB)."""
  from PIL import Image  # Only the TensorFlow-free pipeline decodes with PIL.

  with Image.open(path) as image:
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def read_images(paths: np.ndarray, threads: int | None = None, stored: int = 0) -> np.ndarray:
  """uint8 [N, H, W, 3] of same-sized images; an unreadable or odd-sized file is named, and with
  `stored` (configlib.device_resize_from) every image not `stored` square."""
  if not len(paths):
    return np.zeros([0, 0, 0, 3], np.uint8)

  def read(path: str) -> np.ndarray | Exception:
    try:
      return read_image(path)
    except Exception as error:  # PIL raises several types; each is the file's fault here.
      return error

  with concurrent.futures.ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
    images = list(pool.map(read, paths.tolist()))
  bad = [(p, e) for p, e in zip(paths.tolist(), images) if isinstance(e, Exception)]
  if bad:
    why = " ".join(str(bad[0][1]).split())[:200]
    raise UnreadableImageError(
      splits.unreadable_message([p for p, _ in bad], f"it is not a complete JPEG/PNG image: {why}")
    )
  if stored:
    wrong = [
      f"{p} ({image.shape[0]}x{image.shape[1]})"
      for p, image in zip(paths.tolist(), images)
      if image.shape[:2] != (stored, stored)
    ]
    if wrong:
      raise errors.ConfigError(splits.wrong_size_message(stored, wrong))
  shape = images[0].shape
  odd = [p for p, image in zip(paths.tolist(), images) if image.shape != shape]
  if odd:
    other = images[paths.tolist().index(odd[0])].shape
    raise errors.DataError(
      f"config.data.pipeline='device' holds a split as one array, so its images must share one "
      f"size: {paths[0]} is {shape[0]}x{shape[1]} but {odd[0]} is {other[0]}x{other[1]} "
      f"({len(odd)} differ); resize them to one size or use --config.data.pipeline=tfdata"
    )
  return np.stack(images)


def folder_arrays(
  config: ml_collections.ConfigDict, part: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [N, H, W, 3], labels int64 [N], index int64 [N]) of an image folder's `part`
  (splits.PARTS: the training rows, the validation rows or the evaluation split).

  `index` is each example's position in the split's canonical order (what augmentation is keyed
  by), in that order.
  """
  train_split, split = config.data.train_split, splits.part_split(config, part)
  classes = tuple(class_folders(config.data.dir, train_split, "train_split"))
  field = splits.split_field(split, train_split, config.data.get("val_split", ""))
  paths, labels = list_folder(config.data.dir, split, field, classes)
  index = splits.part_rows(config, part, labels, class_names=classes)
  stored = configlib.device_resize_from(config)
  return read_images(paths[index], stored=stored), labels[index], index


def suspect_files(
  config: ml_collections.ConfigDict, split: str, max_files: int
) -> tuple[list[str], list[str]] | None:
  """(suspects, wrong) of an image folder's `split` from each file's first and last bytes, or
  None when it has more than `max_files`: files that do not start and end like a complete
  JPEG/PNG (an interrupted copy), and PNGs ("PATH (WxH)") whose header says they are not
  config.data.stored_size square."""
  paths = split_paths(config, split)
  if len(paths) > max_files:
    return None
  stored = configlib.device_resize_from(config)
  suspects, wrong = [], []
  for path in paths.tolist():
    with open(path, "rb") as f:
      head = f.read(24)
      f.seek(max(0, os.fstat(f.fileno()).st_size - 32))
      tail = f.read()
    if head.startswith(_PNG_SIGNATURE):
      complete = tail.endswith(_PNG_END)
      size = (int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big"))
      if stored and complete and size != (stored, stored):
        wrong.append(f"{path} ({size[0]}x{size[1]})")
    else:
      complete = head.startswith(b"\xff\xd8") and b"\xff\xd9" in tail
    if not complete:
      suspects.append(path)
  return suspects, wrong
