r"""What the field's recipe (data/recipe_augment.py, recipe=deit) costs a train step.

  python -m vitboot_jax.tools.perf.recipe_cost --config=configs/quickstart.py:mode=vit
  python -m vitboot_jax.tools.perf.recipe_cost --config=configs/vits_cifar10.py:mode=vit \
    --platform=cuda --batch=64 --lower_only

Timed (not with --lower_only): the config's step with the recipe and without, compiled as train.py
compiles them and timed in turn in one process (a shared machine slows both alike), and the
recipe's batch function alone. Lowered: XLA's cost analysis of the recipe's batch function and of
the step, lowered for --platform (no accelerator needed), so the recipe's FLOPs and bytes stand
beside the step's wherever it runs.

Output, one JSON object per line: the measured matmul peak of the devices (benchmark.measure_peak),
then {"kind": "timed", "step_s_off", "step_s_on", "overhead" (on / off - 1), "augment_s",
"augment_share" (augment_s / step_s_off), ...} and {"kind": "lowered", "platform",
"augment_flops", "augment_bytes", "step_flops", "step_bytes", "flops_share", "bytes_share", ...}.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax import sharding
from vitboot_jax.data import recipe_augment, step_preprocess
from vitboot_jax.tools.perf import benchmark, lowering


def with_recipe(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with recipe=deit (configs/common.py RECIPES), as the switch sets it."""
  from configs import common  # The config files' table, outside the package.

  c = config.copy_and_resolve_references()
  frozen = int(bool(c.agent_frozen))
  arg = common.parse_arg(f"mode={c.mode},frozen={frozen},recipe=deit", **common.SWITCHES, mode="")
  common.recipe(c, arg)
  return c


def _shipped_batch(config: ml_collections.ConfigDict, batch: int) -> dict[str, Any]:
  shape, dtype = step_preprocess.shipped_image(config)
  return {
    "image": jax.ShapeDtypeStruct((batch, *shape), dtype),
    "label": jax.ShapeDtypeStruct((batch,), jnp.int32),
  }


def _cost(lowered: Any) -> tuple[float | None, float | None]:
  try:
    analysis = lowered.cost_analysis()
  except Exception:  # Some backends cannot analyse a module lowered for another platform.
    return None, None
  if isinstance(analysis, list):
    analysis = analysis[0] if analysis else {}
  analysis = analysis or {}
  return analysis.get("flops"), analysis.get("bytes accessed")


def lowered_costs(config: ml_collections.ConfigDict, platform: str, batch: int) -> dict[str, Any]:
  """XLA's cost analysis of the recipe's batch function and of the step with it, for `platform`."""
  on = benchmark.mode_config(with_recipe(config), config.mode, batch)
  models, train_step, _, state, train_batch, _ = lowering.step_specs(on, platform)
  del models
  batch_fn = recipe_augment.make_batch_fn(on, step_preprocess.make_prepare(on))
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)

  def lower(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))

  augment_flops, augment_bytes = _cost(lower(batch_fn, _shipped_batch(on, batch), key))
  step_flops, step_bytes = _cost(lower(train_step, state, train_batch))
  share = lambda a, b: a / b if a is not None and b else None
  return {
    "kind": "lowered",
    "platform": platform,
    "mode": config.mode,
    "image_size": config.image_size,
    "batch": batch,
    "augment_flops": augment_flops,
    "augment_bytes": augment_bytes,
    "step_flops": step_flops,
    "step_bytes": step_bytes,
    "flops_share": share(augment_flops, step_flops),
    "bytes_share": share(augment_bytes, step_bytes),
  }


def timed(config: ml_collections.ConfigDict, batch: int, rounds: int, warmup: int) -> dict:
  """The step without and with the recipe, and the recipe's batch function, timed in turn."""
  mesh = sharding.make_mesh()
  off = benchmark.compile_mode_step(config, config.mode, mesh, batch=batch)
  on = benchmark.compile_mode_step(with_recipe(config), config.mode, mesh, batch=batch)
  recipe_config = benchmark.mode_config(with_recipe(config), config.mode, batch)
  prepare = step_preprocess.make_prepare(recipe_config)
  batch_fn = jax.jit(recipe_augment.make_batch_fn(recipe_config, prepare))
  shape, dtype = step_preprocess.shipped_image(recipe_config)
  images = jax.random.randint(jax.random.key(0), (batch, *shape), 0, 256).astype(dtype)
  data = sharding.global_batch(
    {"image": jax.device_get(images), "label": jax.device_get(jnp.zeros((batch,), jnp.int32))},
    mesh,
  )
  key = jax.random.key(1)
  times = benchmark.time_alternately(
    {"off": off, "on": on, "augment": lambda: batch_fn(data, key)}, rounds, warmup
  )
  return {
    "kind": "timed",
    "mode": config.mode,
    "image_size": config.image_size,
    "batch": batch,
    "step_s_off": times["off"],
    "step_s_on": times["on"],
    "overhead": times["on"] / times["off"] - 1.0,
    "augment_s": times["augment"],
    "augment_share": times["augment"] / times["off"],
    "rounds": rounds,
    "devices": jax.device_count(),
    "kernels": off.trainer.models.kernels.name,
  }


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file (recipe off).")
  _FLAGS["batch"] = flags.DEFINE_integer("batch", 0, "Global batch; 0: config.batch_size.")
  _FLAGS["rounds"] = flags.DEFINE_integer("rounds", 20, "Timed rounds (each times all three).")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 3, "Untimed calls of each first.")
  _FLAGS["platform"] = flags.DEFINE_string("platform", "cpu", "Platform to lower for.")
  _FLAGS["lower_only"] = flags.DEFINE_bool("lower_only", False, "Only the lowered costs.")
  flags.mark_flags_as_required(["config"])


def main(argv: Sequence[str]) -> None:
  del argv
  config = _FLAGS["config"].value
  batch = _FLAGS["batch"].value or config.batch_size
  if not _FLAGS["lower_only"].value:
    print(json.dumps(benchmark.measure_peak(sharding.make_mesh())), flush=True)
    print(json.dumps(timed(config, batch, _FLAGS["rounds"].value, _FLAGS["warmup"].value)))
  print(json.dumps(lowered_costs(config, _FLAGS["platform"].value, batch)), flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
