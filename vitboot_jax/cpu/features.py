"""What the host CPU is: its model and widest vector instructions (stated beside benchmark
figures: VMs of one kind differ in CPU, docs/performance.md), and whether it multiplies bfloat16
natively, to warn before a slow bf16 run.

XLA:CPU runs bfloat16 matmuls on AMX several times faster than float32. A CPU without bfloat16
instructions gets the operands converted and float32 products, so `compute_dtype=bfloat16` only
adds conversions there (measured in docs/results.md, docs/performance.md). Accuracy is not the
concern (bf16 held it at 8x8 tokens); speed is.
"""

from __future__ import annotations

import pathlib

# /proc/cpuinfo flags of the instructions XLA:CPU can use for bfloat16 products.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = pathlib.Path("/proc/cpuinfo")
# The widest vector instructions first: what a CPU's matmul rate mostly depends on.
VECTOR_ISAS = ("amx_bf16", "avx512f", "avx2", "avx")


def _first_processor_field(name: str, cpuinfo: pathlib.Path) -> str | None:
  """Field `name` of the first processor listed in `cpuinfo`; None where it is unreadable (not
  Linux) or lacks the field."""
  try:
    text = cpuinfo.read_text()
  except OSError:
    return None
  for line in text.splitlines():
    key, _, value = line.partition(":")
    if key.strip() == name:
      return value.strip()
  return None


def cpu_flags(cpuinfo: pathlib.Path = CPUINFO) -> frozenset[str] | None:
  """The feature flags of the first processor listed in `cpuinfo`, or None."""
  flags = _first_processor_field("flags", cpuinfo)
  return None if flags is None else frozenset(flags.split())


def cpu_model(cpuinfo: pathlib.Path = CPUINFO) -> str | None:
  """The first processor's model name (e.g. "AMD EPYC"), or None."""
  return _first_processor_field("model name", cpuinfo)


def widest_vector_isa(flags: frozenset[str] | None) -> str | None:
  """The widest of VECTOR_ISAS that `flags` lists, or None."""
  return next((isa for isa in VECTOR_ISAS if flags and isa in flags), None)


def bf16_warning(compute_dtype: str, flags: frozenset[str] | None) -> str | None:
  """A warning for a bfloat16 run on a CPU known to lack bfloat16 instructions, else None."""
  if compute_dtype != "bfloat16" or flags is None or flags & set(BF16_FLAGS):
    return None
  return (
    "compute_dtype=bfloat16 on a CPU without bfloat16 instructions (none of "
    f"{', '.join(BF16_FLAGS)} in /proc/cpuinfo): XLA:CPU converts the operands and multiplies "
    "in float32, so steps run slower than in float32 (docs/performance.md). "
    "Use --config.compute_dtype=float32 here; bfloat16 pays on CPUs with AMX."
  )
