"""Data on first use (prepare.ensure) and tools/prepare_data, with a stand-in tfds builder.

Nothing here touches the network: the stand-in has no URLs, and the offline cases refuse every
socket connection.
"""

import socket

import numpy as np
import pytest
import tensorflow_datasets as tfds

from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.data import prepare, tfdata_pipeline
from vitboot_jax.tools import prepare_data

CLASSES = ("cat", "dog")


class VitbootFirstUse(tfds.core.GeneratorBasedBuilder):
  """8 train / 4 test 32x32 images of 2 classes, generated (nothing to download)."""

  VERSION = tfds.core.Version("1.0.0")
  url_infos = None

  def _info(self):
    features = tfds.features.FeaturesDict(
      {
        "image": tfds.features.Image(shape=(32, 32, 3)),
        "label": tfds.features.ClassLabel(names=list(CLASSES)),
      }
    )
    return tfds.core.DatasetInfo(
      builder=self, features=features, supervised_keys=("image", "label")
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(8), "test": self._generate_examples(4)}

  def _generate_examples(self, n):
    for k in range(n):
      yield k, {"image": np.full([32, 32, 3], 10 * k, np.uint8), "label": k % 2}


class VitbootManual(VitbootFirstUse):
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Register on the website and download the archives."


def _config(name="vitboot_first_use", data_dir=None):
  c = configlib.base_config()
  c.data.name = name
  c.data.dir = None if data_dir is None else str(data_dir)
  c.data.num_classes = 2
  c.batch_size = 4
  return c


@pytest.fixture
def downloads(monkeypatch):
  """Counts the builder's download_and_prepare calls (still running them)."""
  calls = []
  original = tfds.core.DatasetBuilder.download_and_prepare

  def counted(self, *args, **kwargs):
    calls.append(self.name)
    kwargs.setdefault(
      "download_config",
      tfds.download.DownloadConfig(
        try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
      ),
    )
    return original(self, *args, **kwargs)

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", counted)
  return calls


@pytest.fixture
def offline(monkeypatch):
  def refuse(*args, **kwargs):
    raise socket.gaierror(-2, "Name or service not known")

  monkeypatch.setattr(socket, "create_connection", refuse)
  for variable in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
    monkeypatch.delenv(variable, raising=False)


def test_prepared_on_first_use_then_reused(tmp_path, downloads):
  config = _config(data_dir=tmp_path)
  prepare.ensure(config, may_download=True)
  assert downloads == ["vitboot_first_use"]
  prepare.ensure(config, may_download=True)
  assert downloads == ["vitboot_first_use"]  # Reused, not prepared again.
  info = tfdata_pipeline.dataset_info(config)
  assert (info.num_train_examples, info.num_eval_examples, info.class_names) == (8, 4, CLASSES)


def test_default_data_dir_is_tfds_own(tmp_path, monkeypatch, downloads):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds_home"))
  monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tmp_path / "tfds_home"))
  prepare.ensure(_config(), may_download=True)
  assert (tmp_path / "tfds_home" / "vitboot_first_use" / "1.0.0").is_dir()


def test_multi_process_runs_never_download(tmp_path, downloads):
  with pytest.raises(errors.DataError, match=r"multi-process .*prepare_data vitboot_first_use"):
    prepare.ensure(_config(data_dir=tmp_path), may_download=False)
  assert downloads == [] and not (tmp_path / "vitboot_first_use").exists()


def test_offline_names_both_ways_out(tmp_path, monkeypatch, offline, downloads):
  urls = {"https://data.example.org/tiny.tar.gz": None}
  monkeypatch.setattr(VitbootFirstUse, "url_infos", urls)
  with pytest.raises(errors.DataError) as raised:
    prepare.ensure(_config(data_dir=tmp_path), may_download=True)
  message = str(raised.value)
  assert "no connection to data.example.org" in message
  assert "prepare_data vitboot_first_use --data_dir=DIR" in message
  assert "--config.data.name=folder --config.data.dir=ROOT" in message
  assert len(message.splitlines()) == 3 and downloads == []


def test_a_failed_download_gives_the_offline_message(tmp_path, monkeypatch):
  def no_network(self, *args, **kwargs):
    raise ConnectionError("Connection reset by peer")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_network)
  with pytest.raises(errors.DataError, match=r"the download failed: Connection reset .*Either"):
    prepare.ensure(_config(data_dir=tmp_path), may_download=True)


def test_other_failures_are_not_disguised(tmp_path, monkeypatch):
  def broken(self, *args, **kwargs):
    raise RuntimeError("a bug")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", broken)
  with pytest.raises(RuntimeError, match="a bug"):
    prepare.ensure(_config(data_dir=tmp_path), may_download=True)


def test_manual_datasets_are_not_attempted(tmp_path, downloads):
  with pytest.raises(errors.DataError, match="cannot download it by itself"):
    prepare.ensure(_config("vitboot_manual", tmp_path), may_download=True)
  with pytest.raises(errors.DataError, match=r"downloads/manual .*Register on the website"):
    prepare_data.prepare("vitboot_manual", str(tmp_path))
  assert downloads == []


def test_unknown_name_and_missing_folder(tmp_path):
  with pytest.raises(errors.ConfigError, match="neither a tfds dataset nor 'folder'"):
    prepare.ensure(_config("no_such_dataset_xyz", tmp_path), may_download=True)
  folder = _config("folder", tmp_path / "missing")
  with pytest.raises(errors.DataError, match=r"not found: an image folder is ROOT/\{train,test\}"):
    prepare.ensure(folder, may_download=True)
  (tmp_path / "root").mkdir()
  with pytest.raises(errors.DataError, match="has no 'train' folder"):
    prepare.ensure(_config("folder", tmp_path / "root"), may_download=True)


def test_an_image_folder_is_not_taken_for_a_tfds_directory(tmp_path, downloads):
  (tmp_path / "train" / "cat").mkdir(parents=True)
  with pytest.raises(errors.ConfigError, match="is an image folder .*--config.data.name=folder"):
    prepare.ensure(_config(data_dir=tmp_path), may_download=True)
  assert downloads == [] and sorted(p.name for p in tmp_path.iterdir()) == ["train"]


def test_prepare_data_tool(tmp_path, downloads):
  path = prepare_data.prepare("vitboot_first_use", str(tmp_path))
  assert path == str(tmp_path / "vitboot_first_use" / "1.0.0")
  assert prepare_data.prepare("vitboot_first_use", str(tmp_path)) == path
  assert downloads == ["vitboot_first_use"]
  prepare.ensure(_config(data_dir=tmp_path), may_download=False)  # What a pod run then sees.
