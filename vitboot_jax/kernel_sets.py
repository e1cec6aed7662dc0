"""Which kernel set a step gets (config.kernels = auto | xla | cpu): the one place it is chosen.

"auto" takes the `cpu` set (vitboot_jax/cpu/kernels.py) on CPU devices and the `xla` set
(models/kernels.py) on every accelerator; either can be asked for by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections

from vitboot_jax.cpu import kernels as cpu_kernels
from vitboot_jax.models.kernels import XLA, Kernels

# name -> the set for a batch split over that many devices.
SETS: dict[str, Callable[[int], Kernels]] = {
  "xla": lambda shards: dataclasses.replace(XLA, batch_shards=shards),
  "cpu": cpu_kernels.for_shards,
}


def resolve(choice: str, platform: str) -> str:
  """ "auto" -> "cpu" on CPU devices, "xla" on every accelerator; "xla"/"cpu" stay."""
  if choice == "auto":
    return "cpu" if platform == "cpu" else "xla"
  return choice


def for_platform(choice: str, platform: str, batch_shards: int = 1) -> Kernels:
  """The kernel set `choice` for `platform` ("cpu", "cuda", "rocm", "tpu", "gpu")."""
  return SETS[resolve(choice, platform)](max(1, batch_shards))


def for_devices(choice: str, devices: Sequence[Any]) -> Kernels:
  """The kernel set `choice` for a step that runs (data-parallel) on `devices`."""
  devices = list(devices)
  platforms = {d.platform for d in devices}
  if len(platforms) != 1:
    raise ValueError(f"the mesh mixes device platforms {sorted(platforms)}; use one kind")
  return for_platform(choice, platforms.pop(), batch_shards=len(devices))


def for_config(
  config: ml_collections.ConfigDict,
  devices: Sequence[Any] | None = None,
  *,
  platform: str | None = None,
) -> Kernels:
  """config.kernels for the devices the steps run on (default: all of jax's devices), or for
  `platform` ("cpu", "cuda", "tpu") when exporting for another machine."""
  choice = config.get("kernels", "auto")
  if platform is not None:
    return for_platform(choice, platform)
  return for_devices(choice, jax.devices() if devices is None else devices)
