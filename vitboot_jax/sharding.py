"""Device mesh and shardings: data parallelism over every device of every host.

Parameters and optimizer state are replicated; batches are split along the batch axis. The mesh
uses Auto axes so XLA's sharding propagation (GSPMD) places the collectives: the gradient
all-reduce and the global-batch BatchNorm statistics come out of plain `jnp.mean`s.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

DATA_AXIS = "data"


def make_mesh(devices: list[Any] | None = None) -> jax.sharding.Mesh:
  devices = devices or jax.devices()
  return jax.make_mesh(
    (len(devices),), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
  )


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def global_batch(local: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
  """This process's slice of the batch -> global jax.Arrays sharded over all processes' devices."""
  sharding = batch_sharded(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()
  }


def global_batches(
  local: list[dict[str, np.ndarray]], mesh: jax.sharding.Mesh
) -> dict[str, jax.Array]:
  """Several local batches stacked [n, B, ...] -> global arrays split on the batch axis (axis 1)."""
  sharding = NamedSharding(mesh, PartitionSpec(None, DATA_AXIS))
  return {
    k: jax.make_array_from_process_local_data(sharding, np.stack([b[k] for b in local]))
    for k in local[0]
  }


# How many exchanges of each name this process made: an exchange pairs with the others' of its
# name and number, so a call one process alone made shifts that name's pairing only.
_EXCHANGES: collections.Counter[str] = collections.Counter()


def exchange(name: str, value: str, timeout_s: float = 600.0) -> list[str]:
  """Every process's `value` at `name`, in process order (`[value]` for one process).

  Through jax.distributed's key-value store, not a collective: processes may arrive minutes apart
  (imports, data checks, a loaded host), longer than a CPU collective's set-up (Gloo: 30 s)
  waits, and a process that gives up raises after `timeout_s` instead of waiting for ever. Every
  process must make the same exchanges of each name in the same order (the keys are numbered per
  name, so exchanges of different names never pair).
  """
  if jax.process_count() == 1:
    return [value]
  from jax._src import distributed  # The store jax.distributed started (orbax uses it too).

  client = distributed.global_state.client
  prefix = f"vitboot_jax/exchange/{name}/{_EXCHANGES[name]}"
  _EXCHANGES[name] += 1
  client.key_value_set(f"{prefix}/{jax.process_index()}", value)
  return _collect(client, prefix, timeout_s)


def _collect(client, prefix: str, timeout_s: float) -> list[str]:
  """Every process's value under `prefix`, waiting up to `timeout_s` for each."""
  return [
    client.blocking_key_value_get(f"{prefix}/{process}", int(timeout_s * 1000))
    for process in range(jax.process_count())
  ]
