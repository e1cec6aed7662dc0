r"""Where a step's time goes: a jax.profiler trace of a few steps, summed per XLA op.

  python -m vitboot_jax.tools.perf.profile_step --config=configs/vits_cifar100.py --mode vit \
    --batch 32 --steps 3 [--dtype bfloat16] [--top 20] [--trace_dir DIR] [--eval]

--eval profiles the mode's eval step (all its models' forward passes, compiled as train.py
compiles it) on a synthetic batch of config.data.eval_batch_size instead of the train step.

The step is compiled exactly as the benchmark compiles it (`benchmark.compile_mode_step`), run
`--warmup` times, then traced for `--steps` steps. Every traced event whose name is an
instruction of the compiled HLO module is attributed to that instruction; its category comes
from what the instruction computes (for a fusion: the instructions fused into it) and its pass
from the JAX source path in its metadata (`transpose(jvp(...))` is the backward pass).

Output, one JSON object per line:
  1. {"mode", "step_s", "traced_op_s", "coverage", ...}: the median step wall time of the traced
     steps and the op time per step the trace accounts for (coverage = their ratio: on a
     2-core CPU XLA runs some ops on both cores at once, so coverage can exceed 1; it can also
     stay below 1 with both cores busy, where an op's work runs on a thread outside its event;
     on a GPU, no kernel runs for at least 1 - coverage of the step).
  2. {"by_category": {category: seconds per step}}, {"by_pass": ...}, {"by_model": ...}.
  3. One line per op of the `--top` most expensive: {"op", "category", "pass", "s_per_step",
     "share", "shape", "source"}.

The trace is read with jax.profiler.ProfileData: no TensorFlow needed, so it runs on accelerator
machines too.
"""

from __future__ import annotations

import collections
import functools
import json
import pathlib
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax import sharding
from vitboot_jax.cpu import devices as cpu_devices
from vitboot_jax.cpu import host_memory
from vitboot_jax.tools.perf import benchmark

# Opcodes that only move or re-lay-out data.
_DATA_MOVEMENT = {
  "bitcast",
  "broadcast",
  "concatenate",
  "copy",
  "dynamic-slice",
  "dynamic-update-slice",
  "gather",
  "iota",
  "pad",
  "parameter",
  "reshape",
  "reverse",
  "scatter",
  "slice",
  "transpose",
  "tuple",
  "get-tuple-element",
  "constant",
}
# Opcodes whose events contain their callees' events: counting both would count twice.
_CONTAINERS = {"while", "conditional", "call", "async-start", "async-done"}
_RANDOM_MARKERS = ("threefry", "random_bits", "rng-bit-generator", "random_wrap", "bernoulli")
_BIT_OPS = {"xor", "shift-left", "shift-right-logical", "rng-bit-generator"}

