r"""Rate of the host input pipeline: the training stream train.py feeds to the steps.

  python -m vitboot_jax.tools.perf.benchmark_input --config=configs/vits_cifar10.py \
    --config.data.name=folder --config.data.dir=../shared/data/cifar10 [--batches 200]

The first epoch (which fills the decoded-image cache when config.data.cache) is read untimed,
then `--batches` batches are timed as numpy arrays, as train.py receives them. Prints one JSON
object: {"img_per_s", "bytes_per_image", "image_shape", "dtype", "batch", "batches", "seconds",
"host_cores"}; image fields describe what crosses to the device (uint8 at the stored size when
the steps upscale on the device, see configlib.device_resize_from).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax.data import tfdata_pipeline


def measure(
  config: ml_collections.ConfigDict, *, batches: int, warmup: int | None = None
) -> dict[str, Any]:
  """Times `batches` batches of process 0's training stream after `warmup` (default one epoch)."""
  if batches < 1:
    raise ValueError(f"--batches={batches} must be at least 1")
  info = tfdata_pipeline.dataset_info(config)
  warmup = info.steps_per_epoch if warmup is None else warmup
  stream = tfdata_pipeline.train_batches(config, process_index=0, process_count=1)
  for _ in range(warmup):
    next(stream)
  start = time.perf_counter()
  nbytes, images = 0, 0
  for _ in range(batches):
    batch = next(stream)
    nbytes += batch["image"].nbytes
    images += batch["image"].shape[0]
  seconds = time.perf_counter() - start
  image = np.asarray(batch["image"])
  return {
    "img_per_s": images / seconds,
    "bytes_per_image": nbytes // images,
    "image_shape": list(image.shape[1:]),
    "dtype": str(image.dtype),
    "batch": int(image.shape[0]),
    "batches": batches,
    "seconds": seconds,
    "host_cores": len(os.sched_getaffinity(0)),
  }


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["batches"] = flags.DEFINE_integer("batches", 200, "Timed batches.")
  _FLAGS["warmup"] = flags.DEFINE_integer(
    "warmup", -1, "Untimed batches first; -1: one epoch (fills the decoded-image cache)."
  )
  flags.mark_flags_as_required(["config"])


def main(argv: Sequence[str]) -> None:
  del argv
  value = {name: holder.value for name, holder in _FLAGS.items()}
  warmup = None if value["warmup"] < 0 else value["warmup"]
  row = measure(value["config"], batches=value["batches"], warmup=warmup)
  print(json.dumps(row), flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
