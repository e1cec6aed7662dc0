"""The paper's Vision Transformer (pre-norm, cls token, learnable position embedding).

Parameter layout is chosen so that the agent CNN can read the ViT's weights in place:
`block_{l}/attn/qkv/kernel` is [D, 3D] with columns laid out [Q | K | V], head-major inside each
third (column h*d_k + j of a third belongs to head h), exactly as the official `linear_qkv`.
The names the shared agent reads (`block_{l}`, `attn/qkv`, `attn/out`, `mlp/fc1`, `mlp/fc2`) are
spelled once in models/sharing.py; a rename here must be made there too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import einops
import jax
import jax.numpy as jnp
from flax import linen as nn

from vitboot_jax.models import common
from vitboot_jax.models.entmax import entmax_bisect
from vitboot_jax.models.kernels import XLA, Kernels


def attend(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  rows: jax.Array | None = None,
  *,
  attention: str,
  alpha: jax.Array | None,
  dropout_rate: float,
  dropout_key: jax.Array | None,
  num_rows: int = 0,
  dtype: Any = jnp.float32,
  kernels: Kernels = XLA,
) -> tuple[jax.Array, jax.Array]:
  """Attention core on [B, heads, T, d] (q already scaled): returns (output, probabilities).

  `rows` are the batch indices of these images in the whole batch of `num_rows` (attention in
  batch slices, `kernels.attention`), so the dropout mask is the one the whole batch would draw.
  """
  logits = kernels.einsum("bhqd,bhkd->bhqk", q, k)
  # Probabilities in float32 even under bf16 compute: attention logits overflow bf16 easily.
  if attention == "entmax":
    probs = entmax_bisect(logits.astype(jnp.float32), alpha, axis=-1).astype(dtype)
  else:
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)
  if dropout_key is not None:
    probs = kernels.dropout(probs, dropout_rate, dropout_key, rows, num_rows)
  return kernels.einsum("bhqk,bhkd->bhqd", probs, v), probs


def _inits(init: str, embed_dim: int, patch_fan_in: int) -> dict[str, Any]:
  """The initialisers of every ViT tensor for one scheme (docs/reference/official_pytorch_code.md
  §1.5)."""
  if init == "official":
    return dict(
      patch_kernel=common.normal(1.0),
      pos=common.normal(0.02),
      cls=common.normal(0.02),
      dense=common.xavier_uniform,
      mlp_bias=common.official_bias,
      head_kernel=common.torch_linear_default(embed_dim),
      head_bias=common.torch_linear_default(embed_dim),
    )
  # "standard": configlib.validate checked the config's choice.
  return dict(
    patch_kernel=common.lecun_normal,
    pos=nn.initializers.truncated_normal(0.02),
    cls=nn.initializers.truncated_normal(0.02),
    dense=common.xavier_uniform,
    mlp_bias=common.normal(1e-6),
    head_kernel=common.zeros,
    head_bias=common.zeros,
  )


# A flax layer class with the ViT's dtype, kernels and initialisers bound by functools.partial.
ModuleDef = Any


class Attention(nn.Module):
  """Multi-head self-attention with a fused [Q|K|V] projection.

  attention="entmax" is the paper's Sparse ViT (docs/reference/official_pytorch_code.md §1.6):
  alpha-entmax with one learnable
  alpha per layer (`entmax_alpha`, init 1.5, shared by heads, not clamped) instead of softmax.
  """

  num_heads: int
  dropout: float = 0.0
  attention: str = "softmax"
  dense: ModuleDef = nn.Dense
  kernels: Kernels = XLA

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    d = x.shape[-1]
    qkv = self.dense(3 * d, name="qkv")(x)
    # Split before the head reshape: the gradient is then one concatenation of dQ, dK, dV, not
    # three zero-padded [3, ...] stacks summed in every consumer (docs/performance.md).
    q, k, v = (
      einops.rearrange(t, "b n (h d) -> b h n d", h=self.num_heads)
      for t in jnp.split(qkv, 3, axis=-1)
    )
    q = q * (d // self.num_heads) ** -0.5
    alpha = None
    if self.attention == "entmax":
      alpha = self.param("entmax_alpha", nn.initializers.constant(1.5), (), jnp.float32)
    drop = common.Dropout(self.dropout, kernel=self.kernels.dropout)
    use_dropout = train and self.dropout > 0.0
    core = functools.partial(
      attend,
      attention=self.attention,
      alpha=alpha,
      dropout_rate=self.dropout,
      dropout_key=drop.rng() if use_dropout else None,
      num_rows=q.shape[0],
      dtype=q.dtype,
      kernels=self.kernels,
    )
    kernels = self.kernels
    fused = kernels.softmax_attention if train else kernels.inference_softmax_attention
    if self.attention == "softmax" and not use_dropout and fused is not None:
      core = lambda q, k, v, rows=None: (fused(q, k, v), None)
    out, probs = kernels.attention(core, q, k, v, train=train)
    if probs is not None:
      drop(probs, deterministic=True)  # Exposes the probabilities to capture_intermediates.
    out = einops.rearrange(out, "b h n d -> b n (h d)")
    return self.dense(d, name="out")(out)


class Mlp(nn.Module):
  """Linear -> GELU -> dropout -> Linear (the official MLP; no dropout after fc2)."""

  hidden_dim: int
  dropout: float = 0.0
  dense: ModuleDef = nn.Dense
  kernels: Kernels = XLA

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    h = self.kernels.gelu(self.dense(self.hidden_dim, name="fc1")(x))
    h = common.Dropout(self.dropout, kernel=self.kernels.dropout)(h, deterministic=not train)
    return self.dense(x.shape[-1], name="fc2")(h)


class EncoderBlock(nn.Module):
  """Pre-norm block: x + Drop(MHSA(LN(x))), then x + Drop(MLP(LN(x))); with `drop_path`, each
  branch is also dropped whole per image (stochastic depth)."""

  num_heads: int
  mlp_dim: int
  dropout: float = 0.0
  drop_path: float = 0.0
  attention: str = "softmax"
  dense: ModuleDef = nn.Dense
  mlp_dense: ModuleDef = nn.Dense  # The MLP's biases start apart from the attention's.
  norm: ModuleDef = nn.LayerNorm
  kernels: Kernels = XLA

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    drop = lambda y: common.DropPath(self.drop_path)(
      common.Dropout(self.dropout, kernel=self.kernels.dropout)(y, deterministic=not train),
      deterministic=not train,
    )
    attn = Attention(
      num_heads=self.num_heads,
      dropout=self.dropout,
      attention=self.attention,
      dense=self.dense,
      kernels=self.kernels,
      name="attn",
    )
    x = x + drop(attn(self.norm(name="ln1")(x), train=train))
    mlp = Mlp(
      hidden_dim=self.mlp_dim,
      dropout=self.dropout,
      dense=self.mlp_dense,
      kernels=self.kernels,
      name="mlp",
    )
    return x + drop(mlp(self.norm(name="ln2")(x), train=train))


class ViT(nn.Module):
  """Returns `(logits, out)`; `out["features"][l]` is block l's output [B, 1+N, D], cls first.

  Those block outputs (before the final LayerNorm) are what the official hint loss reads.
  Fields are config.model's (`init_scheme` is its `init`: flax modules own the name `init`).
  `distill_token` (a variant, DeiT's hard distillation): a second prefix token after cls with its
  own head; training returns the class head's logits and `out["dist_logits"]`, evaluation their
  mean (DeiT's test-time prediction). The features leave the token out, so every reader of
  [cls, patches] (hint, DrLoc, tools) sees the plain layout.
  """

  num_classes: int
  patch_size: int = 16
  embed_dim: int = 288
  depth: int = 6
  num_heads: int = 9
  mlp_dim: int = 1152
  dropout: float = 0.0
  drop_path: float = 0.0  # Stochastic depth's rate at the last block (common.drop_path_rates).
  ln_eps: float = 1e-5
  init_scheme: str = "official"
  dtype: Any = jnp.float32
  attention: str = "softmax"  # "softmax" | "entmax" (the paper's Sparse ViT).
  distill_token: bool = False
  kernels: Kernels = XLA

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False):
    p, d = self.patch_size, self.embed_dim
    if images.shape[1] % p or images.shape[2] % p:
      raise ValueError(
        f"image size {images.shape[1:3]} is not divisible by config.model.patch_size={p}"
      )
    inits = _inits(self.init_scheme, d, 3 * p * p)
    dense = functools.partial(
      nn.Dense,
      kernel_init=inits["dense"],
      bias_init=common.zeros,
      dtype=self.dtype,
      dot_general=self.kernels.dot_general,
    )
    norm = functools.partial(nn.LayerNorm, epsilon=self.ln_eps, dtype=self.dtype)
    x = nn.Conv(
      d,
      (p, p),
      strides=(p, p),
      padding="VALID",
      kernel_init=inits["patch_kernel"],
      bias_init=common.zeros,
      dtype=self.dtype,
      conv_general_dilated=self.kernels.conv_general_dilated,
      name="patch_embed",
    )(images.astype(self.dtype))
    x = einops.rearrange(x, "b h w d -> b (h w) d")  # Row-major patches, as torch's flatten(2).
    prefix = [self.param("cls", inits["cls"], (1, 1, d))]
    if self.distill_token:
      prefix.append(self.param("dist", inits["cls"], (1, 1, d)))
    prefix = [jnp.broadcast_to(t, (x.shape[0], 1, d)).astype(x.dtype) for t in prefix]
    x = jnp.concatenate([*prefix, x], axis=1)
    x = x + self.param("pos_embed", inits["pos"], (1, x.shape[1], d)).astype(x.dtype)
    block = functools.partial(
      EncoderBlock,
      num_heads=self.num_heads,
      mlp_dim=self.mlp_dim,
      dropout=self.dropout,
      attention=self.attention,
      dense=dense,
      mlp_dense=functools.partial(dense, bias_init=inits["mlp_bias"]),
      norm=norm,
      kernels=self.kernels,
    )
    features = []
    rates = common.drop_path_rates(self.drop_path, self.depth)
    for layer in range(self.depth):
      x = block(drop_path=rates[layer], name=f"block_{layer}")(x, train=train)
      features.append(jnp.concatenate([x[:, :1], x[:, 2:]], axis=1) if self.distill_token else x)
    x = norm(name="norm")(x)
    pre_logits = x[:, 0]
    head = functools.partial(
      dense, self.num_classes, kernel_init=inits["head_kernel"], bias_init=inits["head_bias"]
    )
    logits = head(name="head")(pre_logits).astype(jnp.float32)
    out = {"features": tuple(features), "pre_logits": pre_logits}
    if self.distill_token:
      dist_logits = head(name="head_dist")(x[:, 1]).astype(jnp.float32)
      if not train:
        return (logits + dist_logits) / 2, {**out, "cls_logits": logits}
      out["dist_logits"] = dist_logits
    return logits, out


def _attention_hook(module: nn.Module, method_name: str) -> bool:
  """The capture_intermediates filter of Attention's identity dropout over its probabilities."""
  return (
    method_name == "__call__"
    and isinstance(module, common.Dropout)
    and isinstance(module.parent, Attention)
  )


def attention_of(module: ViT | Attention, variables: Any, x: jax.Array) -> tuple[Any, Any]:
  """(output, probabilities) of a ViT or an Attention evaluated on `x`.

  The probabilities are the module's own ([B, heads, T, T]; a list per block for a ViT), read
  through its hook; a fused attention kernel has none to expose, so evaluation runs without one.
  """
  kernels = dataclasses.replace(module.kernels, inference_softmax_attention=None)
  out, state = module.clone(kernels=kernels).apply(
    variables, x, train=False, capture_intermediates=_attention_hook, mutable=["intermediates"]
  )
  probs = lambda tree: tree["Dropout_0"]["__call__"][0]
  inter = state["intermediates"]
  if isinstance(module, Attention):
    return out, probs(inter)
  return out, [probs(inter[f"block_{layer}"]["attn"]) for layer in range(module.depth)]
