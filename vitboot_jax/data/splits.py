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
STORED_SIZE_FIX = "set --config.data.stored_size=0 (resize on the host) or resize the images"


class UnreadableImageError(errors.UsageError, ValueError):
  """An image file or record that cannot be decoded; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Sizes the trainer needs before it sees any batch (schedules, logging, eval padding)."""

  num_train_examples: int  # After config.data.train_fraction.
  num_eval_examples: int
  num_classes: int
  steps_per_epoch: int  # num_train_examples // config.batch_size (the official drop_last).
  class_names: tuple[str, ...]


def uses_tensorflow(config: ml_collections.ConfigDict) -> bool:
  """Whether this run's data needs TensorFlow: the tf.data pipeline, or tfds as the source."""
  return config.data.get("pipeline", "tfdata") == "tfdata" or config.data.name not in ARRAY_SOURCES


def split_field(split: str, train_split: str) -> str:
  """The config field an error about `split` should name."""
  return "train_split" if split == train_split else "eval_split"


# ---------------------------------------------------------------------------------------------
# The paper's subsets.


def subset_indices(
  labels: np.ndarray, fraction: float, file_names: np.ndarray | None = None
) -> np.ndarray:
  """Sorted indices of the official class-balanced subset (docs/reference/official_pytorch_code.md
  §5, `make_partial`).

  Class c's examples, sorted by file name (the official code lists each class folder sorted;
  without `file_names`: in the split's canonical order, which for an image folder is the same),
  are permuted with `np.random.default_rng(seed=c)` and the first round(n_c * fraction) kept.
  The permutation does not depend on `fraction`, so smaller subsets are nested in larger ones.
  `fraction` is in (0, 1] (configlib.validate); one that keeps no example is refused here.
  """
  labels = np.asarray(labels, np.int64)
  if labels.size and labels.min() < 0:
    raise ValueError(f"labels must be non-negative class indices, got {labels.min()}")
  if fraction == 1.0:
    return np.arange(labels.size, dtype=np.int64)
  by_name = np.arange(labels.size) if file_names is None else np.argsort(file_names, kind="stable")
  by_class = by_name[np.argsort(labels[by_name], kind="stable")]  # Within a class: by name.
  counts = np.bincount(labels)
  keep = []
  for c, members in enumerate(np.split(by_class, np.cumsum(counts)[:-1])):
    order = np.random.default_rng(seed=c).permutation(len(members))
    keep.append(members[order[: round(len(members) * fraction)]])
  out = np.sort(np.concatenate(keep)) if keep else np.zeros([0], np.int64)
  if out.size == 0:
    raise ValueError(
      f"config.data.train_fraction={fraction} leaves no training example; use a larger fraction"
    )
  return out


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
