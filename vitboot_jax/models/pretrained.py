"""Pre-trained ViT weights -> our ViT parameter tree, and fitting them to the configured model.

Two steps, both pure numpy on parameter trees:
1. `vit_params_from_state_dict` maps a flat dict of tensors in one of three layouts to our tree
   (`block_{l}/attn/qkv/kernel`, ...): timm/DeiT (`blocks.0.attn.qkv.weight`, PyTorch layouts),
   the official code's (`transformer.layers.0.attention.linear_qkv.weight`, via models/convert.py;
   also under `models.vit.` as its joint/shared checkpoints hold it), and ours flattened
   (`block_0/attn/qkv/kernel`). Both PyTorch layouts store the fused qkv as [Q | K | V] with
   heads contiguous inside each third, as our kernel's columns, so it maps by transposition.
   The timm table (`timm_entries`) and the official one (models/convert.py) also export:
   `timm_state_dict` and convert.export_* are their inverses (tools/export.py).
2. `fit_vit_params` fits that tree to the model a config builds, as timm does when it loads a
   checkpoint into a model of another shape: a head for another class count is replaced by the
   model's fresh one, position embeddings for another patch grid are resampled (bicubic,
   antialiased, cls position kept), and any other difference is an error naming the parameter,
   both shapes and the config field to change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vitboot_jax.models import convert

Tree = dict[str, Any]

# Key prefixes a wrapper adds in front of a model's own names: DDP's `module.`, the golden
# files' `param/`, and our own orbax trees' `params/vit/`.
_WRAPPER_PREFIXES = ("module.", "param/", "params/vit/")
# timm parameters of ViT variants our ViT does not have, with what they mean.
_TIMM_UNSUPPORTED = {
  "dist_token": "a distilled DeiT (dist token + head_dist); use the non-distilled DeiT weights "
  "(e.g. timm's deit_small_patch16_224)",
  "reg_token": "register tokens; use a checkpoint without registers",
  "fc_norm": "global average pooling (fc_norm); use a cls-token checkpoint (global_pool='token')",
  "norm_pre": "a pre-norm before the blocks (CLIP-style); use a DeiT/AugReg checkpoint",
  ".ls1.": "LayerScale; use a checkpoint without layer scale (init_values=None)",
  ".q_norm.": "qk-norm; use a checkpoint without it",
}


# ----------------------------------------------------------------------------------------------
# Layouts.


def strip_wrappers(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The state_dict as numpy, without a prefix that every key shares (_WRAPPER_PREFIXES)."""
  out = {k: np.asarray(v) for k, v in state_dict.items()}
  for prefix in _WRAPPER_PREFIXES:
    if out and all(k.startswith(prefix) for k in out):
      out = {k[len(prefix) :]: v for k, v in out.items()}
  return out


# Where a PyTorch checkpoint file nests its state_dict: DeiT's releases under "model", others
# under "state_dict", "model_state" or "module".
_TORCH_NESTS = ("model", "state_dict", "model_state", "module")


