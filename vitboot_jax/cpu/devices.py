"""CPU-only hosts: one XLA device per core, so a step runs data-parallel across the cores.

XLA:CPU gives its single default device every core through intra-op threads, which the small
matmuls and elementwise passes of CPU-scale ViT steps cannot keep busy. Split into one device per
core, the host runs the batch sharded over a mesh exactly as an accelerator host does
(docs/performance.md has the measurements). Only the CPU client is shaped: on GPU and TPU hosts
the devices that train are unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from absl import flags

from vitboot_jax.base import errors

# Each device holds a replica of the train state; beyond 8 replicas the memory cost is unmeasured.
MAX_AUTO_DEVICES = 8
FLAG_HELP = (
  "CPU devices to split a CPU-only host into: 0 (default) one per core, as many as divide the "
  "batch sizes (at most 8); 1 one device using every core through XLA's threads; N exactly N. "
  "Ignored when XLA_FLAGS sets --xla_force_host_platform_device_count or JAX_NUM_CPU_DEVICES is "
  "set."
)


def usable_cores() -> int:
  """Cores this process may run on (its affinity mask, e.g. under taskset or a container)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    return os.cpu_count() or 1


def auto_count(batch_sizes: Sequence[int], cores: int) -> int:
  """The most devices, up to one per core and MAX_AUTO_DEVICES, that split every batch evenly."""
  common = math.gcd(*batch_sizes)
  limit = max(1, min(cores, MAX_AUTO_DEVICES))
  return max(n for n in range(1, limit + 1) if common % n == 0)


def count_fixed_by_environment() -> bool:
  """True when the environment already chose the CPU device count (tests, users' own flags)."""
  xla_flags = os.environ.get("XLA_FLAGS", "")
  return "xla_force_host_platform_device_count" in xla_flags or "JAX_NUM_CPU_DEVICES" in os.environ


def split_host(
  batch_sizes: Sequence[int], requested: int = 0, cores: int | None = None
) -> int | None:
  """Sets how many devices JAX's CPU client creates; call before JAX's first operation.

  Returns the count set, or None when the environment already fixes it. `requested` is the
  --cpu_devices flag (see FLAG_HELP); an explicit count must divide every batch size.
  """
  if requested < 0:
    raise errors.UsageError(f"--cpu_devices={requested} must be 0 (one per core) or positive")
  uneven = [size for size in batch_sizes if requested and size % requested]
  if uneven:
    raise errors.UsageError(
      f"--cpu_devices={requested} does not divide the batch size(s) {uneven}; "
      f"pick a count that divides {math.gcd(*batch_sizes)}, or 0 for one device per core"
    )
  if count_fixed_by_environment():
    return None
  count = requested or auto_count(batch_sizes, usable_cores() if cores is None else cores)
  import jax

  jax.config.update("jax_num_cpu_devices", count)
  return count


def define_flag() -> flags.FlagHolder[int]:
  """The --cpu_devices flag, one definition for main and the perf tools (they must agree)."""
  return flags.DEFINE_integer("cpu_devices", 0, FLAG_HELP)


def split_host_for(config, requested: int = 0, batch: int = 0) -> int | None:
  """split_host for a run of `config`: its train batch (`batch` if set) and its eval batch."""
  return split_host((batch or config.batch_size, config.data.eval_batch_size), requested=requested)
