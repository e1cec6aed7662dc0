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

import numpy as np
from absl import app, flags

try:
  import torch
except ImportError as error:
  raise ImportError(
    "converting a PyTorch checkpoint needs torch: pip install 'vitboot_jax[torch]'"
  ) from error

_WRAPPERS = ("model", "state_dict", "model_state", "module")


def read_torch_state_dict(path: str) -> dict[str, np.ndarray]:
  """{name: numpy array} of the tensors in a PyTorch checkpoint file (weights only, no code)."""
  obj = torch.load(path, map_location="cpu", weights_only=True)
  while isinstance(obj, dict) and not any(torch.is_tensor(v) for v in obj.values()):
    inner = next((obj[k] for k in _WRAPPERS if isinstance(obj.get(k), dict)), None)
    if inner is None:
      raise ValueError(
        f"{path} holds no tensors at its top level nor under {_WRAPPERS}: keys {sorted(obj)[:8]}"
      )
    obj = inner
  if not isinstance(obj, dict):
    raise ValueError(
      f"{path} holds a {type(obj).__name__}, not a state_dict; save model.state_dict()"
    )
  out = {}
  for name, value in obj.items():
    if not torch.is_tensor(value):
      continue  # Non-tensor entries (e.g. a saved epoch number) are not weights.
    name = name[len("module.") :] if name.startswith("module.") else name
    value = value.detach().cpu()
    if value.dtype in (torch.float16, torch.bfloat16):
      value = value.float()
    out[name] = np.ascontiguousarray(value.numpy())
  return out


def convert(src: str, dst: str) -> int:
  """Writes the tensors of the PyTorch checkpoint `src` to the safetensors file `dst`."""
  from safetensors.numpy import save_file

  state_dict = read_torch_state_dict(src)
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
