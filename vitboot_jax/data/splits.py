"""What every source and both pipelines share about a dataset, without TensorFlow.

The sizes the trainer needs before any batch (DatasetInfo), the paper's class-balanced subsets,
and the errors and checks every source's examples pass. The sources themselves: read_folders.py
(image folders, decoded with PIL), read_npz.py (`.npz` arrays), tfdata_sources.py (the three as
tf.data datasets, tfds among them); workdir_record.py writes what a run trained on into its workdir.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from vitboot_jax import configlib
from vitboot_jax.base import errors

# The sources that need neither TensorFlow nor tfds when config.data.pipeline="device".
ARRAY_SOURCES = ("folder", "npz")
# config.data.val_split: validation examples held out of the training split (training_rows).
HELD_OUT = "held_out"
# What a reader reads: the training rows, the validation rows, or the whole evaluation split.
PARTS = ("train", "val", "eval")
STORED_SIZE_FIX = "set --config.data.stored_size=0 (resize on the host) or resize the images"


class UnreadableImageError(errors.UsageError, ValueError):
  """An image file or record that cannot be decoded; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Sizes the trainer needs before it sees any batch (schedules, logging, eval padding)."""

  num_train_examples: int  # After config.data.train_fraction and the held-out validation.
  num_eval_examples: int
  num_classes: int
  steps_per_epoch: int  # num_train_examples // config.batch_size (the official drop_last).
  class_names: tuple[str, ...]
  num_val_examples: int = 0  # 0: no validation split (config.data.val_split="").
  num_train_split: int = 0  # Every example of the training split, the held-out ones included.


def uses_tensorflow(config: ml_collections.ConfigDict) -> bool:
  """Whether this run's data needs TensorFlow: the tf.data pipeline, or tfds as the source."""
  return config.data.get("pipeline", "tfdata") == "tfdata" or config.data.name not in ARRAY_SOURCES


def split_field(split: str, train_split: str, val_split: str = "") -> str:
  """The config field an error about `split` should name."""
  if split == train_split:
    return "train_split"
  return "val_split" if split == val_split else "eval_split"


# ---------------------------------------------------------------------------------------------
# The paper's subsets.


def _class_orders(labels: np.ndarray, file_names: np.ndarray | None = None) -> list[np.ndarray]:
  """Each class's examples in the official subset order (docs/reference/official_pytorch_code.md
  §5, `make_partial`): sorted by file name (the official code lists each class folder sorted;
  without `file_names`: in the split's canonical order, which for an image folder is the same),
  then permuted with `np.random.default_rng(seed=c)`."""
  labels = _checked(labels)
  by_name = np.arange(labels.size) if file_names is None else np.argsort(file_names, kind="stable")
  by_class = by_name[np.argsort(labels[by_name], kind="stable")]  # Within a class: by name.
  counts = np.bincount(labels)
  members = np.split(by_class, np.cumsum(counts)[:-1]) if labels.size else []
  return [m[np.random.default_rng(seed=c).permutation(len(m))] for c, m in enumerate(members)]


def _checked(labels: np.ndarray) -> np.ndarray:
  labels = np.asarray(labels, np.int64)
  if labels.size and labels.min() < 0:
    raise ValueError(f"labels must be non-negative class indices, got {labels.min()}")
  return labels


def _sorted(parts: list[np.ndarray]) -> np.ndarray:
  return np.sort(np.concatenate(parts)) if parts else np.zeros([0], np.int64)


def subset_indices(
  labels: np.ndarray, fraction: float, file_names: np.ndarray | None = None
) -> np.ndarray:
  """Sorted indices of the official class-balanced subset: the first round(n_c * fraction) of
  each class c's examples in the subset order (_class_orders).

  The order does not depend on `fraction`, so smaller subsets are nested in larger ones.
  `fraction` is in (0, 1] (configlib.validate); one that keeps no example is refused here.
  """
  if fraction == 1.0:
    return np.arange(_checked(labels).size, dtype=np.int64)
  out = _sorted([m[: round(len(m) * fraction)] for m in _class_orders(labels, file_names)])
  if out.size == 0:
    raise ValueError(
      f"config.data.train_fraction={fraction} leaves no training example; use a larger fraction"
    )
  return out


