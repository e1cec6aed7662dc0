r"""Times the jitted train step of every mode of one config, back to back in one process.

  python -m vitboot_jax.tools.perf.benchmark --config=configs/vits_cifar100.py --batch 32 \
    --steps 5 --warmup 2 [--modes vit,agent,joint,shared,shared_noalign] [--dtype bfloat16]

A CNN config (`configs/cifar_resnet.py`, `configs/cnn_baselines.py`) has the one mode `cnn`,
timed by default with its own recipe.

Running all modes in one process on the same devices makes their ratios (shared vs ViT-only,
Align vs no Align) meaningful even on a noisy machine. The step is jitted exactly as train.py
does (donated state, replicated state and metrics, batch split over a mesh of every device) on
a synthetic batch. Compilation and warm-up steps are timed apart; each timed step is blocked on
and the median is reported.

Output, one JSON object per line:
  1. {"peak_matmul_flops_per_s", ...}: a measured matmul peak on the same devices (one matmul
     per device), the denominator of MFU, with the machine it ran on ("device_kind",
     "allocator", the host's "cpu_model" and "cpu_vector_isa").
  2. One line per mode: {"mode", "batch", "image_size", "img_per_s", "step_s", "compile_s",
     "flops_per_step", "xla_flops_per_step", "flops_per_s", "mfu", "peak_mem_bytes",
     "devices", ...}. flops_per_step is 2 x the matmul/conv MACs of the whole step's jaxpr
     (forwards, backwards, Align; elementwise work such as dropout's RNG is not counted);
     xla_flops_per_step is XLA's cost analysis (null if absent). peak_mem_bytes is
     argument + output - alias + temp of XLA's memory analysis (per device; raw fields in
     "mem_bytes"), null if absent. step_s is the median; step_s_min/max show the spread.
     With --loop_steps N (real data from config.data): "loop_step_s", the wall time per step
     of the whole training loop as train.py runs it (next batch from
     tfdata_pipeline.train_batches, transfer to the mesh, the step, the metrics fetched every
     config.log_every_steps), and "loop_data_s", the part of it spent waiting for batches.
     With --eval: "eval_img_per_s", a full evaluation of config.data.eval_split as train.py
     runs it (the feed of config.data.pipeline, evaluate.evaluate; two passes, both reported:
     tf.data's first decodes, the second reads its cache), and "eval_forward_img_per_s", the
     eval step alone on a synthetic batch of data.eval_batch_size.
  3. {"summary": ...}: shared/ViT step-time and MACs ratios and the Align overhead (%).

Also here, for every perf tool (kernel_ab, profile_step, lowering, recipe_cost;
launch/device_plan.py): a mode's config and its step compiled as train.py compiles it
(mode_config, compile_mode_step), its MACs (step_macs, per image for train_compute), and the
timers; they define what the benchmark measures, so they stay beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax import configlib, evaluate, kernel_sets, sharding
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.base import cli, errors
from vitboot_jax.cpu import devices as cpu_devices
from vitboot_jax.cpu import features as cpu_features
from vitboot_jax.cpu import host_memory, matmul
from vitboot_jax.models import costs
from vitboot_jax.models.build import build_models
from vitboot_jax.models.kernels import Kernels

ALL_MODES = ("vit", "agent", "joint", "shared", "shared_noalign")  # A ViT config's modes.
CNN_MODE = "cnn"  # A CNN config's own mode (configs/cifar_resnet.py, configs/cnn_baselines.py).
MODES = (*ALL_MODES, CNN_MODE)
# Feature-loss decay depends on the step's epoch; any plausible epoch length costs the same.
_STEPS_PER_EPOCH = 1000


def time_calls(call: Callable[[], Any], steps: int, warmup: int) -> list[float]:
  """Wall times of `steps` blocked calls after `warmup` untimed ones."""
  for _ in range(warmup):
    jax.block_until_ready(call())
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return times


def time_alternately(
  calls: dict[str, Callable[[], Any]], rounds: int, warmup: int
) -> dict[str, float]:
  """Median wall time of each call, the calls timed in turn (a shared machine slows each alike)."""
  for call in calls.values():
    for _ in range(warmup):
      jax.block_until_ready(call())
  times: dict[str, list[float]] = {name: [] for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def measure_peak(
  mesh: jax.sharding.Mesh, *, size: int = 0, dtype: Any = jnp.float32, steps: int = 10
) -> dict[str, Any]:
  """Measured matmul FLOP/s of all devices: one `size`^2 matmul per device, median of `steps`.

  A measured peak (not a datasheet one) is what this machine can actually deliver at this
  precision, so MFU says how far the step is from it rather than from marketing numbers.
  """
  if size <= 0:
    size = 2048 if jax.devices()[0].platform == "cpu" else 8192
  n = mesh.size
  spec = sharding.batch_sharded(mesh)
  make = jax.jit(
    lambda key: jax.random.normal(key, (n, size, size), dtype) / size**0.5, out_shardings=spec
  )
  a, b = make(jax.random.key(1)), make(jax.random.key(2))
  # The models' own matmul contract (16-bit inputs summed in float32): bf16 in, bf16 out would
  # measure XLA:CPU's slow bf16 fallback, not the hardware.
  product = jax.jit(lambda x, y: matmul.einsum("bij,bjk->bik", x, y), out_shardings=spec)
  compiled = product.lower(a, b).compile()
  step_s = statistics.median(time_calls(lambda: compiled(a, b), max(steps, 3), warmup=2))
  flops = 2.0 * n * size**3
  return {
    "peak_matmul_flops_per_s": flops / step_s,
    "peak_matmul_size": size,
    "peak_matmul_dtype": jnp.dtype(dtype).name,
    # "default" float32 is TF32 on recent GPUs; JAX_DEFAULT_MATMUL_PRECISION=highest is full.
    "matmul_precision": jax.config.jax_default_matmul_precision or "default",
    "peak_matmul_s": step_s,
    "devices": n,
    "device_kind": jax.devices()[0].device_kind,
    "allocator": host_memory.description(),  # It moves XLA:CPU's step times (host_memory.py).
    "cpu_model": cpu_features.cpu_model(),
    "cpu_vector_isa": cpu_features.widest_vector_isa(cpu_features.cpu_flags()),
  }


def switch_mode(c: ml_collections.ConfigDict, mode: str) -> None:
  """Sets `c` (in place) to `mode` with the fields the configs set per mode: the loss weights of
  configs/common.py, clipping 0.1 in mode vit only, the standalone agent's dropout in modes
  agent and joint. Run from the repository root (as the config files)."""
  from configs import common  # The config files' table, outside the package.

  c.mode = mode
  c.loss.update(common.loss_weights(mode))
  c.optim.clip_norm = 0.1 if mode == "vit" else 0.0
  if mode in ("agent", "joint"):
    c.agent.mlp_dropout, c.agent.residual_dropout = 0.1, 0.0


def default_modes(
  config: ml_collections.ConfigDict, vit_modes: Sequence[str] = ALL_MODES
) -> tuple[str, ...]:
  """The modes a perf tool times when none is named: a CNN config's own, else `vit_modes` (each
  tool's ViT default)."""
  return (CNN_MODE,) if config.mode == CNN_MODE else tuple(vit_modes)


