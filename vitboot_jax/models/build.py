"""Builds the models of a config and applies them as one unit over one parameter tree.

Variables are `{"params": {"vit": ..., "agent": ...}, "batch_stats": {"agent": ...}}` with only
the models the mode trains. In shared mode the agent's apply reads `params["vit"]` directly, so
gradients of the agent's loss land on the ViT's leaves without any copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vitboot_jax import configlib
from vitboot_jax.models.agent import Agent
from vitboot_jax.models.vit import ViT


def build_vit(config: ml_collections.ConfigDict, dtype: Any = jnp.float32) -> ViT:
  m = config.model
  return ViT(
    num_classes=config.data.num_classes,
    patch_size=m.patch_size,
    embed_dim=m.embed_dim,
    depth=m.depth,
    num_heads=m.num_heads,
    mlp_dim=m.mlp_dim,
    dropout=m.dropout,
    ln_eps=m.ln_eps,
    init_scheme=m.init,
    dtype=dtype,
    attention=m.attention,
  )


def build_agent(config: ml_collections.ConfigDict, *, shared: bool, dtype: Any = jnp.float32):
  m, a = config.model, config.agent
  return Agent(
    num_classes=config.data.num_classes,
    embed_dim=m.embed_dim,
    depth=m.depth,
    num_heads=m.num_heads,
    mlp_dim=m.mlp_dim,
    stem=a.stem,
    stem_channels=a.stem_channels,
    patch_size=m.patch_size,
    pre_norm=a.pre_norm,
    downsample_after=tuple(a.downsample_after),
    taps=a.taps,
    mlp_dropout=a.mlp_dropout,
    residual_dropout=a.residual_dropout,
    bn_momentum=a.bn_momentum,
    bn_eps=a.bn_eps,
    init_scheme=a.init,
    shared=shared,
    dtype=dtype,
  )


@dataclasses.dataclass(frozen=True)
class ModelSet:
  """The models one mode trains; `names` is ("vit",), ("agent",) or ("vit", "agent")."""

  mode: str
  vit: ViT | None
  agent: Agent | None

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(n for n in ("vit", "agent") if getattr(self, n) is not None)

  @property
  def shared(self) -> bool:
    return self.mode == "shared"

  def init(self, rng: jax.Array, images: jax.Array) -> dict[str, Any]:
    """Initial variables for a batch shaped like `images` (NHWC)."""
    params, batch_stats = {}, {}
    vit_rng, agent_rng = jax.random.split(rng)
    if self.vit is not None:
      params["vit"] = self.vit.init(vit_rng, images, train=False)["params"]
    if self.agent is not None:
      shared = params["vit"] if self.shared else None
      variables = self.agent.init(agent_rng, images, train=False, vit_params=shared)
      params["agent"] = variables.get("params", {})
      batch_stats["agent"] = variables["batch_stats"]
    return {"params": params, "batch_stats": batch_stats}

  def apply(
    self,
    variables: dict[str, Any],
    images: jax.Array,
    *,
    train: bool,
    rng: jax.Array | None = None,
    names: tuple[str, ...] | None = None,
  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Returns ({name: (logits, out)}, new batch_stats): one forward of each model in `names`
    (default: all)."""
    names = self.names if names is None else names
    params, batch_stats = variables["params"], variables.get("batch_stats", {})
    outputs, new_stats = {}, dict(batch_stats)
    rngs = {}
    if train and rng is not None:
      vit_rng, agent_rng = jax.random.split(rng)
      rngs = {"vit": {"dropout": vit_rng}, "agent": {"dropout": agent_rng}}
    if "vit" in names:
      outputs["vit"] = self.vit.apply(
        {"params": params["vit"]}, images, train=train, rngs=rngs.get("vit")
      )
    if "agent" in names:
      agent_vars = {"params": params["agent"], "batch_stats": batch_stats["agent"]}
      shared = params["vit"] if self.shared else None
      if train:
        outputs["agent"], mutated = self.agent.apply(
          agent_vars,
          images,
          train=True,
          vit_params=shared,
          rngs=rngs.get("agent"),
          mutable=["batch_stats"],
        )
        new_stats["agent"] = mutated["batch_stats"]
      else:
        outputs["agent"] = self.agent.apply(agent_vars, images, train=False, vit_params=shared)
    return outputs, new_stats

  def shared_mask(self, params: dict[str, Any]) -> dict[str, Any]:
    """1.0 where both models read a parameter entry, 0.0 elsewhere (broadcastable per leaf).

    Shared: the V columns of each block's qkv kernel, the out projection (kernel and bias) and
    both MLP layers. Not shared: Q/K columns, b_V (the CONV ignores it), norms, embeddings, heads
    and everything the agent owns.
    """

    def mask_for(path, leaf):
      keys = [getattr(p, "key", None) for p in path]
      if not self.shared or keys[0] != "vit" or not str(keys[1]).startswith("block_"):
        return jnp.zeros((1,) * leaf.ndim, jnp.float32)
      if keys[2] == "mlp" or (keys[2] == "attn" and keys[3] == "out"):
        return jnp.ones((1,) * leaf.ndim, jnp.float32)
      if keys[2] == "attn" and keys[3] == "qkv" and keys[4] == "kernel":
        d = leaf.shape[0]
        return jnp.concatenate([jnp.zeros((1, 2 * d)), jnp.ones((1, d))], axis=1)
      return jnp.zeros((1,) * leaf.ndim, jnp.float32)

    return jax.tree_util.tree_map_with_path(mask_for, params)


def build_models(config: ml_collections.ConfigDict) -> ModelSet:
  """The models of `config.mode`: vit, agent, or both (joint: independent; shared: tied)."""
  configlib.validate(config)
  dtype = jnp.dtype(config.get("compute_dtype", "float32"))
  mode = config.mode
  vit = build_vit(config, dtype) if mode in ("vit", "joint", "shared") else None
  agent = build_agent(config, shared=mode == "shared", dtype=dtype) if mode != "vit" else None
  return ModelSet(mode=mode, vit=vit, agent=agent)