_INSTRUCTION = re.compile(
  r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+(?P<opcode>[a-z][\w\-]*)\("
)
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_COMMENT = re.compile(r"/\*.*?\*/")
_CALLS = re.compile(r"calls=%?(?P<callee>[\w.\-]+)")
_OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')


def parse_hlo(text: str) -> dict[str, dict[str, Any]]:
  """{instruction name: {"opcode", "shape", "source", "fused": {opcodes}, "fused_sources"}}.

  `text` is the optimized HLO module (`compiled.as_text()`); fused computations are folded
  into the fusion instructions that call them.
  """
  computations: dict[str, list[dict[str, Any]]] = {}
  current = "?"
  instructions: dict[str, dict[str, Any]] = {}
  for line in text.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      op_name = _OP_NAME.search(line)
      calls = _CALLS.search(line)
      entry = {
        "opcode": match["opcode"],
        "shape": match["shape"].split("{")[0].strip(),
        "source": op_name["op_name"] if op_name else "",
        "callee": calls["callee"] if calls else None,
      }
      instructions[match["name"]] = entry
      computations.setdefault(current, []).append(entry)
      continue
    match = _COMPUTATION.match(line)
    # A header's "=" is only ever in its /*index=N*/ comments (long parameter lists).
    if match and "=" not in _COMMENT.sub("", line).split("{")[0]:
      current = match["name"]
  for entry in instructions.values():
    body = computations.get(entry["callee"] or "", []) if entry["opcode"] == "fusion" else []
    entry["fused"] = {b["opcode"] for b in body}
    entry["fused_sources"] = [b["source"] for b in body if b["source"]]
  return instructions


def categorise(entry: dict[str, Any]) -> str:
  """What an instruction spends its time on, in the terms a model author thinks in."""
  opcodes = entry["fused"] | {entry["opcode"]} - {"fusion"}
  sources = " ".join([entry["source"], *entry["fused_sources"]])
  # A custom call is a library kernel (cuDNN, cuBLAS): what it computes is in its JAX source.
  library = entry["opcode"] == "custom-call"
  if "convolution" in opcodes or (library and "conv_general_dilated" in sources):
    return "convolution"
  if "dot" in opcodes or (library and "dot_general" in sources):
    return "matmul"
  makes_bits = opcodes & _BIT_OPS  # Not the ops that only apply a mask fused with its bits.
  if (makes_bits and any(m in sources for m in _RANDOM_MARKERS)) or "rng-bit-generator" in opcodes:
    return "random bits (dropout, drop-path)"
  if opcodes & {"all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all"}:
    return "collectives"
  if "reduce" in opcodes or "reduce-window" in opcodes:
    if "exponential" in opcodes:
      return "softmax / log-softmax"
    return "reductions (norms, losses, grads of broadcasts)"
  if opcodes <= _DATA_MOVEMENT:
    return "data movement (copy, transpose, pad, slice)"
  if "erf" in opcodes or "gelu" in sources:
    return "elementwise with erf (GELU)"
  if "exponential" in opcodes:
    return "elementwise with exp (softmax parts)"
  return "other elementwise"


def pass_of(source: str) -> str:
  """Forward, backward or optimizer, from the JAX name stack of the instruction."""
  if "transpose(" in source:
    return "backward"
  if "jvp(" in source or "vmap(" in source or model_of(source) != "other":
    return "forward"
  if not source:
    return "unknown"
  return "optimizer and other"


def model_of(source: str) -> str:
  """Which model's code the instruction came from, from the name stack (the train step's
  scopes say "vit"/"agent", the eval step's module names "ViT"/"Agent")."""
  source = source.lower()
  for model in ("vit", "agent"):
    if f"/{model}/" in source or f"({model})" in source or source.startswith(f"{model}/"):
      return model
  return "other"


class Event(NamedTuple):
  """One traced op: the HLO names it may go by, its duration, and on a device its kernel's own
  name (None on the host)."""

  names: tuple[str, ...]
  duration_ps: int
  kernel: str | None = None


def kernel_names(event: Any) -> tuple[str, ...]:
  """A device kernel's possible HLO names: its `hlo_op` stat (absent or a command buffer's name
  when it ran inside a CUDA graph), its own name, and that name with XLA's kernel spelling undone
  (`loop_add_fusion_80` is instruction `loop_add_fusion.80`)."""
  stats = dict(event.stats)
  names = [str(stats.get("hlo_op", "")), event.name]
  stem, _, number = event.name.rpartition("_")
  if stem and number.isdigit():
    names.append(f"{stem}.{number}")
  return tuple(name for name in names if name)


def read_events(trace_dir: pathlib.Path) -> Iterable[Event]:
  """The op events of every XPlane file under `trace_dir`.

  Read with JAX's own reader (no TensorFlow), so the tool runs on accelerator machines that have
  only jax. Device planes (GPU/TPU) time kernels: an "XLA Ops" line where the runtime writes
  one, else every line of the plane.
  """
  files = sorted(trace_dir.rglob("*.xplane.pb"))
  if not files:
    raise FileNotFoundError(f"no *.xplane.pb under {trace_dir}: the profiler wrote no trace")
  for file in files:
    for plane in jax.profiler.ProfileData.from_file(str(file)).planes:
      on_device = plane.name.startswith("/device:")
      lines = list(plane.lines)
      op_lines = [line for line in lines if line.name == "XLA Ops"]
      for line in op_lines or lines:
        for event in line.events:
          duration_ps = round(event.duration_ns * 1000)
          if on_device:
            yield Event(kernel_names(event), duration_ps, kernel=event.name)
          else:
            yield Event((event.name,), duration_ps)


def library_kernel(name: str) -> dict[str, Any]:
  """A pseudo-instruction for a device kernel no HLO instruction names: a cuBLAS/cuDNN kernel
  launched inside a CUDA graph, which the trace records under the graph, not the op."""
  lowered = name.lower()
  opcode, fused = "custom-call", {"custom-call"}
  if any(word in lowered for word in ("fprop", "dgrad", "wgrad", "conv")):
    fused = {"convolution"}
  elif "gemm" in lowered or "matmul" in lowered:
    fused = {"dot"}
  elif "memcpy" in lowered or "memset" in lowered:
    opcode, fused = "copy", set()
  return {"opcode": opcode, "shape": "", "source": "", "fused": fused, "fused_sources": []}


def attribute(
  events: Iterable[Event], instructions: dict[str, dict[str, Any]], steps: int
) -> dict[str, float]:
  """Seconds per step of every HLO instruction that appears in the trace, and of every device
  kernel that none names (keyed by the kernel's name; see library_kernel)."""
  seconds: dict[str, float] = collections.defaultdict(float)
  for event in events:
    ops = [n for n in event.names if n in instructions]
    name = next((n for n in ops if instructions[n]["opcode"] not in _CONTAINERS), None)
    name = name or event.kernel
    if name is None:
      continue
    seconds[name] += event.duration_ps * 1e-12 / steps
  return dict(seconds)


def summarise(
  seconds: dict[str, float], instructions: dict[str, dict[str, Any]], top: int
) -> list[dict[str, Any]]:
  """The category/pass/model totals and the `top` most expensive ops, as JSON-ready dicts."""
  total = sum(seconds.values()) or 1.0
  groups: dict[str, dict[str, float]] = {"by_category": {}, "by_pass": {}, "by_model": {}}
  keys: dict[str, Callable[[dict[str, Any]], str]] = {
    "by_category": categorise,
    "by_pass": lambda e: pass_of(e["source"]),
    "by_model": lambda e: model_of(e["source"]),
  }
  for name, s in seconds.items():
    for group, key in keys.items():
      label = key(instructions.get(name) or library_kernel(name))
      groups[group][label] = groups[group].get(label, 0.0) + s
  lines: list[dict[str, Any]] = [
    {group: dict(sorted(values.items(), key=lambda kv: -kv[1]))} for group, values in groups.items()
  ]
  for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:top]:
    entry = instructions.get(name) or library_kernel(name)
    lines.append(
      {
        "op": name,
        "category": categorise(entry),
        "pass": pass_of(entry["source"]),
        "s_per_step": s,
        "share": s / total,
        "shape": entry["shape"],
        "source": entry["source"],
      }
    )
  return lines