def mode_config(
  config: ml_collections.ConfigDict,
  mode: str,
  batch: int | None,
  dtype: str | None = None,
  *,
  num_devices: int | None = None,
) -> ml_collections.ConfigDict:
  """A copy of `config` set to `mode` ("shared_noalign": shared with align="none"), and `batch`
  and `dtype` where given; validated, for `num_devices` where given (lowering targets others)."""
  if mode not in MODES:
    raise ValueError(errors.unknown_choice("mode", mode, MODES))
  if (mode == CNN_MODE) != (config.mode == CNN_MODE):  # A CNN config builds no ViT, and back.
    kind = "a CNN config (mode=cnn)" if mode == CNN_MODE else "a ViT config"
    raise ValueError(f"mode={mode!r} needs {kind}; this config's mode is {config.mode!r}")
  c = config.copy_and_resolve_references()
  with c.unlocked():
    if mode != CNN_MODE:  # A CNN config's own recipe stays as it is.
      switch_mode(c, "shared" if mode.startswith("shared") else mode)
    if mode == "shared_noalign":
      c.align = "none"
    if batch:
      c.batch_size = batch
    if dtype:
      c.compute_dtype = dtype
  configlib.validate(c, num_devices=num_devices)
  return c


def synthetic_batch(
  config: ml_collections.ConfigDict, batch: int, mesh: jax.sharding.Mesh, seed: int = 0
) -> dict[str, jax.Array]:
  """Random NHWC float32 images and int32 labels, split over the mesh as training batches are."""
  local = batch // jax.process_count()
  rng = np.random.default_rng(seed + jax.process_index())
  size = config.image_size
  images = rng.standard_normal((local, size, size, 3), dtype=np.float32)
  labels = rng.integers(0, config.data.num_classes, size=(local,), dtype=np.int32)
  return sharding.global_batch({"image": images, "label": labels}, mesh)


