"""The ViT's attention weights as the attention initialisers (mimetic_init.py, impulse_init.py)
read and write them: pure functions over the ViT's own parameter tree (`params["vit"]`).

`block_{l}/attn/qkv/kernel` [D, 3D] has columns [Q | K | V], head-major inside each third, and
`block_{l}/attn/out/kernel` [D, D] head-major rows; the initialisers edit host numpy copies (no
per-shape XLA compiles) and return a new tree that shares every untouched leaf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vitboot_jax.base.errors import unknown_choice

Params = Mapping[str, Any]


def num_layers(vit_params: Params) -> int:
  layers = [int(k.split("_", 1)[1]) for k in vit_params if k.startswith("block_")]
  if sorted(layers) != list(range(len(layers))) or not layers:
    raise ValueError(f"expected ViT params with block_0..block_L-1, got keys {sorted(vit_params)}")
  return len(layers)


def head_dim(dim: int, num_heads: int) -> int:
  if num_heads <= 0 or dim % num_heads:
    raise ValueError(f"embed dim {dim} is not divisible by num_heads={num_heads}")
  return dim // num_heads


def grid_hw(grid: int | tuple[int, int]) -> tuple[int, int]:
  gh, gw = (grid, grid) if isinstance(grid, int) else tuple(grid)
  if gh <= 0 or gw <= 0:
    raise ValueError(f"grid must be positive, got {grid}")
  return int(gh), int(gw)


def with_leaf(tree: Params, path: tuple[str, ...], value: Any) -> dict[str, Any]:
  """A shallow copy of `tree` with `tree[path] = value`; untouched leaves are shared, not copied."""
  new = dict(tree)
  if len(path) == 1:
    new[path[0]] = value
  else:
    new[path[0]] = with_leaf(tree[path[0]], path[1:], value)
  return new


def host_copy(leaf: jax.Array) -> np.ndarray:
  """A writable host copy; the initialisers edit numpy arrays to avoid per-shape XLA compiles."""
  return np.array(leaf)


def heads_to_columns(w: np.ndarray) -> np.ndarray:
  """[H, D, r] per-head factors -> [D, H*r] kernel columns, head-major (column h*r + j)."""
  return np.transpose(w, (1, 0, 2)).reshape(w.shape[1], -1)


def set_qk(vit_params: Params, layer: int, wq: np.ndarray, wk: np.ndarray) -> dict[str, Any]:
  """Writes per-head W_q, W_k [H, D, r] into the fused kernel and zeroes the Q/K biases."""
  qkv = vit_params[f"block_{layer}"]["attn"]["qkv"]
  kernel = host_copy(qkv["kernel"])
  d = kernel.shape[0]
  kernel[:, :d] = heads_to_columns(wq)
  kernel[:, d : 2 * d] = heads_to_columns(wk)
  new_qkv = dict(qkv, kernel=jnp.asarray(kernel))
  if "bias" in qkv:
    bias = host_copy(qkv["bias"])
    bias[: 2 * d] = 0
    new_qkv["bias"] = jnp.asarray(bias)
  return with_leaf(vit_params, (f"block_{layer}", "attn", "qkv"), new_qkv)


def _sincos_pos_embed(vit_params: Params, gh: int, gw: int) -> dict[str, Any]:
  """Writes the fixed 2-D sin-cos PE into the patch rows of pos_embed (cls row untouched)."""
  pos = vit_params["pos_embed"]
  n = gh * gw
  if pos.shape[1] not in (n, n + 1):
    raise ValueError(f"pos_embed has {pos.shape[1]} tokens; grid {gh}x{gw} needs {n} (+1 cls)")
  new = host_copy(pos)
  new[0, pos.shape[1] - n :] = sincos2d(gh, gw, pos.shape[-1])
  return with_leaf(vit_params, ("pos_embed",), jnp.asarray(new))


def apply_pos_embed(vit_params: Params, pos_embed: str, grid) -> Params:
  if pos_embed == "keep":
    return vit_params
  if pos_embed == "sincos":
    if grid is None:
      raise ValueError("pos_embed='sincos' needs the token grid")
    return _sincos_pos_embed(vit_params, *grid_hw(grid))
  raise ValueError(unknown_choice("pos_embed", pos_embed, ("keep", "sincos")))


def sincos2d(gh: int, gw: int, dim: int, temperature: float = 1e4) -> np.ndarray:
  """Fixed 2-D sin-cos PE [gh*gw, dim], row-major, layout [sin_y | sin_x | cos_y | cos_x] (§C.3)."""
  if dim % 4:
    raise ValueError(f"the 2-D sin-cos embedding needs dim % 4 == 0, got {dim}")
  quarter = dim // 4
  bands = 1.0 / temperature ** (np.arange(quarter, dtype=np.float64) / quarter)
  ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
  ang_y = ys.reshape(-1, 1) * bands[None]
  ang_x = xs.reshape(-1, 1) * bands[None]
  p = np.concatenate([np.sin(ang_y), np.sin(ang_x), np.cos(ang_y), np.cos(ang_x)], axis=1)
  return p.astype(np.float32)
