"""The opcodes of a compiled XLA module, async pairs folded (all-reduce-start -> all-reduce)."""

import re


def opcodes(compiled) -> set[str]:
  ops = re.findall(r"\b([a-z][a-z-]*)\(", compiled.as_text())
  return {op.removesuffix("-start").removesuffix("-done") for op in ops}
