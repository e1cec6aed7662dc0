"""What one config trains with: models, optimizer, sharded state and the jitted steps.

`build(config, mesh, steps_per_epoch)` is the one setup of train.py, tools/perf/benchmark.py and
tools/visualize.py; train.py keeps the loop. `make_steps` is where the pure init and step are made
(the official ones, which the mechanism study's hint variants wrap), for build and for the tools
that lower or count a step without a mesh. The config is taken as valid: the entry points call
configlib.validate once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import optax

from vitboot_jax import configlib, evaluate, init_from, kernel_sets, optim, sharding
from vitboot_jax.data import device_pipeline, step_preprocess
from vitboot_jax.method import hint_variants, steps
from vitboot_jax.models.build import ModelSet, build_models
from vitboot_jax.models.kernels import Kernels
from vitboot_jax.state import TrainState, create_state


@dataclasses.dataclass(frozen=True, eq=False)
class Trainer:
  """The models, optimizer, state layout and jitted steps of one config on one mesh."""

  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  models: ModelSet
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  state_sharding: TrainState  # A sharding per leaf of the state.
  abstract_state: TrainState  # ShapeDtypeStructs carrying those shardings (checkpoint restore).
  init: Callable[[jax.Array], TrainState]  # Jitted: rng -> fresh state, written sharded.
  # Jitted, donates state: (state, batch), or (state, data) with config.data.pipeline="device".
  train_step: Callable[..., tuple[TrainState, dict[str, jax.Array]]]
  # n -> the jitted call of n steps (steps.make_multi_step): over stacked batches [n, B, ...], or
  # over the dataset on the devices; donates the state, metrics come back stacked [n]. Cached:
  # one compile per distinct n.
  multi_step: Callable[[int], Callable[..., tuple[TrainState, dict[str, jax.Array]]]]
  eval_step: Callable[..., dict[str, Any]]  # Jitted (params, batch_stats, batch) -> sums.
  prepare: Callable[[jax.Array], jax.Array]  # Finishes shipped images on the device.
  total_steps: int  # The optimiser steps of the run (configlib.total_steps).

  @property
  def replicated(self) -> jax.sharding.NamedSharding:
    return sharding.replicated(self.mesh)

  def fresh_state(self) -> TrainState:
    """The jitted init at config.seed, before the attention initialiser's host-side rewrite."""
    return self.init(jax.random.key(self.config.seed))

  def initial_state(self) -> TrainState:
    """The state a fresh run starts from: init, its host-side part, config.init_from and
    config.agent_init_from."""
    rng = jax.random.key(self.config.seed)
    state = self.init(rng)
    params = self.models.init_on_host(state.params, rng)
    if params is not state.params:
      state = state.replace(params=jax.device_put(params, self.state_sharding.params))
    if self.config.init_from:
      state = init_from.initialise(state, self.config, self.tx, self.state_sharding)
    if self.config.get("agent_init_from"):
      state = init_from.initialise_agent(state, self.config, self.tx, self.state_sharding)
    return state


def make_steps(
  config: ml_collections.ConfigDict,
  models: ModelSet,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  *,
  steps_per_epoch: int,
  total_steps: int,
  prepare: Callable[[jax.Array], jax.Array],
) -> tuple[Callable[[jax.Array], TrainState], steps.StepFn]:
  """The pure init (rng -> fresh state; jit it or eval_shape it) and train step of `config`:
  the official ones, which the mechanism study's hint variants wrap when a switch is set."""
  image_shape = (config.image_size, config.image_size, 3)
  init = functools.partial(create_state, models, tx, image_shape=image_shape)
  make_step = functools.partial(
    steps.make_train_step, config, models, tx, schedule, steps_per_epoch, prepare
  )
  return hint_variants.wrap(config, total_steps, init, make_step)


def build(
  config: ml_collections.ConfigDict,
  mesh: jax.sharding.Mesh,
  steps_per_epoch: int,
  *,
  kernels: Kernels | None = None,
) -> Trainer:
  """The Trainer of `config` on `mesh`: state replicated, batches split over the mesh.

  Kernels are chosen for the mesh's devices unless `kernels` is given (kernel A/Bs).
  """
  models = build_models(config, kernels or kernel_sets.for_config(config, mesh.devices.flat))
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch)
  total_steps = configlib.total_steps(config, steps_per_epoch)
  prepare = step_preprocess.make_prepare(config)  # The train and the eval step's, one copy.
  init, step_fn = make_steps(
    config,
    models,
    tx,
    schedule,
    steps_per_epoch=steps_per_epoch,
    total_steps=total_steps,
    prepare=prepare,
  )
  # Sharded init: shapes first, then one jitted init that writes straight into the shardings.
  abstract_state = jax.eval_shape(init, jax.random.key(config.seed))
  replicated = sharding.replicated(mesh)
  state_sharding = jax.tree.map(lambda _: replicated, abstract_state)
  abstract_state = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, state_sharding
  )
  on_device = config.data.get("pipeline", "tfdata") == "device"
  if on_device:  # The batch is made inside the step, from the dataset on the devices.
    step_fn = device_pipeline.feeding(step_fn, config, mesh, steps_per_epoch)
  jit_step = functools.partial(
    jax.jit, donate_argnums=0, out_shardings=(state_sharding, replicated)
  )
  train_step = jit_step(step_fn)

  @functools.cache
  def multi_step(num_steps: int):
    if not on_device:
      return jit_step(steps.make_multi_step(step_fn, num_steps))

    def call(state: TrainState, data: Any) -> tuple[TrainState, dict[str, jax.Array]]:
      return steps.make_multi_step(lambda s, _: step_fn(s, data), num_steps)(state)

    return jit_step(call)

  eval_step = jax.jit(
    evaluate.make_eval_step(models, prepare),
    out_shardings=replicated,
    compiler_options=dict(models.kernels.inference_compiler_options) or None,
  )
  return Trainer(
    config=config,
    mesh=mesh,
    models=models,
    tx=tx,
    schedule=schedule,
    state_sharding=state_sharding,
    abstract_state=abstract_state,
    init=jax.jit(init, out_shardings=state_sharding),
    train_step=train_step,
    multi_step=multi_step,
    eval_step=eval_step,
    prepare=prepare,
    total_steps=total_steps,
  )