def _memory(compiled: Any) -> tuple[int | None, dict[str, int]]:
  """(argument + output - alias + temp bytes, the raw fields), or (None, {}) if unsupported."""
  try:
    stats = compiled.memory_analysis()
  except Exception:  # backends without memory analysis raise various errors.
    return None, {}
  if stats is None:
    return None, {}
  fields = {
    k: int(getattr(stats, f"{k}_size_in_bytes", 0))
    for k in ("argument", "output", "alias", "temp", "generated_code")
  }
  if hasattr(stats, "peak_memory_in_bytes"):
    fields["xla_peak"] = int(stats.peak_memory_in_bytes)
  # Donated state: outputs alias the arguments' buffers, so aliased bytes are counted once.
  peak = fields["argument"] + fields["output"] - fields["alias"] + fields["temp"]
  return peak, fields


def _xla_flops(compiled: Any) -> float | None:
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # not every backend implements cost analysis.
    return None
  if isinstance(analysis, (list, tuple)):  # Older jax: one dict per partition.
    analysis = analysis[0] if analysis else None
  if not analysis or "flops" not in analysis:
    return None
  return float(analysis["flops"])


@dataclasses.dataclass
class CompiledStep:
  """One mode's train step compiled as train.py compiles it, with its state and a batch."""

  config: ml_collections.ConfigDict
  compiled: Any
  state: Any
  data: dict[str, jax.Array]
  macs: int
  compile_s: float
  trainer: trainer_lib.Trainer  # Its jitted steps take any batch: the loop over real data.

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.trainer.mesh

  def __call__(self) -> Any:
    """Runs one step on the synthetic batch (the state is donated and replaced)."""
    self.state, metrics = self.compiled(self.state, self.data)
    return self.state, metrics


def _pure_step(config, models, trainer):
  """The pure train step of `config` with `models`, and the trainer's optimizer, image
  preparation and step count."""
  _, step = trainer_lib.make_steps(
    config,
    models,
    trainer.tx,
    trainer.schedule,
    steps_per_epoch=_STEPS_PER_EPOCH,
    total_steps=trainer.total_steps,
    prepare=trainer.prepare,
  )
  return step


