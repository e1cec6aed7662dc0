"""Naming the files TensorFlow cannot decode: its decode error names no file, so after one the
split is decoded again in parallel to find them (and the images that are not
config.data.stored_size square). `check_split` looks at a small image folder's split before a
tf.data run trains, so a bad test image stops it at once rather than at its first evaluation.
"""

from __future__ import annotations

import ml_collections
import numpy as np

from vitboot_jax import configlib
from vitboot_jax.base import errors, library_logs
from vitboot_jax.data import read_folders, splits, tfdata_augment

tf = library_logs.import_tensorflow()  # Quietly, and off every accelerator.


def _decoded_shapes(paths: np.ndarray) -> dict[str, tuple[int, ...]]:
  """The decoded shape of every file that decodes, decoding in parallel."""

  def decoded_shape(path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return path, tf.shape(tfdata_augment.decode(tf.io.read_file(path)))  # Output keeps the decode.

  ds = tf.data.Dataset.from_tensor_slices(paths).map(
    decoded_shape, num_parallel_calls=tf.data.AUTOTUNE
  )
  return {p.decode(): tuple(shape) for p, shape in ds.ignore_errors().as_numpy_iterator()}


def wrong_size_message(config: ml_collections.ConfigDict, split: str, error: Exception) -> str:
  """Names the image(s) of `split` that are not config.data.stored_size square."""
  stored = int(config.data.stored_size)
  if config.data.name != "folder":
    cause = str(error).strip().split("\n", 1)[0][:300]
    return (
      f"config.data.stored_size={stored} but an image of split {split!r} is not: {cause}; "
      + splits.STORED_SIZE_FIX
    )
  shapes = _decoded_shapes(read_folders.split_paths(config, split))
  wrong = [f"{p} ({s[0]}x{s[1]})" for p, s in shapes.items() if s[:2] != (stored, stored)]
  return splits.wrong_size_message(stored, wrong)


def unreadable_files(paths: np.ndarray) -> str | None:
  """The message naming those of `paths` TensorFlow cannot decode (None: all decode)."""
  good_paths = _decoded_shapes(paths)
  bad = [p for p in paths.tolist() if p not in good_paths]
  if not bad:
    return None
  try:
    tfdata_augment.decode(tf.io.read_file(bad[0]))
    why = "TensorFlow cannot decode it"
  except tf.errors.OpError as own_error:  # The file's own error: "Invalid PNG data, size 1586".
    why = own_error.message.split(" [Op:", 1)[0].strip()
  return splits.unreadable_message(bad, f"it is not a complete JPEG/PNG image: {why}")


def find_unreadable(config: ml_collections.ConfigDict, split: str, error: Exception) -> str | None:
  """Decodes every image of `split` in parallel to name those TensorFlow cannot read (None: all
  decode)."""
  cause = str(error).strip().split("\n", 1)[0][:300]
  if config.data.name != "folder":
    if not any(word in str(error) for word in ("JPEG", "PNG", "ecode", "DataLoss", "corrupt")):
      return None
    return (
      f"tfds dataset {config.data.name!r} (data_dir={config.data.dir}) has a record that cannot "
      f"be decoded in split {split!r} ({type(error).__name__}: {cause}). Its prepared files are "
      "damaged: delete the dataset's directory and prepare it again."
    )
  return unreadable_files(read_folders.split_paths(config, split))


def check_split(config: ml_collections.ConfigDict, split: str, max_files: int = 20000) -> None:
  """Checks an image folder's `split` before a tf.data run trains, if it has at most
  `max_files` (CIFAR's test split), so a bad file stops the run at once rather than at its first
  evaluation (the device pipeline decodes and checks every image as it loads them).

  Reads only each file's first and last bytes (decoding every file costs many times more;
  docs/performance.md): a file that does not start and end like a complete JPEG/PNG (an
  interrupted copy) is then decoded by TensorFlow, as the run reads it, so a valid file is never
  refused. A PNG's
  size is checked against config.data.stored_size from its header; a JPEG's, and any damage
  inside a file, are found when the file is read. Larger splits, .npz files and tfds datasets
  are checked as they are read.

  Raises:
    splits.UnreadableImageError: A file does not decode (named).
    errors.ConfigError: A PNG's size differs from config.data.stored_size (named).
  """
  if config.data.name != "folder":
    return
  found = read_folders.suspect_files(config, split, max_files)
  if found is None:
    return
  suspects, wrong = found
  if suspects:
    message = unreadable_files(np.array(suspects))
    if message is not None:
      raise splits.UnreadableImageError(message)
  if wrong:
    stored = configlib.device_resize_from(config)
    raise errors.ConfigError(splits.wrong_size_message(stored, wrong))
