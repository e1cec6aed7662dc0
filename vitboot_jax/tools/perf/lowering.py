r"""Proof that every step lowers for GPUs and TPUs: jax.export of each mode's train and eval step.

  python -m vitboot_jax.tools.perf.lowering --config=configs/vits_cifar100.py --platforms=cuda,tpu

No accelerator is needed: jax.export lowers for a named platform on any host. For each mode of
the config (vit, agent, joint, shared), compute dtype (float32, bfloat16) and platform, the
models are built with `config.kernels` resolved for that platform ("auto": the xla set on cuda
and tpu, the cpu set on cpu), and both steps are exported. One JSON line per (mode, platform,
dtype): {"mode", "platform", "dtype", "kernels", "ok", "error", "convolutions", "dot_generals",
"host_callbacks", "flops" (2 x MACs of one train step), "flops_per_image", "eval_flops_per_image",
"batch", "image_shape" (as the host ships it)}; the op counts add up the train and the eval module.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import app, flags
from jax import export
from ml_collections import config_flags

from vitboot_jax import configlib, evaluate, kernel_sets, optim
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.data import step_preprocess
from vitboot_jax.models import costs
from vitboot_jax.models.build import build_models
from vitboot_jax.tools.perf import benchmark

MODES = ("vit", "agent", "joint", "shared")
DTYPES = ("float32", "bfloat16")
_STEPS_PER_EPOCH = 100  # Only shapes the schedule; nothing here depends on it.
_CALLBACK = re.compile(r"custom_call\s*@(\w*callback\w*)")


def op_counts(mlir: str) -> dict[str, int]:
  """StableHLO convolutions, dot_generals and host callbacks of a module's text."""
  return {
    "convolutions": mlir.count("stablehlo.convolution"),
    "dot_generals": mlir.count("stablehlo.dot_general"),
    "host_callbacks": len(_CALLBACK.findall(mlir)),
  }


def _export_text(fn: Callable[..., Any], platform: str, args: Sequence[Any]) -> str:
  """The StableHLO of `fn(*args)` for `platform`; a module with host callbacks is lowered
  without export (which refuses them) so that they are counted."""
  jitted = jax.jit(fn)
  try:
    return export.export(jitted, platforms=(platform,))(*args).mlir_module()
  except NotImplementedError as error:
    if "host_callbacks" not in str(error):
      raise
    return jitted.trace(*args).lower(lowering_platforms=(platform,)).as_text()


def step_specs(config: ml_collections.ConfigDict, platform: str):
  """(train_step, eval_step, state, train batch, eval batch): abstract values, no arrays."""
  models = build_models(config, kernel_sets.for_config(config, platform=platform))
  tx, schedule = optim.mode_optimizer(config, models.names, _STEPS_PER_EPOCH)
  prepare = step_preprocess.make_prepare(config)
  init, train_step = trainer_lib.make_steps(
    config,
    models,
    tx,
    schedule,
    steps_per_epoch=_STEPS_PER_EPOCH,
    total_steps=configlib.total_steps(config, _STEPS_PER_EPOCH),
    prepare=prepare,
  )
  state = jax.eval_shape(init, jax.random.key(0))
  batch = config.batch_size
  shipped, dtype = step_preprocess.shipped_image(config)  # As the host pipeline delivers.
  train_batch = {
    "image": jax.ShapeDtypeStruct((batch, *shipped), dtype),
    "label": jax.ShapeDtypeStruct((batch,), jnp.int32),
  }
  eval_batch = {**train_batch, "mask": jax.ShapeDtypeStruct((batch,), jnp.float32)}
  eval_step = evaluate.make_eval_step(models, prepare)
  return models, train_step, eval_step, state, train_batch, eval_batch


def lower_mode(
  config: ml_collections.ConfigDict,
  mode: str,
  dtype: str,
  platform: str,
  batch: int | None,
  specs: dict[tuple[Any, ...], Any] | None = None,
) -> dict[str, Any]:
  """One JSON row. `specs` carries step_specs between calls: platforms that run the same kernel
  set (cuda and tpu: the xla set) then share the steps, so jax traces each step once."""
  config = benchmark.mode_config(config, mode, batch, dtype)
  specs = {} if specs is None else specs

  def specs_for(target: str):
    kernel_set = kernel_sets.resolve(config.get("kernels", "auto"), target)
    key = (mode, dtype, config.batch_size, kernel_set)
    if key not in specs:
      specs[key] = step_specs(config, target)
    return specs[key]

  row: dict[str, Any] = {"mode": mode, "platform": platform, "dtype": dtype}
  models, train_step, eval_step, state, train_batch, eval_batch = specs_for(platform)
  row["kernels"] = models.kernels.name
  row["batch"] = config.batch_size
  row["image_shape"] = list(train_batch["image"].shape[1:])
  counts = {"convolutions": 0, "dot_generals": 0, "host_callbacks": 0}
  try:
    for fn, args in (
      (train_step, (state, train_batch)),
      (eval_step, (state.params, state.batch_stats, eval_batch)),
    ):
      for key, value in op_counts(_export_text(fn, platform, args)).items():
        counts[key] += value
    row["ok"], row["error"] = counts["host_callbacks"] == 0, None
  except Exception as error:  # Reported per line: one failing mode must not hide the others.
    row["ok"], row["error"] = False, f"{type(error).__name__}: {error}"[:500]
  row.update(counts)
  if models.kernels.name != "xla":  # FLOPs are those of the plain ops, whatever the platform.
    _, train_step, eval_step, state, train_batch, eval_batch = specs_for("tpu")
  row["flops"] = 2 * costs.count_macs(train_step, state, train_batch)
  row["flops_per_image"] = row["flops"] / config.batch_size
  eval_macs = costs.count_macs(eval_step, state.params, state.batch_stats, eval_batch)
  row["eval_flops_per_image"] = 2 * eval_macs / config.batch_size
  return row


def run(
  config: ml_collections.ConfigDict,
  *,
  platforms: Sequence[str],
  modes: Sequence[str] = MODES,
  dtypes: Sequence[str] = DTYPES,
  batch: int | None = None,
  emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  for name, values, known in (("modes", modes, MODES), ("dtypes", dtypes, DTYPES)):
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise ValueError(f"--{name}: {unknown} unknown; choose from {known}")
  rows = []
  for mode in modes:
    for dtype in dtypes:
      specs: dict[tuple[Any, ...], Any] = {}
      for platform in platforms:
        rows.append(lower_mode(config, mode, dtype, platform, batch, specs))
        emit(json.dumps(rows[-1]))
  return rows


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["platforms"] = flags.DEFINE_list("platforms", ["cuda", "tpu"], "Platforms to lower for.")
  _FLAGS["modes"] = flags.DEFINE_list("modes", list(MODES), "Modes to export.")
  _FLAGS["dtypes"] = flags.DEFINE_list("dtypes", list(DTYPES), "Compute dtypes to export.")
  _FLAGS["batch"] = flags.DEFINE_integer("batch", 0, "Global batch; 0: config.batch_size.")
  flags.mark_flags_as_required(["config"])


def main(argv: Sequence[str]) -> None:
  del argv
  value = {name: holder.value for name, holder in _FLAGS.items()}
  rows = run(
    value["config"],
    platforms=value["platforms"],
    modes=value["modes"],
    dtypes=value["dtypes"],
    batch=value["batch"] or None,
    emit=functools.partial(print, flush=True),
  )
  if not all(row["ok"] for row in rows):
    raise SystemExit("lowering: some steps did not lower cleanly (see the lines with ok=false)")


if __name__ == "__main__":
  define_flags()
  app.run(main)
