r"""A/B of chunked training attention (models/vit.py): the train step with and without it.

  python -m vitboot_jax.tools.attention_ab --config=configs/vits_cifar100.py --batch 32 \
    --modes vit,shared --steps 5 [--dtype bfloat16]

Both variants of each mode are compiled as the benchmark compiles them
(`benchmark.compile_mode_step`) and timed alternately, step by step, in one process, so a noisy
or shared machine slows both alike and the ratio stays meaningful. On accelerators chunking is
off by default (`vit.attention_in_chunks`); the tool forces each variant either way.

Output, one JSON object per mode: {"mode", "batch", "step_s_plain", "step_s_chunked",
"speedup" (plain / chunked median), "images_per_chunk", "chunk_bytes"}.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax import sharding
from vitboot_jax.models import vit as vit_lib
from vitboot_jax.tools import benchmark


def _compile(config, mode: str, mesh, *, batch: int, dtype: str | None, chunked: bool):
  original = vit_lib.attention_in_chunks
  vit_lib.attention_in_chunks = lambda: chunked  # Read while the step is traced.
  try:
    return benchmark.compile_mode_step(config, mode, mesh, batch=batch, dtype=dtype)
  finally:
    vit_lib.attention_in_chunks = original


def compare_mode(
  config: ml_collections.ConfigDict,
  mode: str,
  mesh: jax.sharding.Mesh,
  *,
  batch: int,
  steps: int,
  warmup: int,
  dtype: str | None = None,
) -> dict[str, Any]:
  """Median step times of the plain and the chunked variant, timed alternately."""
  variants = {
    name: _compile(config, mode, mesh, batch=batch, dtype=dtype, chunked=name == "chunked")
    for name in ("plain", "chunked")
  }
  for step in variants.values():
    for _ in range(warmup):
      jax.block_until_ready(step())
  times: dict[str, list[float]] = {name: [] for name in variants}
  for _ in range(steps):
    for name, step in variants.items():
      start = time.perf_counter()
      jax.block_until_ready(step())
      times[name].append(time.perf_counter() - start)
  plain, chunked = (statistics.median(times[name]) for name in ("plain", "chunked"))
  model = variants["plain"].config.model
  tokens = (config.image_size // model.patch_size) ** 2 + 1
  return {
    "mode": mode,
    "batch": batch,
    "image_size": config.image_size,
    "step_s_plain": plain,
    "step_s_chunked": chunked,
    "speedup": plain / chunked,
    "images_per_chunk": vit_lib.images_per_chunk(batch, model.num_heads, tokens),
    "chunk_bytes": vit_lib.ATTENTION_CHUNK_BYTES,
    "compute_dtype": variants["plain"].config.compute_dtype,
    "devices": mesh.size,
  }


def run(
  config: ml_collections.ConfigDict,
  *,
  batch: int,
  steps: int,
  warmup: int,
  modes: Sequence[str],
  dtype: str | None = None,
  emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  if steps < 1:
    raise ValueError(f"--steps={steps} must be at least 1")
  mesh = sharding.make_mesh()
  rows = []
  for mode in modes:
    if mode == "agent":
      raise ValueError("--modes: the agent has no attention; choose ViT modes")
    rows.append(
      compare_mode(config, mode, mesh, batch=batch, steps=steps, warmup=warmup, dtype=dtype)
    )
    emit(json.dumps(rows[-1]))
  return rows


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["batch"] = flags.DEFINE_integer("batch", 0, "Global batch size; 0: config.batch_size.")
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 5, "Timed steps per variant (median).")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 1, "Untimed steps after compilation.")
  _FLAGS["modes"] = flags.DEFINE_list("modes", ["vit", "shared"], "Modes with a ViT.")
  _FLAGS["dtype"] = flags.DEFINE_enum(
    "dtype", None, ["float32", "bfloat16"], "Sets config.compute_dtype."
  )
  flags.mark_flag_as_required("config")


def main(argv: Sequence[str]) -> None:
  del argv
  value = {name: holder.value for name, holder in _FLAGS.items()}
  config = value["config"]
  run(
    config,
    batch=value["batch"] or config.batch_size,
    steps=value["steps"],
    warmup=value["warmup"],
    modes=[m.strip() for m in value["modes"] if m.strip()],
    dtype=value["dtype"],
    emit=functools.partial(print, flush=True),
  )


if __name__ == "__main__":
  define_flags()
  app.run(main)
