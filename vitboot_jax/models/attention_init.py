"""Structured attention initialisations applied after the standard ViT init (models/build.py).

Two data-free schemes that give a ViT's attention a useful shape before training
(docs/reference/related_methods.md §B, §C, §D.2-D.4):

* Mimetic (Trockman & Kolter 2023): per head W_q W_k^T ~ a1 Z1 + b1 I (attend to self) and per
  layer W_v W_o ~ a2 Z2 - b2 I, both factorised by SVD.
* Impulse (Zheng, Li & Lucey, "structured init" v2): per head, Q/K are pre-fitted so that
  softmax attention over the positional pseudo-input LN(P) reproduces the convolution matrix of
  a random k x k one-hot ("impulse") filter, i.e. a spatial shift.

mimetic_init.py and impulse_init.py implement them, attention_params.py holds what both read and
write; here: which scheme a config names (`apply_init`) and the attention maps they shape. Both
are pure functions over the ViT's own parameter tree (`params["vit"]` of the model set):
`block_{l}/attn/qkv/kernel` [D, 3D] with columns [Q | K | V], head-major inside each third, and
`block_{l}/attn/out/kernel` [D, D] with head-major rows. The model's logits are
(x W_q)(x W_k)^T / sqrt(d_k) over the pre-norm LN1 output, so W_q W_k^T is exactly the bilinear
form the methods target.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from vitboot_jax.models import attention_params, choices, impulse_init, mimetic_init
from vitboot_jax.models import vit as vit_lib
from vitboot_jax.models.attention_params import Params

SCHEMES = choices.ATTENTION_INITS


def apply_init(
  scheme: str,
  vit_params: Params,
  rng: jax.Array,
  *,
  num_heads: int,
  grid: int | tuple[int, int],
  **kwargs: Any,
) -> dict[str, Any]:
  """Applies one of `SCHEMES` to freshly initialised ViT params; kwargs go to the scheme."""
  if scheme == "mimetic":
    return mimetic_init.mimetic_init(vit_params, rng, num_heads=num_heads, grid=grid, **kwargs)
  if scheme in ("impulse3", "impulse5"):
    ks = int(scheme[len("impulse") :])
    return impulse_init.impulse_init(
      vit_params, rng, num_heads=num_heads, grid=grid, kernel_size=ks, **kwargs
    )
  # Only a direct caller gets here: build applies an attention init for these schemes alone.
  raise ValueError(
    f"config.model.init={scheme!r} is not an attention init; choose one of "
    + ", ".join(repr(s) for s in SCHEMES)
  )


def attention_maps(
  vit_params: Params,
  x_tokens: jax.Array,
  num_heads: int,
  layer: int,
  *,
  apply_ln: bool = True,
  ln_eps: float = 1e-5,
) -> jax.Array:
  """Softmax attention of block `layer` on block inputs `x_tokens` [B, T, D] or [T, D].

  Runs the ViT's own modules: LN1 (with the block's scale/bias) unless `apply_ln=False` (inputs
  already normalised), then `vit.Attention` (softmax). Returns [B, H, T, T] (or [H, T, T]).
  """
  block = vit_params[f"block_{layer}"]
  x = jnp.asarray(x_tokens, jnp.float32)
  attention_params.head_dim(x.shape[-1], num_heads)
  unbatched = x.ndim == 2
  probs = _block_attention(
    dict(block["ln1"]) if apply_ln else None,
    {"qkv": dict(block["attn"]["qkv"]), "out": dict(block["attn"]["out"])},
    x[None] if unbatched else x,
    num_heads=num_heads,
    ln_eps=ln_eps,
  )
  return probs[0] if unbatched else probs


@functools.partial(jax.jit, static_argnames=("num_heads", "ln_eps"))
def _block_attention(ln, attn, x, *, num_heads, ln_eps):
  """The ViT's own LN1 and Attention modules over the block's parameters."""
  if ln is not None:
    x = nn.LayerNorm(epsilon=ln_eps).apply({"params": ln}, x)
  return vit_lib.attention_of(vit_lib.Attention(num_heads=num_heads), {"params": attn}, x)[1]