def step_macs(
  config: ml_collections.ConfigDict,
  trainer: trainer_lib.Trainer,
  state: Any,
  batch: dict[str, Any],
) -> int:
  """MACs of one train step of `config` on `batch`: the matmuls and convolutions of its jaxpr
  (models/costs.count_macs), traced with the xla kernels so the count does not depend on the
  machine. `state` and `batch` may be shapes; twice this is the step's FLOPs."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.kernels = "xla"
  models = build_models(config, kernel_sets.for_config(config))
  return costs.count_macs(_pure_step(config, models, trainer), state, batch)


def step_macs_per_image(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> int:
  """`step_macs` of `config` per image of its batch, from shapes alone: nothing is compiled or
  run and no weights are read (a run's training compute, tools/train_compute.py)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.data.pipeline = "tfdata"  # The step alone, whatever fed it.
    config.agent_init_from = config.init_from = ""
  configlib.validate(config)
  trainer = trainer_lib.build(config, mesh, _STEPS_PER_EPOCH)
  state = jax.eval_shape(trainer.fresh_state)
  batch = synthetic_batch(config, config.batch_size, mesh)
  return step_macs(config, trainer, state, batch) // config.batch_size


def compile_mode_step(
  config: ml_collections.ConfigDict,
  mode: str,
  mesh: jax.sharding.Mesh,
  *,
  batch: int,
  dtype: str | None = None,
  kernels: Kernels | None = None,
  compiler_options: dict[str, Any] | None = None,
) -> CompiledStep:
  """Builds, initialises and jits one mode's step with train.py's setup, on a synthetic batch.

  `kernels` replaces the set `config.kernels` resolves to on the mesh (kernel A/Bs);
  `compiler_options` are XLA debug options for this one compilation (compiler-flag A/Bs).
  """
  config = mode_config(config, mode, batch, dtype, num_devices=jax.device_count())
  step_config = config.copy_and_resolve_references()
  step_config.data.pipeline = "tfdata"  # The step alone takes a batch, whatever the pipeline.
  trainer = trainer_lib.build(step_config, mesh, _STEPS_PER_EPOCH, kernels=kernels)
  state = trainer.fresh_state()  # Timings do not depend on the weights' values.
  data = synthetic_batch(config, batch, mesh)
  macs = step_macs(config, trainer, state, data)
  start = time.perf_counter()
  compiled = trainer.train_step.lower(state, data).compile(compiler_options=compiler_options)
  compile_s = time.perf_counter() - start
  return CompiledStep(config, compiled, state, data, macs, compile_s, trainer)


def time_loop(step: CompiledStep, steps: int, warmup: int) -> dict[str, float]:
  """Per-step wall time of train.py's loop on real batches: data, transfer, step, logging.

  With config.data.pipeline="device" the loop's step makes its batch from the dataset on the
  devices (its compilation is in the warm-up); "loop_data_s" is then only the host's feed.
  """
  from vitboot_jax.data import (  # TensorFlow only for the tf.data pipeline.
    device_pipeline,
    loop_feed,
  )

  config, trainer = step.config, step.trainer
  feed = loop_feed.open_feed(config, step.mesh)
  next_input = feed.train(0)
  train_step = trainer.train_step
  if feed.on_device:
    pure = _pure_step(config, trainer.models, trainer)
    train_step = jax.jit(
      device_pipeline.feeding(pure, config, step.mesh, feed.info.steps_per_epoch),
      donate_argnums=0,
      out_shardings=(trainer.state_sharding, trainer.replicated),
    )
  log_every = max(1, int(config.log_every_steps))
  state = step.state
  data_s = 0.0
  start = 0.0
  for i in range(warmup + steps):
    if i == warmup:
      jax.block_until_ready(state)
      start, data_s = time.perf_counter(), 0.0
    fetch = time.perf_counter()
    batch = next_input(1)
    data_s += time.perf_counter() - fetch
    state, metrics = train_step(state, batch)
    if (i + 1) % log_every == 0:
      _ = {k: float(v) for k, v in jax.device_get(metrics).items()}  # As train.py logs.
  jax.block_until_ready(state)
  step.state = state
  return {"loop_step_s": (time.perf_counter() - start) / steps, "loop_data_s": data_s / steps}


def eval_forward(step: CompiledStep) -> tuple[Any, Callable[[], Any]]:
  """(compiled eval step, a call of it on a synthetic batch of data.eval_batch_size)."""
  config, mesh = step.config, step.mesh
  params, stats = step.state.params, step.state.batch_stats
  batch = int(config.data.eval_batch_size)
  synthetic = synthetic_batch(config, batch, mesh)
  synthetic["mask"] = sharding.global_batch({"mask": np.ones((batch,), np.float32)}, mesh)["mask"]
  compiled = step.trainer.eval_step.lower(params, stats, synthetic).compile()
  return compiled, lambda: compiled(params, stats, synthetic)


def time_eval(step: CompiledStep, forward_steps: int = 3) -> dict[str, Any]:
  """A full evaluation of the eval split as train.py runs it, from config.data.pipeline's feed
  (twice: tf.data decodes, then reads its cache; the device slicer compiles, then runs)."""
  from vitboot_jax.data import loop_feed  # TensorFlow only for the tf.data pipeline.

  config, mesh = step.config, step.mesh
  eval_step = step.trainer.eval_step
  params, stats = step.state.params, step.state.batch_stats
  batch = int(config.data.eval_batch_size)
  _, call = eval_forward(step)
  forward = statistics.median(time_calls(call, forward_steps, warmup=1))
  feed = loop_feed.open_feed(config, mesh)
  passes = []
  for _ in range(2):
    start = time.perf_counter()
    in_flight = step.trainer.models.kernels.eval_batches_in_flight
    result = evaluate.evaluate(eval_step, params, stats, feed.eval_batches(), in_flight)
    passes.append((time.perf_counter() - start, result["eval/count"]))
  (first_s, count), (cached_s, _) = passes
  return {
    "eval_images": count,
    "eval_batch": batch,
    "eval_s_first": first_s,
    "eval_s": cached_s,
    "eval_img_per_s": count / cached_s,
    "eval_img_per_s_first": count / first_s,
    "eval_forward_img_per_s": batch / forward,
  }


def benchmark_mode(
  config: ml_collections.ConfigDict,
  mode: str,
  mesh: jax.sharding.Mesh,
  *,
  batch: int,
  steps: int,
  warmup: int,
  peak_flops_per_s: float,
  dtype: str | None = None,
  loop_steps: int = 0,
  eval_split: bool = False,
) -> dict[str, Any]:
  """One mode's step: built, initialised and jitted as train.py does, then timed."""
  step = compile_mode_step(config, mode, mesh, batch=batch, dtype=dtype)
  peak_mem, mem_fields = _memory(step.compiled)
  times = time_calls(step, steps, warmup)
  step_s = statistics.median(times)
  flops = 2 * step.macs
  row = {
    "mode": mode,
    "batch": batch,
    "image_size": step.config.image_size,
    "img_per_s": batch / step_s,
    "step_s": step_s,
    "step_s_min": min(times),
    "step_s_max": max(times),
    "compile_s": step.compile_s,
    "flops_per_step": flops,
    "xla_flops_per_step": _xla_flops(step.compiled),
    "flops_per_s": flops / step_s,
    "mfu": flops / step_s / peak_flops_per_s,
    "peak_mem_bytes": peak_mem,
    "mem_bytes": mem_fields,
    "compute_dtype": step.config.compute_dtype,
    "devices": mesh.size,
  }
  if loop_steps:
    row.update(time_loop(step, loop_steps, warmup=max(warmup, 1)), loop_steps=loop_steps)
  if eval_split:
    row.update(time_eval(step))
  del step
  return row


def summarise(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """Ratios the issue's targets are stated in; null where a mode was not run."""

  def ratio(a: str, b: str, key: str) -> float | None:
    if a in rows and b in rows and rows[b][key]:
      return rows[a][key] / rows[b][key]
    return None

  overhead = ratio("shared", "shared_noalign", "step_s")
  return {
    "summary": True,
    "step_ratio_shared_vit": ratio("shared", "vit", "step_s"),
    "step_ratio_joint_vit": ratio("joint", "vit", "step_s"),
    "align_overhead_pct": None if overhead is None else 100.0 * (overhead - 1.0),
    "macs_ratio_shared_vit": ratio("shared", "vit", "flops_per_step"),
    "mfu_shared": rows["shared"]["mfu"] if "shared" in rows else None,
  }


def run(
  config: ml_collections.ConfigDict,
  *,
  batch: int,
  steps: int,
  warmup: int,
  modes: Sequence[str] = ALL_MODES,
  dtype: str | None = None,
  peak_size: int = 0,
  loop_steps: int = 0,
  eval_split: bool = False,
  emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  """Emits (and returns) the peak line, one line per mode and the summary line, as JSON."""
  if steps < 1:
    raise ValueError(f"--steps={steps} must be at least 1")
  mesh = sharding.make_mesh()
  peak_dtype = jnp.dtype(dtype or config.get("compute_dtype", "float32"))
  peak = measure_peak(mesh, size=peak_size, dtype=peak_dtype, steps=max(steps, 10))
  lines = [peak]
  emit(json.dumps(peak))
  rows = {}
  for mode in modes:
    rows[mode] = benchmark_mode(
      config,
      mode,
      mesh,
      batch=batch,
      steps=steps,
      warmup=warmup,
      peak_flops_per_s=peak["peak_matmul_flops_per_s"],
      dtype=dtype,
      loop_steps=loop_steps,
      eval_split=eval_split,
    )
    lines.append(rows[mode])
    emit(json.dumps(rows[mode]))
  lines.append(summarise(rows))
  emit(json.dumps(lines[-1]))
  return lines


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["batch"] = flags.DEFINE_integer("batch", 0, "Global batch size; 0: config.batch_size.")
  _FLAGS["cpu_devices"] = cpu_devices.define_flag()
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 10, "Timed steps per mode (median reported).")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
  _FLAGS["modes"] = flags.DEFINE_list(
    "modes", [], f"Modes, from {MODES}; default: {ALL_MODES}, or cnn for a CNN config."
  )
  _FLAGS["dtype"] = flags.DEFINE_enum(
    "dtype", None, ["float32", "bfloat16"], "Sets config.compute_dtype."
  )
  _FLAGS["peak_size"] = flags.DEFINE_integer(
    "peak_size", 0, "Side of the peak matmul; 0: 2048 on CPU, 8192 on accelerators."
  )
  _FLAGS["loop_steps"] = flags.DEFINE_integer(
    "loop_steps", 0, "Also time N steps of the whole loop on real data (loop_step_s); 0: off."
  )
  _FLAGS["eval"] = flags.DEFINE_bool(
    "eval", False, "Also time a full evaluation of config.data.eval_split (eval_img_per_s)."
  )
  flags.mark_flag_as_required("config")


def lay_out_host(value: dict[str, Any]) -> int:
  """A perf tool's global batch, with the host split into the devices train.py would get there
  (one CPU device per core by default), so the tools time what training runs."""
  batch = value["batch"] or value["config"].batch_size
  try:
    cpu_devices.split_host_for(value["config"], requested=value["cpu_devices"], batch=batch)
  except errors.UsageError as error:
    cli.fail(str(error))
  return batch


def main(argv: Sequence[str]) -> None:
  del argv
  value = {name: holder.value for name, holder in _FLAGS.items()}
  config = value["config"]
  batch = lay_out_host(value)
  run(
    config,
    batch=batch,
    steps=value["steps"],
    warmup=value["warmup"],
    modes=[m.strip() for m in value["modes"] if m.strip()] or default_modes(config),
    dtype=value["dtype"],
    peak_size=value["peak_size"],
    loop_steps=value["loop_steps"],
    eval_split=value["eval"],
    emit=functools.partial(print, flush=True),
  )


if __name__ == "__main__":
  host_memory.reexec_with_allocator()  # As main does: the tools time what training runs.
  define_flags()
  app.run(main)
