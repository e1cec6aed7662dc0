"""CPU-only hosts: whether the CPU multiplies bfloat16 natively, to warn before a slow bf16 run.

XLA:CPU runs bfloat16 matmuls on AMX (Sapphire Rapids and later) several times faster than
float32. A CPU without bfloat16 instructions gets the operands converted and float32 products,
so `compute_dtype=bfloat16` only adds conversions there: steps 0.6-0.95x of float32 on AVX2-only
VMs (docs/performance.md, docs/results.md). Accuracy is not the concern (bf16 held it at 8x8
tokens); speed is.
"""

from __future__ import annotations

import pathlib

# /proc/cpuinfo flags of the instructions XLA:CPU can use for bfloat16 products.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = pathlib.Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: pathlib.Path = CPUINFO) -> frozenset[str] | None:
  """The feature flags of the first processor listed in `cpuinfo`; None where it is unreadable
  (not Linux) or lists none."""
  try:
    text = cpuinfo.read_text()
  except OSError:
    return None
  for line in text.splitlines():
    key, _, value = line.partition(":")
    if key.strip() == "flags":
      return frozenset(value.split())
  return None


def bf16_warning(compute_dtype: str, flags: frozenset[str] | None) -> str | None:
  """A warning for a bfloat16 run on a CPU known to lack bfloat16 instructions, else None."""
  if compute_dtype != "bfloat16" or flags is None or flags & set(BF16_FLAGS):
    return None
  return (
    "compute_dtype=bfloat16 on a CPU without bfloat16 instructions (none of "
    f"{', '.join(BF16_FLAGS)} in /proc/cpuinfo): XLA:CPU converts the operands and multiplies "
    "in float32, so steps run slower than in float32 (0.6-0.95x measured on AVX2 CPUs). "
    "Use --config.compute_dtype=float32 here; bfloat16 pays on CPUs with AMX."
  )
