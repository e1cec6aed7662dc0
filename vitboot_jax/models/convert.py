"""Imports official PyTorch `state_dict`s (dicts of numpy arrays) into our variable trees.

Key names and layouts are those of docs/reference/official_state_dict_keys.md: Linear
weights [out, in] become Flax kernels [in, out]; Conv2d [out, in, kh, kw] becomes HWIO; ViT
tensors that are sequence-first ([N, 1, D]) become batch-first. Works on gradients too (same
names, no BatchNorm statistics), which is how the golden tests compare gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from vitboot_jax.models.agent import tap_positions

Tree = dict[str, Any]


class _Reader:
  """Looks keys up (full names) and remembers which were used, to report leftovers."""

  def __init__(self, state_dict: Mapping[str, Any]):
    self.sd = {k: np.asarray(v) for k, v in state_dict.items()}
    self.used: set[str] = set()

  def has(self, key: str) -> bool:
    return key in self.sd

  def get(self, *keys: str) -> np.ndarray:
    """The first of `keys` present (shared tensors may be listed under another model's name)."""
    for key in keys:
      if key in self.sd:
        self.used.add(key)
        return self.sd[key]
    raise KeyError(f"official state_dict has no {keys[0]!r}; is this the right model/config?")


def _linear(r: _Reader, name: str, *alt: str) -> Tree:
  out = {"kernel": r.get(name + ".weight", *(a + ".weight" for a in alt)).T}
  if r.has(name + ".bias") or any(r.has(a + ".bias") for a in alt):
    out["bias"] = r.get(name + ".bias", *(a + ".bias" for a in alt))
  return out


def _conv(r: _Reader, name: str) -> Tree:
  out = {"kernel": r.get(name + ".weight").transpose(2, 3, 1, 0)}
  if r.has(name + ".bias"):
    out["bias"] = r.get(name + ".bias")
  return out


def _norm(r: _Reader, name: str) -> Tree:
  return {"scale": r.get(name + ".weight"), "bias": r.get(name + ".bias")}


def vit_params(r: _Reader, depth: int, prefix: str = "", tied_prefix: str | None = None) -> Tree:
  """The ViT subtree. `tied_prefix` is the shared agent's prefix, where the tied tensors may be
  listed instead (the golden gradients list each tied tensor once, under the agent's name)."""
  p: Tree = {
    "cls": r.get(prefix + "cls_token"),
    "patch_embed": _conv(r, prefix + "patch_embed.proj"),
    "pos_embed": r.get(prefix + "pos_embed.pos_embed").transpose(1, 0, 2),
    "norm": _norm(r, prefix + "transformer.norm"),
    "head": _linear(r, prefix + "cls_head"),
  }
  for layer in range(depth):
    t = f"{prefix}transformer.layers.{layer}."
    a = f"{tied_prefix}layers.{layer}." if tied_prefix is not None else None
    tied = lambda name, alt, _a=a, _t=t: _linear(r, _t + name, *((_a + alt,) if _a else ()))
    p[f"block_{layer}"] = {
      "ln1": _norm(r, t + "norm1"),
      "ln2": _norm(r, t + "norm2"),
      "attn": {
        "qkv": tied("attention.linear_qkv", "cnn_block.mhsa.linear_qkv"),
        "out": tied("attention.linear_out", "cnn_block.mhsa.linear_out"),
      },
      "mlp": {
        "fc1": tied("mlp.linear1", "mlp_block.linear1"),
        "fc2": tied("mlp.linear2", "mlp_block.linear2"),
      },
    }
  return p


def _standalone_taps(r: _Reader, name: str, num_taps: int) -> np.ndarray:
  """Per-tap [T, D_in, D_out] matrices from Conv_SL (3x3 conv) or Conv_ManyHead ([D, D, H])."""
  if r.has(name + ".conv.weight"):  # Conv_SL: a dense k x k conv; taps in raster order.
    w = r.get(name + ".conv.weight")
    k, positions = tap_positions(num_taps, "official")
    if w.shape[2:] != (k, k):
      raise ValueError(f"{name}.conv.weight has a {w.shape[2:]} kernel, expected {(k, k)}")
    return np.stack([w[:, :, row, col].T for row, col in positions])
  return r.get(name + ".weight").transpose(2, 1, 0)  # Conv_ManyHead: [D_out, D_in, H].


def agent_variables(
  r: _Reader, depth: int, num_taps: int, *, shared: bool, prefix: str = "", stats: bool = True
) -> tuple[Tree, Tree]:
  """(params, batch_stats) of the agent; a shared agent has no CONV/MLP weights of its own."""
  params: Tree = {}
  batch_stats: Tree = {}

  def add_stats(path: tuple[str, ...], name: str) -> None:
    if not stats:
      return
    node = batch_stats
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = {"mean": r.get(name + ".running_mean"), "var": r.get(name + ".running_var")}
    r.get(name + ".num_batches_tracked")

  stem = prefix + "input_proj"
  if r.has(stem + ".conv1.weight"):  # resnet_like
    params["stem"] = {
      "conv1": _conv(r, stem + ".conv1"),
      "bn": _norm(r, stem + ".norm"),
      "conv2": _conv(r, stem + ".conv2"),
    }
    add_stats(("stem", "bn"), stem + ".norm")
  else:  # vit_like: one patch conv named `input_proj`.
    params["stem"] = {"conv": _conv(r, stem)}
  for layer in range(depth):
    name = f"{prefix}layers.{layer}"
    block: Tree = {"bn1": _norm(r, name + ".norm1"), "bn2": _norm(r, name + ".norm2")}
    if not shared:
      block["conv_taps"] = _standalone_taps(r, name + ".cnn_block", num_taps)
      block["conv_bias"] = r.get(name + ".cnn_block.conv.bias", name + ".cnn_block.bias")
      for ours, theirs in (("fc1", "conv1"), ("fc2", "conv2")):
        block[ours] = {
          "kernel": r.get(f"{name}.mlp_block.{theirs}.weight")[:, :, 0, 0].T,
          "bias": r.get(f"{name}.mlp_block.{theirs}.bias"),
        }
    params[f"block_{layer}"] = block
    add_stats((f"block_{layer}", "bn1"), name + ".norm1")
    add_stats((f"block_{layer}", "bn2"), name + ".norm2")
  params["head_bn"] = _norm(r, prefix + "bn")
  params["head"] = _linear(r, prefix + "linear")
  add_stats(("head_bn",), prefix + "bn")
  return params, batch_stats


def _check_all_used(r: _Reader, strict: bool) -> None:
  # The shared agent's copies of the ViT's tensors (state_dict lists them twice) are not needed.
  tied = (".cnn_block.mhsa.", ".mlp_block.linear")
  leftover = sorted(k for k in r.sd if k not in r.used and not any(t in k for t in tied))
  if strict and leftover:
    raise ValueError(
      f"official state_dict keys not imported (wrong depth or model?): {leftover[:8]}"
    )


def import_vit(state_dict: Mapping[str, Any], depth: int, strict: bool = True) -> Tree:
  """Official `vit` state_dict -> {"params": {"vit": ...}, "batch_stats": {}}."""
  r = _Reader(state_dict)
  params = vit_params(r, depth)
  _check_all_used(r, strict)
  return {"params": {"vit": params}, "batch_stats": {}}


def import_agent(
  state_dict: Mapping[str, Any], depth: int, num_taps: int, stats: bool = True
) -> Tree:
  """Official standalone `cnn` state_dict -> {"params": {"agent"}, "batch_stats": {"agent"}}.

  stats=False reads a gradient dict (same names, no BatchNorm statistics).
  """
  r = _Reader(state_dict)
  params, batch_stats = agent_variables(r, depth, num_taps, shared=False, stats=stats)
  _check_all_used(r, stats)
  return {"params": {"agent": params}, "batch_stats": {"agent": batch_stats}}


def import_shared(
  state_dict: Mapping[str, Any], depth: int, num_heads: int, stats: bool = True
) -> Tree:
  """Official shared `joint_model` state_dict (`models.vit.*`, `models.cnn.*`) -> one tree."""
  r = _Reader(state_dict)
  vit = vit_params(r, depth, prefix="models.vit.", tied_prefix="models.cnn.")
  agent, batch_stats = agent_variables(
    r, depth, num_heads, shared=True, prefix="models.cnn.", stats=stats
  )
  _check_all_used(r, stats)
  return {"params": {"vit": vit, "agent": agent}, "batch_stats": {"agent": batch_stats}}