# ---------------------------------------------------------------------------------------------
# The validation split.


def holds_out(config: ml_collections.ConfigDict) -> bool:
  """Whether validation examples are held out of the training split (config.data.val_split)."""
  return config.data.get("val_split", "") == HELD_OUT


def validation_split(config: ml_collections.ConfigDict) -> str | None:
  """The split the validation examples are read from, or None for a run without validation."""
  val_split = config.data.get("val_split", "")
  if not val_split:
    return None
  return config.data.train_split if val_split == HELD_OUT else val_split


def takes_rows(config: ml_collections.ConfigDict) -> bool:
  """Whether training reads only some rows of its split: a subset, or validation held out."""
  return config.data.train_fraction < 1.0 or holds_out(config)


def _held_out_counts(
  config: ml_collections.ConfigDict, orders: list[np.ndarray], class_names: tuple[str, ...] = ()
) -> list[tuple[int, int]]:
  """(training, held-out) counts of each class; fails in one line where the two overlap."""
  fraction, held = config.data.train_fraction, config.data.val_fraction
  counts = []
  for c, members in enumerate(orders):
    n = len(members)
    v = round(n * held)
    k = n - v if fraction == 1.0 else round(n * fraction)
    if k + v > n:
      name = class_names[c] if c < len(class_names) else str(c)
      raise errors.ConfigError(
        f"config.data.val_fraction={held} held out for validation overlaps the training subset "
        f"config.data.train_fraction={fraction}: class {name!r} has {n} images, {k} to train on "
        f"and {v} held out; use train_fraction <= {1 - held:g} (or 1.0: every image not held "
        "out) or a smaller val_fraction"
      )
    counts.append((k, v))
  if orders and not sum(v for _, v in counts):
    raise errors.ConfigError(
      f"config.data.val_fraction={held} holds out no image of the training split; use a larger "
      "val_fraction"
    )
  return counts


def _held_out_split(
  config: ml_collections.ConfigDict,
  labels: np.ndarray,
  file_names: np.ndarray | None,
  class_names: tuple[str, ...],
) -> tuple[np.ndarray, np.ndarray]:
  """(training rows, held-out rows): the first and the last of each class in the subset order."""
  orders = _class_orders(labels, file_names)
  counts = _held_out_counts(config, orders, class_names)
  train = _sorted([m[:k] for m, (k, _) in zip(orders, counts)])
  return train, _sorted([m[len(m) - v :] for m, (_, v) in zip(orders, counts)])


def training_rows(
  config: ml_collections.ConfigDict,
  labels: np.ndarray,
  file_names: np.ndarray | None = None,
  class_names: tuple[str, ...] = (),
) -> np.ndarray:
  """Sorted indices of the examples a run trains on: config.data.train_fraction's subset
  (subset_indices, the paper's), less the validation examples held out of the split.

  Held out (config.data.val_split="held_out"): the last round(n_c * val_fraction) of each class
  in the subset order, so the subset keeps the paper's images and the validation images are the
  same whatever the fraction; with train_fraction=1.0 the run trains on every other image, and a
  subset that would reach into the held-out images is refused.
  """
  if not holds_out(config):
    return subset_indices(labels, config.data.train_fraction, file_names)
  out, _ = _held_out_split(config, labels, file_names, class_names)
  if out.size == 0:
    raise errors.ConfigError(
      f"config.data.train_fraction={config.data.train_fraction} with "
      f"config.data.val_fraction={config.data.val_fraction} held out leaves no training example"
    )
  return out


def validation_rows(
  config: ml_collections.ConfigDict,
  labels: np.ndarray,
  file_names: np.ndarray | None = None,
  class_names: tuple[str, ...] = (),
) -> np.ndarray:
  """Sorted indices of the validation examples in validation_split(config): the held-out rows of
  the training split (training_rows), or every example of a split of their own."""
  if not holds_out(config):
    return np.arange(np.asarray(labels).size, dtype=np.int64)
  return _held_out_split(config, labels, file_names, class_names)[1]