def run(
  config: Any,
  *,
  mode: str,
  batch: int,
  steps: int,
  warmup: int,
  top: int = 20,
  dtype: str | None = None,
  trace_dir: str | None = None,
  evaluation: bool = False,
  emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  """Traces `steps` steps of one mode (its eval step with `evaluation`, on a synthetic batch of
  config.data.eval_batch_size) and emits the per-op breakdown (see the module doc)."""
  if steps < 1:
    raise ValueError(f"--steps={steps} must be at least 1")
  mesh = sharding.make_mesh()
  step = benchmark.compile_mode_step(config, mode, mesh, batch=batch, dtype=dtype)
  compiled, call = step.compiled, step
  if evaluation:
    compiled, call = benchmark.eval_forward(step)
    batch = int(step.config.data.eval_batch_size)
  instructions = parse_hlo(compiled.as_text())
  for _ in range(warmup):
    jax.block_until_ready(call())
  with tempfile.TemporaryDirectory() as scratch:
    directory = pathlib.Path(trace_dir or scratch)
    times = []
    with jax.profiler.trace(str(directory)):
      for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    seconds = attribute(read_events(directory), instructions, steps)
  if not seconds:
    raise RuntimeError(
      "the trace holds no event named after an HLO instruction; this jax/XLA version names "
      "its op events differently and the parser needs updating"
    )
  step_s = statistics.median(times)
  traced = sum(seconds.values())
  header = {
    "mode": mode,
    "step": "eval" if evaluation else "train",
    "batch": batch,
    "image_size": step.config.image_size,
    "compute_dtype": step.config.compute_dtype,
    "devices": mesh.size,
    "step_s": step_s,
    "img_per_s": batch / step_s,
    "traced_op_s": traced,
    "coverage": traced / step_s,
    "ops_traced": len(seconds),
  }
  lines = [header, *summarise(seconds, instructions, top)]
  for line in lines:
    emit(json.dumps(line))
  return lines


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  """Defines this tool's flags (only when it runs as a program; see benchmark.define_flags)."""
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["mode"] = flags.DEFINE_enum(
    "mode", None, list(benchmark.MODES), "Mode; default: shared, or cnn for a CNN config."
  )
  _FLAGS["batch"] = flags.DEFINE_integer("batch", 0, "Global batch size; 0: config.batch_size.")
  _FLAGS["cpu_devices"] = cpu_devices.define_flag()
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 3, "Traced steps.")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 2, "Untraced steps after compilation.")
  _FLAGS["top"] = flags.DEFINE_integer("top", 20, "How many of the most expensive ops to list.")
  _FLAGS["dtype"] = flags.DEFINE_enum(
    "dtype", None, ["float32", "bfloat16"], "Sets config.compute_dtype."
  )
  _FLAGS["eval"] = flags.DEFINE_bool(
    "eval", False, "Profile the mode's eval step (batch: config.data.eval_batch_size) instead."
  )
  _FLAGS["trace_dir"] = flags.DEFINE_string(
    "trace_dir", None, "Keep the trace here (for TensorBoard/XProf); default: a temp dir."
  )
  flags.mark_flag_as_required("config")


def main(argv: Sequence[str]) -> None:
  del argv
  value = {name: holder.value for name, holder in _FLAGS.items()}
  config = value["config"]
  batch = benchmark.lay_out_host(value)
  run(
    config,
    mode=value["mode"] or benchmark.default_modes(config, ("shared",))[0],
    batch=batch,
    steps=value["steps"],
    warmup=value["warmup"],
    top=value["top"],
    dtype=value["dtype"],
    trace_dir=value["trace_dir"],
    evaluation=value["eval"],
    emit=functools.partial(print, flush=True),
  )


if __name__ == "__main__":
  host_memory.reexec_with_allocator()  # As main does: the tools time what training runs.
  define_flags()
  app.run(main)
