r"""A/B of one kernel choice of the models: the train step with the new and the old variant.

  python -m vitboot_jax.tools.perf.kernel_ab --config=configs/vits_cifar100.py --batch 32 \
    --switch attention_chunks --modes vit,shared --steps 5 [--dtype bfloat16]

Switches (SWITCHES), each a change of the mesh's kernel record (models/kernels.py, cpu/kernels.py):
`kernels`, the cpu set against the xla set (the `config.kernels` flip); `attention_chunks`,
the cpu set's training attention (rematerialised batch slices once a device's share exceeds
its whole-batch threshold) against whole-batch attention;
`erf_gelu`, GELU written with erf (cpu/kernels.py) against jax's erfc form (cpu set);
`bf16_matmuls`, the cpu set with float32 operands of its einsums and Dense layers rounded to
bfloat16 (float32 sums; cpu/matmul.py `bf16_einsum`) against the plain cpu set;
`softmax_backward`, the cpu set's training attention with its backward written out
(cpu/softmax_attention.py) against autodiff of softmax;
`hashed_dropout`, the xla set's dropout masks (a counter hash fused into the select that applies
them, models/common.py) against nn.Dropout's threefry Bernoulli masks;
`forward_convs`, the cpu set's convolutions (XLA's convolution forward and for the input
gradient, matmuls for the kernel gradient) against matmuls in both passes;
`conv_slices`, the cpu set's stride-1 XLA convolutions in batch slices when the batch is too
large for the cache (cpu/conv.BatchSlices) against whole-batch convolutions;
`xla_options`, the step compiled with the XLA options of `--xla_options name=value,...`
against the default compilation (same kernels).

Both variants of each mode are compiled as the benchmark compiles them
(`benchmark.compile_mode_step`) and timed alternately, step by step, in one process, so a noisy
or shared machine slows both alike and the ratio stays meaningful.

Output, one JSON object per mode: {"switch", "mode", "batch", "step_s_old", "step_s_new",
"speedup" (old / new median), ...}.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax import kernel_sets, sharding
from vitboot_jax.base.errors import unknown_choice
from vitboot_jax.cpu import conv, host_memory, matmul
from vitboot_jax.cpu import devices as cpu_devices
from vitboot_jax.cpu import kernels as cpu_kernels
from vitboot_jax.models import kernels as kernels_lib
from vitboot_jax.models.kernels import Kernels
from vitboot_jax.tools.perf import benchmark


def _set(name: str, **changes: Any) -> Callable[[Kernels], Kernels]:
  """Set `name` (with `changes`) on the devices the resolved set was made for."""
  return lambda resolved: dataclasses.replace(
    kernel_sets.for_platform(name, "cpu", batch_shards=resolved.batch_shards), **changes
  )


def _cpu_attention(**budgets: int) -> Callable[[Kernels], Kernels]:
  """The cpu set with its attention slices' `budgets` changed (cpu/attention_chunks.py)."""

  def variant(resolved: Kernels) -> Kernels:
    cpu = _set("cpu")(resolved)
    return dataclasses.replace(cpu, attention=dataclasses.replace(cpu.attention, **budgets))

  return variant


# switch -> (new variant, old variant): functions of the set the mesh resolves `auto` to.
SWITCHES: dict[str, tuple[Callable[[Kernels], Kernels], Callable[[Kernels], Kernels]]] = {
  "kernels": (_set("cpu"), _set("xla")),
  "attention_chunks": (_set("cpu"), _cpu_attention(train_bytes=0)),
  "erf_gelu": (_set("cpu"), _set("cpu", gelu=kernels_lib.xla_gelu)),
  "bf16_matmuls": (
    _set("cpu", einsum=matmul.bf16_einsum, dot_general=matmul.bf16_dot_general),
    _set("cpu"),
  ),
  "xla_options": (lambda resolved: resolved, lambda resolved: resolved),
  "conv_slices": (
    _set("cpu"),
    _set("cpu", conv_general_dilated=conv.conv_general_dilated, taps_conv=cpu_kernels.taps_conv),
  ),
  "softmax_backward": (_set("cpu"), _set("cpu", softmax_attention=None)),
  "hashed_dropout": (_set("xla"), _set("xla", dropout=kernels_lib.threefry_dropout)),
  "forward_convs": (
    _set("cpu"),
    _set(
      "cpu",
      conv_general_dilated=conv.conv_general_dilated_matmuls,
      taps_conv=lambda x, taps, positions, window, padding: conv.taps_conv(
        x, taps, positions, window, padding=padding
      ),
    ),
  ),
}


def parse_options(items: Sequence[str]) -> dict[str, Any]:
  """["name=value", ...] -> XLA debug options; "true"/"false" and integers are typed."""
  options: dict[str, Any] = {}
  for item in items:
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
      raise ValueError(f"--xla_options entry {item!r} is not name=value")
    value = value.strip()
    if value.lower() in ("true", "false"):
      options[name.strip()] = value.lower() == "true"
    elif value.lstrip("-").isdigit():
      options[name.strip()] = int(value)
    else:
      options[name.strip()] = value
  return options