def read_torch_state_dict(path: str) -> dict[str, np.ndarray]:
  """{name: numpy array} of the tensors in a PyTorch checkpoint file (weights only, no code),
  found at its top level or nested the usual ways; needs torch (ModuleNotFoundError without)."""
  import torch  # The optional [torch] extra: only .pth files need it.

  obj = torch.load(path, map_location="cpu", weights_only=True)
  while isinstance(obj, dict) and not any(torch.is_tensor(v) for v in obj.values()):
    inner = next((obj[k] for k in _TORCH_NESTS if isinstance(obj.get(k), dict)), None)
    if inner is None:
      raise ValueError(
        f"{path} holds no tensors at its top level nor under {_TORCH_NESTS}: keys {sorted(obj)[:8]}"
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
    value = value.detach().cpu()
    if value.dtype in (torch.float16, torch.bfloat16):
      value = value.float()
    out[name] = np.ascontiguousarray(value.numpy())
  return strip_wrappers(out)


def detect_layout(keys) -> str:
  """ "timm", "official", "official_joint" (keys under `models.vit.`) or "ours"."""
  keys = set(keys)
  if "blocks.0.attn.qkv.weight" in keys or (
    "patch_embed.proj.weight" in keys and "pos_embed" in keys
  ):
    return "timm"
  if "transformer.layers.0.attention.linear_qkv.weight" in keys:
    return "official"
  if "models.vit.transformer.layers.0.attention.linear_qkv.weight" in keys:
    return "official_joint"
  if "patch_embed/kernel" in keys:
    return "ours"
  shown = sorted(keys)[:6]
  raise ValueError(
    f"pre-trained weights in an unknown layout (first keys: {shown}); expected timm/DeiT names "
    "('blocks.0.attn.qkv.weight'), the official code's ('transformer.layers.0.attention."
    "linear_qkv.weight') or ours ('block_0/attn/qkv/kernel')"
  )


def _depth(keys, pattern: str) -> int:
  found = [int(m.group(1)) for k in keys if (m := re.match(pattern, k))]
  if not found:
    raise ValueError(f"pre-trained weights hold no transformer blocks (no key matches {pattern})")
  return max(found) + 1


class _Keys:
  """Reads tensors by name and remembers which were read, so leftovers can be reported."""

  def __init__(self, state_dict: dict[str, np.ndarray]):
    self.sd, self.used = state_dict, set()

  def has(self, key: str) -> bool:
    return key in self.sd

  def get(self, key: str) -> np.ndarray:
    if key not in self.sd:
      raise ValueError(
        f"pre-trained weights lack {key!r}, which every timm/DeiT ViT has: give the model's full "
        "state_dict (not a partial or optimizer file)"
      )
    self.used.add(key)
    return self.sd[key]

  def leftovers(self) -> list[str]:
    return sorted(set(self.sd) - self.used)


def timm_entries(depth: int, head: bool = True) -> list[convert.Entry]:
  """timm's VisionTransformer tensors (pre-norm, cls token, learned pos_embed, qkv bias), as
  convert's entries: `read_entries` imports them, `write_entries` exports them."""
  Entry = convert.Entry
  linear = lambda ours, name: [
    Entry(("params", *ours, "kernel"), (name + ".weight",), convert.LINEAR),
    Entry(("params", *ours, "bias"), (name + ".bias",)),
  ]
  norm = lambda ours, name: [
    Entry(("params", *ours, "scale"), (name + ".weight",)),
    Entry(("params", *ours, "bias"), (name + ".bias",)),
  ]
  entries = [
    Entry(("params", "cls"), ("cls_token",)),
    Entry(("params", "pos_embed"), ("pos_embed",)),
    Entry(("params", "patch_embed", "kernel"), ("patch_embed.proj.weight",), convert.CONV),
    Entry(("params", "patch_embed", "bias"), ("patch_embed.proj.bias",)),
    *norm(("norm",), "norm"),
    *(linear(("head",), "head") if head else []),
  ]
  for layer in range(depth):
    b, ours = f"blocks.{layer}.", (f"block_{layer}",)
    entries += [
      *norm((*ours, "ln1"), b + "norm1"),
      *norm((*ours, "ln2"), b + "norm2"),
      *linear((*ours, "attn", "qkv"), b + "attn.qkv"),
      *linear((*ours, "attn", "out"), b + "attn.proj"),
      *linear((*ours, "mlp", "fc1"), b + "mlp.fc1"),
      *linear((*ours, "mlp", "fc2"), b + "mlp.fc2"),
    ]
  return entries


def _timm_vit(state_dict: dict[str, np.ndarray]) -> Tree:
  for key in state_dict:
    for marker, meaning in _TIMM_UNSUPPORTED.items():
      if marker in key:
        raise ValueError(f"pre-trained weights hold {key!r}: {meaning}")
  get = _Keys(state_dict)
  # A headless (num_classes=0) export gets the model's fresh head.
  entries = timm_entries(_depth(state_dict, r"blocks\.(\d+)\."), head="head.weight" in state_dict)
  params = convert.read_entries(get, entries)["params"]
  if get.leftovers():
    raise ValueError(
      f"pre-trained timm weights hold parameters our ViT has no place for: {get.leftovers()[:8]}; "
      "use a plain ViT/DeiT checkpoint (pre-norm, cls token, learned pos_embed, qkv bias)"
    )
  return params


def timm_state_dict(vit: Tree) -> dict[str, np.ndarray]:
  """Our ViT parameters -> a timm VisionTransformer state_dict (the inverse of `_timm_vit`)."""
  depth = sum(1 for name in vit if name.startswith("block_"))
  return convert.write_entries({"params": vit}, timm_entries(depth))


def _official_vit(state_dict: dict[str, np.ndarray], prefix: str) -> Tree:
  depth = _depth(state_dict, re.escape(prefix) + r"transformer\.layers\.(\d+)\.")
  reader = convert._Reader(state_dict)  # noqa: SLF001 - the official mapping lives there.
  params = convert.vit_params(reader, depth, prefix=prefix)
  left = sorted(k for k in state_dict if k.startswith(prefix) and k not in reader.used)
  if left:
    raise ValueError(
      f"official checkpoint holds ViT parameters our ViT has no place for: {left[:8]}; use a "
      "checkpoint of the official `vit` class (or of its joint/shared model)"
    )
  return params


def _ours(state_dict: dict[str, np.ndarray]) -> Tree:
  params: Tree = {}
  for key, value in state_dict.items():
    node = params
    *parents, leaf = key.split("/")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return params


def vit_params_from_state_dict(state_dict: Mapping[str, Any]) -> Tree:
  """Our ViT tree (numpy) from a flat dict of tensors in timm, official or our layout."""
  sd = strip_wrappers(state_dict)
  layout = detect_layout(sd)
  if layout == "timm":
    return _timm_vit(sd)
  if layout == "official":
    return _official_vit(sd, "")
  if layout == "official_joint":
    return _official_vit(sd, "models.vit.")
  return _ours(sd)


# ----------------------------------------------------------------------------------------------
# Fitting to the configured model.


def resample_pos_embed(pos_embed: np.ndarray, num_tokens: int, num_prefix: int = 1) -> np.ndarray:
  """[1, P + N, D] -> [1, P + N', D]: the square patch grid resized bicubically (antialiased when
  shrinking), the P prefix (cls) positions kept, as timm's `resample_abs_pos_embed`."""
  prefix, grid = pos_embed[:, :num_prefix], pos_embed[0, num_prefix:]
  old, new = _side(grid.shape[0]), _side(num_tokens - num_prefix)
  if old is None or new is None:
    raise ValueError(
      f"pos_embed cannot be resampled from {pos_embed.shape[1]} to {num_tokens} tokens: only "
      "square patch grids (plus the cls token) are supported"
    )
  grid = grid.reshape(old, old, -1).astype(np.float32)
  resized = jax.image.resize(
    jnp.asarray(grid), (new, new, grid.shape[-1]), method="bicubic", antialias=True
  )
  resized = np.asarray(resized).reshape(1, new * new, -1).astype(pos_embed.dtype)
  return np.concatenate([prefix, resized], axis=1)


def _side(n: int) -> int | None:
  side = math.isqrt(n)
  return side if side * side == n else None


def _flatten(tree: Tree) -> dict[str, Any]:
  return {
    "/".join(str(getattr(k, "key", k)) for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _unflatten(flat: dict[str, Any]) -> Tree:
  return _ours(flat)


def _config_field(path: str) -> str:
  """The config field that decides a parameter's shape (named in the mismatch error)."""
  if path.startswith("patch_embed/kernel"):
    return "config.model.patch_size and config.model.embed_dim"
  if "/mlp/fc1" in path or ("/mlp/fc2/kernel" in path):
    return "config.model.mlp_dim and config.model.embed_dim"
  return "config.model.embed_dim"


def _blocks(flat: Mapping[str, Any]) -> int:
  return len({p.split("/")[0] for p in flat if p.startswith("block_")})


def fit_vit_params(loaded: Tree, target: Tree, log: Callable[[str], None] = print) -> Tree:
  """`loaded` fitted to `target`, the configured model's freshly initialised ViT tree: the fresh
  head where the class count differs, pos_embed resampled to its grid; raises on anything else."""
  src, dst = _flatten(loaded), _flatten(target)
  if "dist" in src and "dist" not in dst:
    raise ValueError(
      "the pre-trained ViT has a distillation token (a distill=hard run): its pos_embed and "
      "prefix differ from this ViT's; start from a ViT trained without it"
    )
  if _blocks(src) != _blocks(dst):
    raise ValueError(
      f"the pre-trained ViT has {_blocks(src)} blocks but the config builds {_blocks(dst)}: set "
      f"--config.model.depth={_blocks(src)} (and the matching width/heads, e.g. a model preset)"
    )
  fresh_head = False
  out: dict[str, Any] = {}
  for path, want in dst.items():
    shape = tuple(want.shape)
    if path.startswith("head/") and (path not in src or src[path].shape != shape):
      fresh_head = True
      out[path] = want
      continue
    if path not in src:
      if path.endswith("entmax_alpha"):  # Sparse ViT from softmax weights: alpha starts fresh.
        log(f"init_from: {path} is not in the checkpoint; it keeps its initial value")
        out[path] = want
        continue
      raise ValueError(
        f"the pre-trained ViT has no {path} {shape} that the configured model needs; check "
        "config.model.attention and the checkpoint's model"
      )
    value = np.asarray(src[path])
    if value.shape != shape and path == "pos_embed" and value.shape[2] == shape[2]:
      log(
        f"init_from: pos_embed resampled from {value.shape[1] - 1} to {shape[1] - 1} patch "
        "positions (bicubic, cls position kept)"
      )
      value = resample_pos_embed(value, shape[1])
    if value.shape != shape:
      raise ValueError(
        f"pre-trained {path} has shape {value.shape} but the configured ViT needs {shape}: set "
        f"{_config_field(path)} to those of the checkpoint's model (DeiT-S is the vit_b "
        "preset), or use a checkpoint of this model"
      )
    out[path] = value.astype(want.dtype)
  extra = sorted(set(src) - set(dst))
  if extra and not all(p.startswith("head/") for p in extra):
    raise ValueError(
      f"pre-trained ViT parameters the configured model lacks: {extra[:6]}; e.g. entmax_alpha "
      "needs --config.model.attention=entmax"
    )
  if fresh_head:
    had = src.get("head/kernel")
    classes = "no head" if had is None else f"a {had.shape[-1]}-class head"
    log(
      f"init_from: the checkpoint has {classes}; the configured "
      f"{dst['head/kernel'].shape[-1]}-class head starts from its initial values"
    )
  return _unflatten(out)
