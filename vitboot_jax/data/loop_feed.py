"""What the training loop feeds its jitted step, whichever pipeline makes the batches.

`open_feed(config, mesh)` gives the run's `info` (sizes), `train(start_step)`: a function
`next_input(n)` giving the second argument of the jitted call of the next n steps from
`start_step` on, `eval_batches(part)`: one evaluation's global batches of the test split or of
the validation split, and `check_eval_split()`: a bad test image fails before training. With
config.data.pipeline="tfdata" the input is the next host batch split over the mesh (n == 1) or
the next n stacked [n, B, ...]; with "device" it is the same on-device dataset every call
(device_pipeline.feeding makes each batch inside the step), and every image was decoded and
checked as it was loaded. Only the tf.data feed imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import ml_collections

from vitboot_jax import sharding
from vitboot_jax.data import splits
from vitboot_jax.data.splits import DatasetInfo


def eval_parts(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """What each evaluation reads: the validation split, where the config has one, then the eval
  (test) split."""
  return ("val", "eval") if splits.validation_split(config) else ("eval",)


class TfDataFeed:
  """Batches from tfdata_pipeline (tf.data on the host), transferred every step."""

  on_device = False

  def __init__(self, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
    from vitboot_jax.data import tfdata_pipeline

    self._pipeline, self._config, self._mesh = tfdata_pipeline, config, mesh
    self.info: DatasetInfo = tfdata_pipeline.dataset_info(config)
    # Built once: they cache images.
    self._eval_datasets = {
      part: tfdata_pipeline.eval_dataset(config, part=part) for part in eval_parts(config)
    }

  def train(self, start_step: int) -> Callable[[int], dict[str, jax.Array]]:
    batches = self._pipeline.train_batches(self._config, start_step=start_step)

    def next_input(n: int) -> dict[str, jax.Array]:
      local = [next(batches) for _ in range(n)]
      if n == 1:
        return sharding.global_batch(local[0], self._mesh)
      return sharding.global_batches(local, self._mesh)

    return next_input

  def eval_batches(self, part: str = "eval") -> Iterator[dict[str, jax.Array]]:
    split = splits.part_split(self._config, part)
    local = self._pipeline.numpy_batches(self._eval_datasets[part], self._config, split)
    return (sharding.global_batch(b, self._mesh) for b in local)

  def check_eval_split(self) -> None:
    """Fails now on a bad test (or validation) image (tfdata_undecodable.check_split), not at the
    first eval."""
    from vitboot_jax.data import tfdata_undecodable

    for part in eval_parts(self._config):
      tfdata_undecodable.check_split(self._config, splits.part_split(self._config, part))


class DeviceFeed:
  """The dataset on the devices (device_pipeline.py): nothing is transferred after start-up."""

  on_device = True

  def __init__(self, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
    from vitboot_jax.data import device_pipeline

    self._dataset = device_pipeline.DeviceDataset(config, mesh)
    self.info: DatasetInfo = self._dataset.info

  def train(self, start_step: int) -> Callable[[int], Any]:
    del start_step  # The step picks its own batch from state.step.
    return lambda n: self._dataset.train

  def eval_batches(self, part: str = "eval") -> Iterator[dict[str, jax.Array]]:
    return self._dataset.eval_batches(part)

  def check_eval_split(self) -> None:
    """Nothing left to check: loading decoded every image and checked its size."""


Feed = TfDataFeed | DeviceFeed  # Either: info, train, eval_batches, check_eval_split.


def open_feed(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> Feed:
  """The feed of config.data.pipeline."""
  if config.data.get("pipeline", "tfdata") == "device":
    return DeviceFeed(config, mesh)
  return TfDataFeed(config, mesh)
