"""Makes sure a run's data is on disk before anything else starts.

A tfds dataset that is not prepared yet is downloaded and prepared on first use, with tfds' own
download and progress bars, into config.data.dir or tfds' default data directory
(`$TFDS_DATA_DIR`, else `~/tensorflow_datasets`); later runs reuse it. Only a single-process run
does this: on a pod every process would race to write the same files, so a multi-process run
fails with the command that prepares the data once. Without a network the error names both ways
out, a prepared tfds directory or an image folder. Nothing here imports JAX, so `main` can check
the data seconds after start-up, before the workdir or the model exist.
"""

from __future__ import annotations

import contextlib
import logging as logging_lib
import os
import socket
import threading
import urllib.parse

import ml_collections
from absl import logging

from vitboot_jax.base import errors, library_logs
from vitboot_jax.data import read_npz

PREPARE_COMMAND = "python -m vitboot_jax.tools.prepare_data {name} --data_dir={data_dir}"
FOLDER_FLAGS = "--config.data.name=folder --config.data.dir=ROOT"
FOLDER_LAYOUT = "ROOT/{train,test}/<class>/*.jpg (or .png)"
_PROBE_SECONDS = 3.0


def ensure(config: ml_collections.ConfigDict, *, may_download: bool) -> None:
  """Checks that config.data exists; prepares a tfds dataset on first use if `may_download`.

  Raises:
    errors.DataError: The data is missing and cannot be prepared here; the message says how.
    errors.ConfigError: config.data.name is neither 'folder', 'npz' nor a tfds dataset.
  """
  if config.data.name == "folder":
    _check_folder(config)
    return
  if config.data.name == "npz":
    read_npz.check_npz_dir(config)
    return
  _check_not_a_folder(config)
  builder = tfds_builder(config.data.name, config.data.dir)
  if is_prepared(builder):
    return
  root = str(builder.data_dir_root)
  name = config.data.name
  command = PREPARE_COMMAND.format(name=name, data_dir=config.data.dir or root)
  if builder.MANUAL_DOWNLOAD_INSTRUCTIONS:
    raise errors.DataError(
      f"tfds dataset {name!r} is not prepared in {root} and tfds cannot download it by itself; "
      f"prepare it once as tfds' instructions say (`{command}` prints them), then pass "
      "--config.data.dir=DIR"
    )
  if not may_download:
    raise errors.DataError(
      f"tfds dataset {name!r} is not prepared in {root}; a multi-process run does not download "
      f"(its processes would race): prepare it once with `{command}` and start the run again"
    )
  download_and_prepare(builder)


def download_and_prepare(builder) -> None:
  """Runs tfds' download and preparation; no network is a DataError that names the way out."""
  name, root = builder.name, str(builder.data_dir_root)
  host = _download_host(builder)
  if host is not None and not _reachable(host):
    raise errors.DataError(_offline_message(name, root, f"no connection to {host}"))
  logging.info("Downloading and preparing tfds dataset %r in %s (once).", name, root)
  library_logs.import_tensorflow()  # tfds would import it, start-up chatter included.
  try:
    builder.download_and_prepare()
  except Exception as error:
    if not _is_network_error(error):
      raise
    why = f"the download failed: {' '.join(str(error).split())[:200]}"
    raise errors.DataError(_offline_message(name, root, why)) from error


def tfds_builder(name: str, data_dir: str | None):
  """tfds' builder for `name` in `data_dir` (None: tfds' default), quietly."""
  import tensorflow_datasets as tfds

  with _quiet_tfds():
    try:
      return tfds.builder(name, data_dir=data_dir, try_gcs=False)
    except tfds.core.registered.DatasetNotFoundError as error:
      raise errors.ConfigError(
        f"config.data.name={name!r} is neither a tfds dataset nor 'folder' (for an image "
        f"folder: {FOLDER_FLAGS})"
      ) from error


def is_prepared(builder) -> bool:
  """builder.is_prepared(), without tfds' warning about an unprepared dataset's missing files."""
  with _quiet_tfds():
    return builder.is_prepared()


def _offline_message(name: str, root: str, why: str) -> str:
  prepare = PREPARE_COMMAND.format(name=name, data_dir="DIR")
  return (
    f"tfds dataset {name!r} is not prepared in {root} and cannot be downloaded ({why}). "
    "Either:\n"
    f"  - prepare it on a machine with internet (`{prepare}`), copy DIR here and pass "
    "--config.data.dir=DIR, or\n"
    f"  - train from an image folder: {FOLDER_FLAGS} with {FOLDER_LAYOUT}"
  )


def _check_not_a_folder(config: ml_collections.ConfigDict) -> None:
  """An image folder given as a tfds data_dir would get the download written into it."""
  root, name = config.data.dir, config.data.name
  if not root or "://" in root or os.path.isdir(os.path.join(root, name)):
    return
  if os.path.isdir(os.path.join(root, config.data.train_split)):
    raise errors.ConfigError(
      f"config.data.dir={root!r} is an image folder ({config.data.train_split}/<class>/...) but "
      f"config.data.name={name!r} is a tfds dataset; add --config.data.name=folder"
    )


def _check_folder(config: ml_collections.ConfigDict) -> None:
  root, split = config.data.dir, config.data.train_split
  if root and os.path.isdir(os.path.join(root, split)):
    return
  problem = "not found" if not root or not os.path.isdir(root) else f"has no {split!r} folder"
  raise errors.DataError(
    f"config.data.dir={root!r} {problem}: an image folder is {FOLDER_LAYOUT}; or train on a "
    "tfds dataset, which is downloaded on first use (e.g. --config.data.name=cifar10)"
  )


def _download_host(builder) -> str | None:
  """The host of the builder's first download URL, if tfds records its URLs."""
  try:
    urls = builder.url_infos or {}
  except Exception:  # No checksums file, or one tfds cannot read: the download will tell.
    return None
  for url in urls:
    host = urllib.parse.urlparse(url).hostname
    if host:
      return host
  return None


def _reachable(host: str, timeout: float = _PROBE_SECONDS) -> bool:
  """Whether a TCP connection to host:443 opens within `timeout` (proxies: assumed reachable)."""
  if any(os.environ.get(v) for v in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")):
    return True
  result = []

  def connect() -> None:
    try:
      with socket.create_connection((host, 443), timeout=timeout):
        result.append(True)
    except OSError:
      result.append(False)

  thread = threading.Thread(target=connect, daemon=True)  # Name resolution ignores timeouts.
  thread.start()
  thread.join(timeout + 0.5)
  return bool(result and result[0])


def _is_network_error(error: BaseException) -> bool:
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    name = type(error).__name__
    if isinstance(error, (ConnectionError, TimeoutError, socket.gaierror)) or name in (
      "ConnectionError",
      "DownloadError",
      "MaxRetryError",
      "NewConnectionError",
      "Timeout",
    ):
      return True
    error = error.__cause__ or error.__context__
  return False


@contextlib.contextmanager
def _quiet_tfds():
  """Hides tfds' warnings about a dataset that is not prepared yet (this module reports it)."""

  class _Filter(logging_lib.Filter):
    def filter(self, record: logging_lib.LogRecord) -> bool:
      return "tensorflow_datasets" not in record.pathname or record.levelno >= logging_lib.ERROR

  quiet, logger = _Filter(), logging.get_absl_logger()
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)
