"""The training state: one pytree, so it is donated, sharded and checkpointed as a unit."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from vitboot_jax.models.build import ModelSet


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer steps taken.
  params: Any  # {"vit": ..., "agent": ...}
  batch_stats: Any  # {"agent": ...}
  opt_state: Any
  rng: jax.Array  # Raw key data (uint32), so orbax can store it; dropout keys fold in the step.


def create_state(
  models: ModelSet,
  tx: optax.GradientTransformation,
  rng: jax.Array,
  image_shape: tuple[int, ...],
) -> TrainState:
  """Initial state; call under `jax.jit(..., out_shardings=...)` or `jax.eval_shape`."""
  init_rng, train_rng = jax.random.split(rng)
  variables = models.init(init_rng, jnp.zeros((1, *image_shape), jnp.float32))
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=variables["params"],
    batch_stats=variables["batch_stats"],
    opt_state=tx.init(variables["params"]),
    rng=jax.random.key_data(train_rng),
  )