def part_rows(
  config: ml_collections.ConfigDict,
  part: str,
  labels: np.ndarray,
  file_names: np.ndarray | None = None,
  class_names: tuple[str, ...] = (),
) -> np.ndarray:
  """Sorted rows of `part` ("train", "val" or "eval": PARTS) in the split part_split names."""
  if part == "train":
    return training_rows(config, labels, file_names, class_names)
  if part == "val":
    return validation_rows(config, labels, file_names, class_names)
  return np.arange(np.asarray(labels).size, dtype=np.int64)


def part_split(config: ml_collections.ConfigDict, part: str) -> str:
  """The split `part` reads: the training split, the validation's (validation_split) or the
  evaluation split."""
  if part not in PARTS:
    raise ValueError(f"part={part!r} is not one of {PARTS}")
  if part == "train":
    return config.data.train_split
  if part == "val":
    split = validation_split(config)
    if split is None:
      raise ValueError("this config has no validation split (config.data.val_split is empty)")
    return split
  return config.data.eval_split


def describe(config: ml_collections.ConfigDict, info: DatasetInfo) -> str:
  """What a run trains and evaluates on, in one line (logged before training, kept in data.json):
  "5,000 of 50,000 training images in 10 classes (config.data.train_fraction=0.1), 10,000 test"."""
  n, whole = info.num_train_examples, info.num_train_split or info.num_train_examples
  held = holds_out(config)
  line = f"{n:,} of {whole:,} training images" if n != whole else f"{n:,} training images"
  line += f" in {info.num_classes} classes"
  if config.data.train_fraction < 1.0:
    line += f" (config.data.train_fraction={config.data.train_fraction:g})"
  elif held:
    line += " (every image not held out)"
  else:
    line += " (all of them)"
  if held:
    line += (
      f", {info.num_val_examples:,} held out for validation "
      f"(config.data.val_fraction={config.data.val_fraction:g})"
    )
  elif info.num_val_examples:
    line += f", {info.num_val_examples:,} validation ({config.data.val_split!r})"
  return line + f", {info.num_eval_examples:,} test ({config.data.eval_split!r})"


def steps_per_epoch(config: ml_collections.ConfigDict, num_train: int) -> int:
  """Full batches per epoch (the official drop_last); at least one, or the batch is too large."""
  steps = num_train // config.batch_size
  if steps == 0:
    raise ValueError(
      f"config.batch_size={config.batch_size} is larger than the {num_train} training examples "
      f"(config.data.train_fraction={config.data.train_fraction}); use a smaller batch or a "
      "larger fraction"
    )
  return steps


# ---------------------------------------------------------------------------------------------
# Checks and messages every source uses.


def check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
  if labels.size and labels.max() >= num_classes:
    raise errors.DataError(
      f"{where} has label {labels.max()} but there are {num_classes} classes; set "
      f"--config.data.num_classes={labels.max() + 1} (or fix the labels)"
    )


def unreadable_message(paths: list[str], why: str) -> str:
  more = f" (and {len(paths) - 1} more: {', '.join(paths[1:4])}{', ...' if len(paths) > 4 else ''})"
  return (
    f"Cannot read image file {paths[0]}: {why}{more if len(paths) > 1 else ''}. Replace or "
    "delete the file(s) and re-run the same command (a run in progress resumes from its last "
    "checkpoint)."
  )


def wrong_size_message(stored: int, wrong: list[str]) -> str:
  """One line naming the first of the `wrong` ("PATH (WxH)") images that are not `stored` square."""
  more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
  first = wrong[0] if wrong else "one of them"
  return (
    f"config.data.stored_size={stored} but image file {first}{more} is not {stored}x{stored}; "
    + STORED_SIZE_FIX
  )


def check_stored_size(config: ml_collections.ConfigDict, images: np.ndarray, where: str) -> None:
  """Fails unless a split read as one array (`where`: its file or name) is stored_size square."""
  stored = configlib.device_resize_from(config)
  if stored and images.shape[1:3] != (stored, stored):
    raise errors.ConfigError(
      f"config.data.stored_size={stored} but the images of {where} are "
      f"{images.shape[1]}x{images.shape[2]}, not {stored}x{stored}; " + STORED_SIZE_FIX
    )
