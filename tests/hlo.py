"""The opcodes of a compiled XLA module, async pairs folded (all-reduce-start -> all-reduce)."""

import re

# Collectives that move activations between devices; a batch-sharded step needs all-reduces only.
GATHERS_AND_EXCHANGES = frozenset(
  {"all-gather", "collective-permute", "all-to-all", "reduce-scatter"}
)


def opcodes(compiled) -> set[str]:
  ops = re.findall(r"\b([a-z][a-z-]*)\(", compiled.as_text())
  return {op.removesuffix("-start").removesuffix("-done") for op in ops}
