"""The official PyTorch `state_dict` layout <-> our variable trees, both ways from one table.

Key names and layouts are those of docs/reference/official_state_dict_keys.md: Linear
weights [out, in] become Flax kernels [in, out]; Conv2d [out, in, kh, kw] becomes HWIO; ViT
tensors that are sequence-first ([N, 1, D]) become batch-first. Each tensor is one `Entry` (our
path, their names, the layout between them): `read_entries` imports a state_dict with it and
`write_entries` exports one (tools/export.py). Works on gradients too (same names, no BatchNorm
statistics), which is how the golden tests compare gradients.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vitboot_jax.models.agent import tap_positions

Tree = dict[str, Any]
Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
  """A PyTorch tensor layout relative to ours: `ours(theirs)` and its inverse `theirs(ours)`."""

  ours: Callable[[np.ndarray], np.ndarray]
  theirs: Callable[[np.ndarray], np.ndarray]


SAME = Layout(lambda a: a, lambda a: a)
LINEAR = Layout(lambda w: w.T, lambda k: k.T)  # Linear [out, in] <-> Dense kernel [in, out].
CONV = Layout(lambda w: w.transpose(2, 3, 1, 0), lambda k: k.transpose(3, 2, 0, 1))  # OIHW/HWIO.
SEQ_FIRST = Layout(lambda a: a.transpose(1, 0, 2), lambda a: a.transpose(1, 0, 2))  # [N, 1, D].
CONV_1X1 = Layout(lambda w: w[:, :, 0, 0].T, lambda k: k.T[:, :, None, None])  # A 1x1 conv.
# Conv_ManyHead's [D_out, D_in, H] <-> our taps [H, D_in, D_out].
MANY_HEAD = Layout(lambda w: w.transpose(2, 1, 0), lambda t: t.transpose(2, 1, 0))


def conv_sl_layout(num_taps: int) -> Layout:
  """Conv_SL's dense k x k conv [D_out, D_in, k, k] <-> per-tap [T, D_in, D_out] (raster taps)."""
  k, positions = tap_positions(num_taps, "official")

  def ours(w: np.ndarray) -> np.ndarray:
    if w.shape[2:] != (k, k):
      raise ValueError(f"a Conv_SL weight has a {w.shape[2:]} kernel, expected {(k, k)}")
    return np.stack([w[:, :, row, col].T for row, col in positions])

  def theirs(taps: np.ndarray) -> np.ndarray:
    w = np.zeros((taps.shape[2], taps.shape[1], k, k), taps.dtype)
    for tap, (row, col) in zip(taps, positions):
      w[:, :, row, col] = tap.T
    return w

  return Layout(ours, theirs)