def _compile(
  config, mode: str, mesh, *, batch: int, dtype: str | None, switch: str, new: bool, options
):
  variant = SWITCHES[switch][0 if new else 1]
  kernels = variant(kernel_sets.for_devices("auto", mesh.devices.flat))
  return benchmark.compile_mode_step(
    config,
    mode,
    mesh,
    batch=batch,
    dtype=dtype,
    kernels=kernels,
    compiler_options=options if new and switch == "xla_options" else None,
  )


def compare_mode(
  config: ml_collections.ConfigDict,
  mode: str,
  mesh: jax.sharding.Mesh,
  *,
  switch: str,
  batch: int,
  steps: int,
  warmup: int,
  dtype: str | None = None,
  xla_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """Median step times of the old and the new variant, timed alternately."""
  variants = {
    name: _compile(
      config,
      mode,
      mesh,
      batch=batch,
      dtype=dtype,
      switch=switch,
      new=name == "new",
      options=xla_options,
    )
    for name in ("old", "new")
  }
  times = benchmark.time_alternately(variants, steps, warmup)
  old, new = times["old"], times["new"]
  row = {
    "switch": switch,
    "mode": mode,
    "batch": batch,
    "image_size": config.image_size,
    "step_s_old": old,
    "step_s_new": new,
    "speedup": old / new,
    "compute_dtype": variants["old"].config.compute_dtype,
    "devices": mesh.size,
  }
  if switch == "xla_options":
    row["xla_options"] = xla_options
  if switch == "attention_chunks":
    model = variants["old"].config.model
    tokens = (config.image_size // model.patch_size) ** 2 + 1
    cpu = SWITCHES[switch][0](kernel_sets.for_devices("auto", mesh.devices.flat))
    row["images_per_chunk"] = cpu.attention.images(batch, model.num_heads, tokens)
    row["chunk_bytes"] = cpu.attention.train_bytes
  return row


def run(
  config: ml_collections.ConfigDict,
  *,
  switch: str,
  batch: int,
  steps: int,
  warmup: int,
  modes: Sequence[str],
  dtype: str | None = None,
  xla_options: dict[str, Any] | None = None,
  emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  if switch not in SWITCHES:
    raise ValueError(unknown_choice("--switch", switch, SWITCHES))
  if (switch == "xla_options") != bool(xla_options):
    raise ValueError("--xla_options name=value,... goes with --switch=xla_options (and only it)")
  if steps < 1:
    raise ValueError(f"--steps={steps} must be at least 1")
  mesh = sharding.make_mesh()
  rows = []
  for mode in modes:
    if switch == "attention_chunks" and mode == "agent":
      raise ValueError("--modes: the agent has no attention; choose modes with a ViT")
    rows.append(
      compare_mode(
        config,
        mode,
        mesh,
        switch=switch,
        batch=batch,
        steps=steps,
        warmup=warmup,
        dtype=dtype,
        xla_options=xla_options,
      )
    )
    emit(json.dumps(rows[-1]))
  return rows


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["switch"] = flags.DEFINE_enum("switch", None, sorted(SWITCHES), "Kernel choice to A/B.")
  _FLAGS["batch"] = flags.DEFINE_integer("batch", 0, "Global batch size; 0: config.batch_size.")
  _FLAGS["cpu_devices"] = cpu_devices.define_flag()
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 5, "Timed steps per variant (median).")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 1, "Untimed steps after compilation.")
  _FLAGS["modes"] = flags.DEFINE_list(
    "modes", [], "Modes to time; default: vit,shared, or cnn for a CNN config."
  )
  _FLAGS["dtype"] = flags.DEFINE_enum(
    "dtype", None, ["float32", "bfloat16"], "Sets config.compute_dtype."
  )
  _FLAGS["xla_options"] = flags.DEFINE_list(
    "xla_options", [], "XLA options name=value,... of the new variant (--switch=xla_options)."
  )
  flags.mark_flags_as_required(["config", "switch"])


def main(argv: Sequence[str]) -> None:
  del argv
  value = {name: holder.value for name, holder in _FLAGS.items()}
  config = value["config"]
  batch = benchmark.lay_out_host(value)
  run(
    config,
    switch=value["switch"],
    batch=batch,
    steps=value["steps"],
    warmup=value["warmup"],
    modes=[m.strip() for m in value["modes"] if m.strip()]
    or list(benchmark.default_modes(config, ("vit", "shared"))),
    dtype=value["dtype"],
    xla_options=parse_options(value["xla_options"]),
    emit=functools.partial(print, flush=True),
  )


if __name__ == "__main__":
  host_memory.reexec_with_allocator()  # As main does: the tools time what training runs.
  define_flags()
  app.run(main)
