r"""One accelerator call's worth of speed anchors, as JSON lines, most important first.

  JAX_PLATFORMS= python -m launch.device_plan --config=configs/vits_cifar100.py \
    --budget_s=420 [--out=$OUT/device_plan.jsonl]

The project's own instrument, not a user's tool: it fits the measurements docs/accelerators.md
records into one time-boxed call on a lent accelerator, so it lives outside the package; run it
from the repository root (users time their steps with vitboot_jax.tools.perf.benchmark).

Each item runs only while the time budget lasts (the rest are listed as skipped) and a failing
item prints its error and the next one runs, so one call always returns what it measured; the
next call passes what an earlier one measured as --skip (the "done" row's names) and goes on:
  1. "peak": the in-run bf16 and float32 (TF32 on GPUs under the default precision) matmul peaks.
  2. "step": our train step (benchmark.compile_mode_step, as train.py jits it) of each mode,
     dtype and batch, with compile_s, MFU of the bf16 peak ("mfu_bf16_peak", the targets
     docs/accelerators.md tracks) and of its own dtype's peak.
  3. "steps_per_call": K steps per jitted call (trainer.multi_step) against one, alternating in
     the same process: per-step time of each and the speedup.
  4. "attention": the xla set's fused attention (jax.nn.dot_product_attention; cuDNN's kernel
     where asked for, bf16) against the plain einsum-softmax-einsum, in a ViT step with
     attention dropout 0 (the recipe's 0.1 keeps the plain path in training) and in evaluation.
  5. "eval": a full CIFAR-test-sized evaluation (10,000 images by default) as train.py runs it
     (evaluate.evaluate over shipped uint8 crops), its compile time apart.
  6. "hint_shares": the shared step as users run it against the same step with
     config.log_hint_shares on (the diagnostic's conditional compiled in, not taken: no logging
     step is timed), alternating in one process: per-step time and XLA's temp memory of each.
  7. "timm": timm's VisionTransformer of the same shape (ViT-S: 288 wide, 6 layers, 9 heads,
     MLP 1152, patch 16, 224 px, the recipe's dropout) under torch.compile, bf16 autocast and
     PyTorch's fused attention (SDPA); skipped with a note where torch or timm is absent.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax import evaluate, kernel_sets, sharding
from vitboot_jax.base import cli, errors
from vitboot_jax.cpu import host_memory
from vitboot_jax.data import step_preprocess
from vitboot_jax.models import kernels as kernels_lib
from vitboot_jax.tools.perf import benchmark

MODES = ("vit", "agent", "joint", "shared")


@dataclasses.dataclass
class Plan:
  """The settings of one run of the plan (the flags)."""

  modes: Sequence[str] = MODES
  batches: Sequence[int] = (64, 256)
  dtypes: Sequence[str] = ("bfloat16", "float32")
  steps: int = 10
  warmup: int = 2
  steps_per_call: int = 8
  eval_images: int = 10_000
  peak_size: int = 0
  timm_steps: int = 20
  budget_s: float = 420.0
  skip: Sequence[str] = ()  # Item names an earlier call measured (the peaks always run).


@dataclasses.dataclass
class Context:
  """What every item reads: the config, the mesh, the plan and the measured peaks."""

  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  plan: Plan
  peak: dict[str, Any]


def peaks(mesh, plan: Plan) -> dict[str, Any]:
  row: dict[str, Any] = {"item": "peak"}
  for dtype in ("bfloat16", "float32"):
    peak = benchmark.measure_peak(mesh, size=plan.peak_size, dtype=jnp.dtype(dtype))
    row[f"{dtype}_flops_per_s"] = peak["peak_matmul_flops_per_s"]
    row.update(
      device_kind=peak["device_kind"], devices=peak["devices"], size=peak["peak_matmul_size"]
    )
    row[f"{dtype}_matmul_precision"] = peak["matmul_precision"]
  row["jax"] = jax.__version__
  return row


def step_row(ctx: Context, mode: str, batch: int, dtype: str) -> dict:
  plan, peak = ctx.plan, ctx.peak
  step = benchmark.compile_mode_step(ctx.config, mode, ctx.mesh, batch=batch, dtype=dtype)
  step_s = statistics.median(benchmark.time_calls(step, plan.steps, plan.warmup))
  flops = 2 * step.macs
  return {
    "item": "step",
    "mode": mode,
    "batch": batch,
    "dtype": dtype,
    "img_per_s": batch / step_s,
    "step_s": step_s,
    "compile_s": step.compile_s,
    "flops_per_step": flops,
    "mfu_bf16_peak": flops / step_s / peak["bfloat16_flops_per_s"],
    "mfu_own_peak": flops / step_s / peak[f"{dtype}_flops_per_s"],
  }


def steps_per_call_row(ctx: Context, mode: str, batch: int, dtype: str) -> dict:
  """One step a call against K, same state layout and batch, alternating."""
  plan, mesh, k = ctx.plan, ctx.mesh, ctx.plan.steps_per_call
  step = benchmark.compile_mode_step(ctx.config, mode, mesh, batch=batch, dtype=dtype)
  # The same batch K times, [K, B, ...] split on the batch axis as train.py stacks host batches.
  stacked = sharding.global_batches([jax.device_get(step.data)] * k, mesh)
  start = time.perf_counter()
  multi = step.trainer.multi_step(k).lower(step.state, stacked).compile()
  multi_compile_s = time.perf_counter() - start
  holder = {"state": step.state}

  def one_call(compiled, data):
    holder["state"], metrics = compiled(holder["state"], data)
    return metrics

  times = benchmark.time_alternately(
    {"one": lambda: one_call(step.compiled, step.data), "k": lambda: one_call(multi, stacked)},
    rounds=max(3, plan.steps // 2),
    warmup=1,
  )
  one_s, k_s = times["one"], times["k"] / k
  return {
    "item": "steps_per_call",
    "mode": mode,
    "batch": batch,
    "dtype": dtype,
    "steps_per_call": k,
    "step_s_one": one_s,
    "step_s_k": k_s,
    "speedup": one_s / k_s,
    "compile_s_one": step.compile_s,
    "compile_s_k": multi_compile_s,
  }


def hint_shares_row(ctx: Context, mode: str, batch: int, dtype: str) -> dict:
  """The step without and with the hint-share diagnostic compiled in, alternating."""
  plan, row = ctx.plan, {"item": "hint_shares", "mode": mode, "batch": batch, "dtype": dtype}
  calls = {}
  for name, on in (("off", False), ("on", True)):
    c = ctx.config.copy_and_resolve_references()
    with c.unlocked():
      c.log_hint_shares = on
      c.log_every_steps = 10**9  # No timed step is a logging one: the conditional's cost alone.
    step = benchmark.compile_mode_step(c, mode, ctx.mesh, batch=batch, dtype=dtype)
    memory = step.compiled.memory_analysis()
    row[f"compile_s_{name}"] = step.compile_s
    row[f"temp_bytes_{name}"] = getattr(memory, "temp_size_in_bytes", None)
    calls[name] = step  # Each call runs one step on its own state.
    if not on:  # The step users run; MFU is of its FLOPs.
      row["flops_per_step"] = 2 * step.macs
  times = benchmark.time_alternately(calls, rounds=max(3, plan.steps // 2), warmup=1)
  row.update({f"step_s_{name}": t for name, t in times.items()})
  row["img_per_s_off"] = batch / times["off"]
  if "bfloat16_flops_per_s" in ctx.peak:
    row["mfu_bf16_peak_off"] = (
      row["flops_per_step"] / times["off"] / ctx.peak["bfloat16_flops_per_s"]
    )
  row["slowdown_on"] = times["on"] / times["off"]
  return row


def attention_row(ctx: Context, batch: int, dtype: str) -> dict:
  """ViT steps and eval forwards with the xla set's attention variants, alternating."""
  plan, mesh = ctx.plan, ctx.mesh
  c = ctx.config.copy_and_resolve_references()
  with c.unlocked():
    c.model.dropout = 0.0  # The fused path is the no-dropout one.
  resolved = kernel_sets.for_devices("xla", mesh.devices.flat)
  variants = {
    "plain": dataclasses.replace(
      resolved, softmax_attention=None, inference_softmax_attention=None
    ),
    "fused": resolved,
  }
  if dtype == "bfloat16" and mesh.devices.flat[0].platform == "gpu":
    cudnn = kernels_lib.cudnn_attention
    variants["cudnn"] = dataclasses.replace(
      resolved, softmax_attention=cudnn, inference_softmax_attention=cudnn
    )
  row: dict[str, Any] = {"item": "attention", "batch": batch, "dtype": dtype, "dropout": 0.0}
  train_calls, eval_calls = {}, {}
  for name, kernels in variants.items():
    try:
      step = benchmark.compile_mode_step(c, "vit", mesh, batch=batch, dtype=dtype, kernels=kernels)
      # Evaluation reads its own copy of the weights: the timed steps donate the state.
      copy = dataclasses.replace(step, state=jax.tree.map(jnp.copy, step.state))
      _, forward = benchmark.eval_forward(copy)
    except Exception as error:  # cuDNN's attention may refuse a shape or a CUDA version.
      row[f"{name}_error"] = f"{type(error).__name__}: {error}"[:500]
      continue
    train_calls[name], eval_calls[name] = step, forward
    row[f"compile_s_{name}"] = step.compile_s
  rounds = max(3, plan.steps // 2)
  for name, t in benchmark.time_alternately(train_calls, rounds, plan.warmup).items():
    row[f"step_s_{name}"] = t
  for name, t in benchmark.time_alternately(eval_calls, rounds, 1).items():
    row[f"eval_forward_s_{name}"] = t
  for name in train_calls:
    if name != "plain" and "plain" in train_calls:
      row[f"train_speedup_{name}"] = row["step_s_plain"] / row[f"step_s_{name}"]
      row[f"eval_speedup_{name}"] = row["eval_forward_s_plain"] / row[f"eval_forward_s_{name}"]
  return row


def eval_row(ctx: Context, mode: str, dtype: str) -> dict:
  """A full evaluation pass of `plan.eval_images` as train.py runs it, on shipped uint8 crops."""
  plan, mesh = ctx.plan, ctx.mesh
  batch = int(ctx.config.data.eval_batch_size)
  step = benchmark.compile_mode_step(ctx.config, mode, mesh, batch=batch, dtype=dtype)
  shape, image_dtype = step_preprocess.shipped_image(step.config)
  rng = np.random.default_rng(0)
  local = batch // jax.process_count()
  host = {
    "image": rng.integers(0, 256, (local, *shape)).astype(image_dtype),
    "label": rng.integers(0, step.config.data.num_classes, local).astype(np.int32),
    "mask": np.ones((local,), np.float32),
  }
  num_batches = -(-plan.eval_images // batch)
  params, stats = step.state.params, step.state.batch_stats
  eval_step = step.trainer.eval_step
  start = time.perf_counter()
  jax.block_until_ready(eval_step(params, stats, sharding.global_batch(host, mesh)))
  compile_s = time.perf_counter() - start
  in_flight = step.trainer.models.kernels.eval_batches_in_flight
  start = time.perf_counter()
  batches = (sharding.global_batch(host, mesh) for _ in range(num_batches))
  result = evaluate.evaluate(eval_step, params, stats, batches, in_flight)
  eval_s = time.perf_counter() - start
  return {
    "item": "eval",
    "mode": mode,
    "dtype": dtype,
    "eval_batch": batch,
    "images": result["eval/count"],
    "image_shipped": [*shape, str(np.dtype(image_dtype))],
    "eval_s": eval_s,
    "eval_img_per_s": result["eval/count"] / eval_s,
    "compile_s": compile_s,
  }


def timm_row(ctx: Context, batch: int) -> dict:
  """timm's ViT of config's shape trained with torch.compile, bf16 autocast and SDPA."""
  config, plan = ctx.config, ctx.plan
  try:
    import timm
    import torch
  except ImportError as error:
    return {"item": "timm", "batch": batch, "skipped": f"torch/timm absent: {error}"}
  device = "cuda" if torch.cuda.is_available() else "cpu"
  m = config.model
  model = timm.models.vision_transformer.VisionTransformer(
    img_size=config.image_size,
    patch_size=m.patch_size,
    embed_dim=m.embed_dim,
    depth=m.depth,
    num_heads=m.num_heads,
    mlp_ratio=m.mlp_dim / m.embed_dim,
    num_classes=config.data.num_classes,
    attn_drop_rate=m.dropout,  # Attention probabilities (SDPA's dropout_p).
    proj_drop_rate=m.dropout,  # After the attention and MLP projections, and in the MLP.
  ).to(device)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
  images = torch.randn(batch, 3, config.image_size, config.image_size, device=device)
  labels = torch.randint(0, config.data.num_classes, (batch,), device=device)
  compiled = torch.compile(model)
  autocast = torch.autocast(device_type=device, dtype=torch.bfloat16)

  def step():
    with autocast:
      loss = torch.nn.functional.cross_entropy(compiled(images), labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss

  sync = torch.cuda.synchronize if device == "cuda" else lambda: None
  start = time.perf_counter()
  step()
  sync()
  compile_s = time.perf_counter() - start
  for _ in range(plan.warmup):
    step()
  sync()
  times = []
  for _ in range(plan.timm_steps):
    start = time.perf_counter()
    step()
    sync()
    times.append(time.perf_counter() - start)
  step_s = statistics.median(times)
  return {
    "item": "timm",
    "batch": batch,
    "device": device,
    "torch": torch.__version__,
    "timm": timm.__version__,
    "fused_attn": bool(getattr(model.blocks[0].attn, "fused_attn", False)),
    "img_per_s": batch / step_s,
    "step_s": step_s,
    "compile_s": compile_s,
  }


def items(ctx: Context) -> list[tuple[str, Callable[[], dict]]]:
  """(name, thunk) of every measurement, most important first: the ViT and shared steps."""
  plan, p = ctx.plan, functools.partial
  dtype, small, big = plan.dtypes[0], plan.batches[0], plan.batches[-1]
  headline = [m for m in ("vit", "shared") if m in plan.modes]
  out = [(f"step/{m}/{small}/{dtype}", p(step_row, ctx, m, small, dtype)) for m in headline]
  out += [
    (f"steps_per_call/{m}/{small}/{dtype}", p(steps_per_call_row, ctx, m, small, dtype))
    for m in headline
  ]
  out.append((f"timm/{small}", p(timm_row, ctx, small)))
  if "shared" in plan.modes:  # The one change in the shared step since its first GPU timing.
    out.append(
      (f"hint_shares/shared/{small}/{dtype}", p(hint_shares_row, ctx, "shared", small, dtype))
    )
  out += [(f"timm/{b}", p(timm_row, ctx, b)) for b in plan.batches]
  if "vit" in plan.modes:
    out.append((f"step/vit/{big}/{dtype}", p(step_row, ctx, "vit", big, dtype)))
  out.append((f"attention/{small}/{dtype}", p(attention_row, ctx, small, dtype)))
  out += [(f"eval/{m}/{dtype}", p(eval_row, ctx, m, dtype)) for m in headline]
  for d in plan.dtypes:
    for b in plan.batches:
      out += [(f"step/{m}/{b}/{d}", p(step_row, ctx, m, b, d)) for m in plan.modes]
  unique: dict[str, Callable[[], dict]] = {}
  for name, thunk in out:  # Each name once, at its first place.
    unique.setdefault(name, thunk)
  return list(unique.items())


def run(
  config: ml_collections.ConfigDict, plan: Plan, emit: Callable[[str], None] = print
) -> list[dict[str, Any]]:
  """Runs the plan's items in order while the budget lasts; emits (and returns) each JSON row."""
  names = {name for name, _ in items(Context(config, None, plan, {}))}
  unknown = sorted(set(plan.skip) - names)
  if unknown:  # Before the peaks: a typo costs the call nothing.
    raise errors.UsageError(
      f"--skip names no item of this plan: {', '.join(unknown)} (the names of the 'done' row)"
    )
  start = time.perf_counter()
  mesh = sharding.make_mesh()
  rows: list[dict[str, Any]] = []

  def put(row: dict[str, Any]) -> None:
    row["elapsed_s"] = round(time.perf_counter() - start, 2)
    rows.append(row)
    emit(json.dumps(row))

  peak = peaks(mesh, plan)
  put(peak)
  ctx = Context(config, mesh, plan, peak)
  skipped = []
  for name, thunk in items(ctx):
    if name in plan.skip:
      continue
    if time.perf_counter() - start > plan.budget_s:
      skipped.append(name)
      continue
    try:
      row = thunk()
    except Exception as error:  # One failing item must not cost the call the others.
      row = {"item": name.split("/")[0], "error": f"{type(error).__name__}: {error}"[:1000]}
      row["traceback"] = traceback.format_exc()[-2000:]
    put({"name": name, **row})
  done = {"item": "done", "skipped_over_budget": skipped, "budget_s": plan.budget_s}
  put({**done, "skipped_as_asked": list(plan.skip)})
  return rows


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file(
    "config", "configs/vits_cifar100.py", "Config file (the paper's ViT-S CIFAR-100 row)."
  )
  _FLAGS["modes"] = flags.DEFINE_list("modes", list(MODES), "Modes of the step rows.")
  _FLAGS["batches"] = flags.DEFINE_list("batches", ["64", "256"], "Global batches; first: A/Bs.")
  _FLAGS["dtypes"] = flags.DEFINE_list("dtypes", ["bfloat16", "float32"], "First: the A/Bs'.")
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 10, "Timed steps per row (median).")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
  _FLAGS["steps_per_call"] = flags.DEFINE_integer("steps_per_call", 8, "K of the K-step A/B.")
  _FLAGS["eval_images"] = flags.DEFINE_integer("eval_images", 10_000, "Images of the eval pass.")
  _FLAGS["peak_size"] = flags.DEFINE_integer("peak_size", 0, "Peak matmul side; 0: benchmark's.")
  _FLAGS["timm_steps"] = flags.DEFINE_integer("timm_steps", 20, "Timed timm steps.")
  _FLAGS["budget_s"] = flags.DEFINE_float(
    "budget_s", 420.0, "No item starts after this many seconds (each may take a minute)."
  )
  _FLAGS["out"] = flags.DEFINE_string("out", "", "Also write the JSON lines to this file.")
  _FLAGS["skip"] = flags.DEFINE_list("skip", [], "Items an earlier call measured (their names).")


def main(argv: Sequence[str]) -> None:
  del argv
  v = {name: holder.value for name, holder in _FLAGS.items()}
  plan = Plan(
    modes=[m.strip() for m in v["modes"] if m.strip()],
    batches=[int(b) for b in v["batches"]],
    dtypes=[d.strip() for d in v["dtypes"] if d.strip()],
    steps=v["steps"],
    warmup=v["warmup"],
    steps_per_call=v["steps_per_call"],
    eval_images=v["eval_images"],
    peak_size=v["peak_size"],
    timm_steps=v["timm_steps"],
    budget_s=v["budget_s"],
    skip=[name.strip() for name in v["skip"] if name.strip()],
  )
  out = open(v["out"], "w") if v["out"] else None  # noqa: SIM115 (kept open for the whole run)

  def emit(line: str) -> None:
    print(line, flush=True)
    if out is not None:
      out.write(line + "\n")
      out.flush()

  try:
    run(v["config"], plan, emit)
  except errors.UsageError as error:
    cli.fail(str(error))
  finally:
    if out is not None:
      out.close()


if __name__ == "__main__":
  host_memory.reexec_with_allocator()  # As main does: the tools time what training runs.
  define_flags()
  app.run(main)