@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor: its path in our variables ({"params": ..., "batch_stats": ...} of one model;
  None for a BatchNorm's num_batches_tracked, which we do not keep), its official name (then the
  other names it is listed under: shared tensors appear twice) and the layout between them."""

  ours: Path | None
  theirs: tuple[str, ...]
  layout: Layout = SAME
  optional: bool = False  # A bias some checkpoints (gradient dicts) may lack.


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


def read_entries(reader: Any, entries: Sequence[Entry]) -> Tree:
  """Our variables from a state_dict: `reader` has `has(key)` and `get(*keys)` (_Reader's)."""
  out: Tree = {}
  for entry in entries:
    if entry.optional and not any(reader.has(k) for k in entry.theirs):
      continue
    value = reader.get(*entry.theirs)
    if entry.ours is None:
      continue
    node = out
    for part in entry.ours[:-1]:
      node = node.setdefault(part, {})
    node[entry.ours[-1]] = entry.layout.ours(value)
  return out


def write_entries(
  variables: Mapping[str, Any], entries: Sequence[Entry], batches: int = 0
) -> dict[str, np.ndarray]:
  """The state_dict of `variables` (numpy), every name of each entry; `batches` is written as
  each BatchNorm's num_batches_tracked."""
  out: dict[str, np.ndarray] = {}
  for entry in entries:
    if entry.ours is None:
      value = np.asarray(batches, np.int64)
    else:
      node: Any = variables
      for part in entry.ours:
        if not isinstance(node, Mapping) or part not in node:
          node = None
          break
        node = node[part]
      if node is None:
        if entry.optional:
          continue
        raise KeyError(f"our variables have no {'/'.join(entry.ours)} for {entry.theirs[0]!r}")
      value = np.ascontiguousarray(entry.layout.theirs(np.asarray(node)))
    for name in entry.theirs:
      out[name] = value
  return out


def _linear(ours: Path, name: str, *alt: str) -> list[Entry]:
  return [
    Entry((*ours, "kernel"), (name + ".weight", *(a + ".weight" for a in alt)), LINEAR),
    Entry((*ours, "bias"), (name + ".bias", *(a + ".bias" for a in alt)), optional=True),
  ]


def _conv(ours: Path, name: str, bias: bool = True) -> list[Entry]:
  weight = [Entry((*ours, "kernel"), (name + ".weight",), CONV)]
  return weight + ([Entry((*ours, "bias"), (name + ".bias",), optional=True)] if bias else [])


def _norm(ours: Path, name: str) -> list[Entry]:
  return [Entry((*ours, "scale"), (name + ".weight",)), Entry((*ours, "bias"), (name + ".bias",))]


def _bn(ours: Path, name: str, stats: bool) -> list[Entry]:
  """A BatchNorm: affine parameters, and with `stats` its running statistics and counter."""
  entries = _norm(("params", *ours), name)
  if stats:
    entries += [
      Entry(("batch_stats", *ours, "mean"), (name + ".running_mean",)),
      Entry(("batch_stats", *ours, "var"), (name + ".running_var",)),
      Entry(None, (name + ".num_batches_tracked",)),
    ]
  return entries


def vit_entries(depth: int, prefix: str = "", tied_prefix: str | None = None) -> list[Entry]:
  """The official `vit`'s tensors. `tied_prefix` is the shared agent's prefix, where the tied
  tensors are listed too (the golden gradients list each tied tensor once, under that name)."""
  p = ("params",)
  entries = [
    Entry((*p, "cls"), (prefix + "cls_token",)),
    *_conv((*p, "patch_embed"), prefix + "patch_embed.proj"),
    Entry((*p, "pos_embed"), (prefix + "pos_embed.pos_embed",), SEQ_FIRST),
    *_norm((*p, "norm"), prefix + "transformer.norm"),
    *_linear((*p, "head"), prefix + "cls_head"),
  ]
  for layer in range(depth):
    t = f"{prefix}transformer.layers.{layer}."
    a = f"{tied_prefix}layers.{layer}." if tied_prefix is not None else None
    block = (*p, f"block_{layer}")
    tied = lambda ours, name, alt, _a=a, _t=t: _linear(ours, _t + name, *([_a + alt] if _a else []))
    entries += [
      *_norm((*block, "ln1"), t + "norm1"),
      *_norm((*block, "ln2"), t + "norm2"),
      *tied((*block, "attn", "qkv"), "attention.linear_qkv", "cnn_block.mhsa.linear_qkv"),
      *tied((*block, "attn", "out"), "attention.linear_out", "cnn_block.mhsa.linear_out"),
      *tied((*block, "mlp", "fc1"), "mlp.linear1", "mlp_block.linear1"),
      *tied((*block, "mlp", "fc2"), "mlp.linear2", "mlp_block.linear2"),
    ]
  return entries


STEMS = ("res_like", "vit_like")  # The official input projections.
CONV_BLOCKS = ("conv_sl", "many_head")  # The official standalone CONV blocks.


def agent_entries(
  depth: int,
  num_taps: int,
  *,
  shared: bool,
  stem: str,
  conv_block: str,
  prefix: str = "",
  stats: bool = True,
) -> list[Entry]:
  """The official agent's tensors; a shared agent has no CONV/MLP weights of its own."""
  p = ("params",)
  name = prefix + "input_proj"
  if stem == "res_like":  # conv1 (no bias), BN, conv2.
    entries = _conv((*p, "stem", "conv1"), name + ".conv1", bias=False)
    entries += _bn(("stem", "bn"), name + ".norm", stats)
    entries += _conv((*p, "stem", "conv2"), name + ".conv2")
  else:  # vit_like: one patch conv named `input_proj`.
    entries = _conv((*p, "stem", "conv"), name)
  for layer in range(depth):
    name = f"{prefix}layers.{layer}"
    block = f"block_{layer}"
    entries += _bn((block, "bn1"), name + ".norm1", stats)
    entries += _bn((block, "bn2"), name + ".norm2", stats)
    if shared:
      continue
    conv = name + ".cnn_block"
    if conv_block == "conv_sl":
      entries += [
        Entry((*p, block, "conv_taps"), (conv + ".conv.weight",), conv_sl_layout(num_taps)),
        Entry((*p, block, "conv_bias"), (conv + ".conv.bias",)),
      ]
    else:
      entries += [
        Entry((*p, block, "conv_taps"), (conv + ".weight",), MANY_HEAD),
        Entry((*p, block, "conv_bias"), (conv + ".bias",)),
      ]
    for ours, theirs in (("fc1", "conv1"), ("fc2", "conv2")):
      mlp = f"{name}.mlp_block.{theirs}"
      entries += [
        Entry((*p, block, ours, "kernel"), (mlp + ".weight",), CONV_1X1),
        Entry((*p, block, ours, "bias"), (mlp + ".bias",)),
      ]
  entries += _bn(("head_bn",), prefix + "bn", stats)
  entries += _linear((*p, "head"), prefix + "linear")
  return entries


def vit_params(r: _Reader, depth: int, prefix: str = "", tied_prefix: str | None = None) -> Tree:
  """The ViT's parameter subtree read from `r`."""
  return read_entries(r, vit_entries(depth, prefix, tied_prefix))["params"]


def agent_variables(
  r: _Reader, depth: int, num_taps: int, *, shared: bool, prefix: str = "", stats: bool = True
) -> tuple[Tree, Tree]:
  """(params, batch_stats) of the agent; its stem and CONV block are told by the keys present."""
  stem = "res_like" if r.has(prefix + "input_proj.conv1.weight") else "vit_like"
  conv_block = "conv_sl" if r.has(prefix + "layers.0.cnn_block.conv.weight") else "many_head"
  entries = agent_entries(
    depth, num_taps, shared=shared, stem=stem, conv_block=conv_block, prefix=prefix, stats=stats
  )
  variables = read_entries(r, entries)
  return variables["params"], variables.get("batch_stats", {})


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


def export_vit(vit: Tree, depth: int) -> dict[str, np.ndarray]:
  """Our ViT parameters -> the official `vit` state_dict."""
  return write_entries({"params": vit}, vit_entries(depth))


def conv_block_for(num_taps: int) -> str:
  """The official CONV that holds our taps: a Conv_SL (a 3x3 conv, Agent-S) where they fill the
  3x3 window, else a Conv_ManyHead (Agent-B's 6 heads)."""
  return "conv_sl" if num_taps == 9 else "many_head"


def export_agent(
  params: Tree, batch_stats: Tree, depth: int, num_taps: int, *, stem: str, batches: int = 0
) -> dict[str, np.ndarray]:
  """Our standalone (or joint) agent -> the official `cnn` state_dict."""
  entries = agent_entries(
    depth, num_taps, shared=False, stem=stem, conv_block=conv_block_for(num_taps)
  )
  return write_entries({"params": params, "batch_stats": batch_stats}, entries, batches)


def export_shared(
  vit: Tree,
  agent: Tree,
  agent_stats: Tree,
  depth: int,
  num_heads: int,
  *,
  stem: str,
  batches: int = 0,
) -> dict[str, np.ndarray]:
  """Our shared ViT + agent -> the official `joint_model` state_dict, the tied tensors listed
  under both models' names as PyTorch lists them."""
  vit_sd = write_entries({"params": vit}, vit_entries(depth, "models.vit.", "models.cnn."))
  entries = agent_entries(
    depth, num_heads, shared=True, stem=stem, conv_block="", prefix="models.cnn."
  )
  agent_sd = write_entries({"params": agent, "batch_stats": agent_stats}, entries, batches)
  return {**vit_sd, **agent_sd}
