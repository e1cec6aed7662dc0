r"""Converts a PyTorch checkpoint to safetensors, so training needs no torch:

  python -m vitboot_jax.tools.convert_checkpoint --input=deit_small_patch16_224.pth \
    --output=deit_s.safetensors

Needs torch (`pip install 'vitboot_jax[torch]'`). Reads a bare state_dict or one wrapped the usual
ways ({"model": ...} as DeiT's releases, {"state_dict": ...}, DDP's `module.` prefixes) and
writes every tensor as float32/int numpy under its name; `--config.init_from=OUT.safetensors` then
maps the names (timm/DeiT or the official code's).
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import app, flags

from vitboot_jax.models import pretrained


def convert(src: str, dst: str) -> int:
  """Writes the tensors of the PyTorch checkpoint `src` to the safetensors file `dst`."""
  from safetensors.numpy import save_file

  try:
    state_dict = pretrained.read_torch_state_dict(src)
  except ModuleNotFoundError as error:
    if error.name != "torch":
      raise
    raise ImportError(
      "converting a PyTorch checkpoint needs torch: pip install 'vitboot_jax[torch]'"
    ) from error
  save_file(state_dict, dst)
  return len(state_dict)


_FLAGS = {}


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  _FLAGS["input"] = flags.DEFINE_string("input", None, "PyTorch checkpoint (.pth, .pt, .bin).")
  _FLAGS["output"] = flags.DEFINE_string("output", None, "safetensors file to write.")
  flags.mark_flags_as_required(["input", "output"])


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  count = convert(_FLAGS["input"].value, _FLAGS["output"].value)
  print(f"wrote {count} tensors to {_FLAGS['output'].value}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
