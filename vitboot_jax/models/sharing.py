"""The sharing contract of mode "shared": which ViT entries the agent reads, and how.

Agent block l reads the ViT's block l (`vit_params[block_name(l)]`): its CONV tap h is
W_V^h W_O^h, from the V columns of `attn/qkv/kernel` (`value_kernel`) and `attn/out/kernel`
(the agent applies the two in turn, models/agent.shared_conv; `shared_taps` forms the
products), its CONV bias is `attn/out/bias`, and its MLP is `mlp/fc1` and `mlp/fc2`.
`shared_mask` marks exactly those entries; the train step aligns the two models' gradients on
them (align.combine). The names below are the ViT's (models/vit.py); a rename there must be made
here, and tests/test_models.py checks that the mask and what the agent reads agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

BLOCK_PREFIX = "block_"
ATTENTION = "attn"
QKV = "qkv"
OUT = "out"
MLP = "mlp"
MLP_IN = "fc1"
MLP_OUT = "fc2"


def block_name(layer: int) -> str:
  """The ViT's (and agent's) parameter subtree of block `layer`."""
  return f"{BLOCK_PREFIX}{layer}"


def shared_block(vit_params: Mapping[str, Any], layer: int) -> Mapping[str, Any]:
  """What agent block `layer` reads of the ViT's parameters: {"attn": ..., "mlp": ...}."""
  block = vit_params[block_name(layer)]
  return {"attn": block[ATTENTION], "mlp": block[MLP]}


def shared_taps(qkv_kernel: jax.Array, out_kernel: jax.Array, num_heads: int) -> jax.Array:
  """Tap h = (W_V^h W_O^h) in Flax [in, out] layout, from the ViT's live kernels: [H, D, D]."""
  d = out_kernel.shape[0]
  w_v = value_kernel(qkv_kernel).reshape(d, num_heads, d // num_heads)  # [in, head, d_k]
  w_o = out_kernel.reshape(num_heads, d // num_heads, d)  # [head, d_k, out]
  return jnp.einsum("ihk,hko->hio", w_v, w_o)


def value_kernel(qkv_kernel: jax.Array) -> jax.Array:
  """W_V, the V columns of the fused [Q | K | V] kernel: [D, D], head-major columns."""
  return qkv_kernel[:, 2 * qkv_kernel.shape[0] :]


def shared_mask(params: dict[str, Any]) -> dict[str, Any]:
  """1.0 where both models read a parameter entry, 0.0 elsewhere (broadcastable per leaf).

  Shared: the V columns of each block's qkv kernel, the out projection (kernel and bias) and
  both MLP layers. Not shared: Q/K columns, b_V (the CONV ignores it), norms, embeddings, heads
  and everything the agent owns. `params` is the whole tree of a shared-mode ModelSet.
  """

  def mask_for(path, leaf):
    keys = [getattr(p, "key", None) for p in path]
    off = jnp.zeros((1,) * leaf.ndim, jnp.float32)
    if keys[0] != "vit" or not str(keys[1]).startswith(BLOCK_PREFIX):
      return off
    if keys[2] == MLP or (keys[2] == ATTENTION and keys[3] == OUT):
      return jnp.ones((1,) * leaf.ndim, jnp.float32)
    if keys[2] == ATTENTION and keys[3] == QKV and keys[4] == "kernel":
      d = leaf.shape[0]
      return jnp.concatenate([jnp.zeros((1, 2 * d)), jnp.ones((1, d))], axis=1)
    return off

  return jax.tree_util.tree_map_with_path(mask_for, params)
