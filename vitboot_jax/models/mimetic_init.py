"""Mimetic attention initialisation (Trockman & Kolter 2023; docs/reference/related_methods.md
§B, §D.2): per head W_q W_k^T ~ a1 Z1 + b1 I (attend to self) and per layer W_v W_o ~ a2 Z2 - b2 I,
both factorised by SVD, over the ViT's parameter tree (attention_params.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vitboot_jax.base.errors import unknown_choice
from vitboot_jax.models import attention_params
from vitboot_jax.models.attention_params import Params


class MimeticLayer(NamedTuple):
  """One layer's mimetic factors (float32, host) and the targets they approximate."""

  wq: np.ndarray  # [H, D, r]
  wk: np.ndarray  # [H, D, r]; wq[h] @ wk[h].T = best rank-r approximation of a1[h]
  wv: np.ndarray  # [D, D]
  wo: np.ndarray  # [D, D]; wv @ wo = a2 exactly
  a1: np.ndarray  # [H, D, D] = alpha1 * Z1 + beta1 * I
  a2: np.ndarray  # [D, D] = alpha2 * Z2 - beta2 * I


@functools.partial(jax.jit, static_argnames=("dim", "num_heads", "dist"))
def _mimetic_noise(rng: jax.Array, *, dim: int, num_heads: int, dist: str):
  """Z1 [H, D, D] and Z2 [D, D] with variance 1/dim: U(+-sqrt(3/d)) (Zheng's code) or N(0, 1/d)."""
  rng_qk, rng_vo = jax.random.split(rng)
  if dist == "normal":
    draw = lambda key, shape: jax.random.normal(key, shape, jnp.float32) / math.sqrt(dim)
  else:
    bound = math.sqrt(3.0 / dim)
    draw = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -bound, bound)
  return draw(rng_qk, (num_heads, dim, dim)), draw(rng_vo, (dim, dim))


def mimetic_layer_weights(
  rng: jax.Array,
  dim: int,
  num_heads: int,
  *,
  alpha1: float = 0.7,
  beta1: float = 0.7,
  alpha2: float = 0.4,
  beta2: float = 0.4,
  dist: str = "uniform",
) -> MimeticLayer:
  """Mimetic factors for one layer; an independent Z1 per head, one full-rank Z2 per layer.

  The SVDs run in float32 numpy on the host (milliseconds at d=192, §D.2): this is a one-off
  init, and XLA's SVD takes seconds to compile per shape.
  """
  r = attention_params.head_dim(dim, num_heads)
  if dist not in ("uniform", "normal"):
    raise ValueError(unknown_choice("mimetic dist", dist, ("uniform", "normal")))
  z1, z2 = (np.asarray(z) for z in _mimetic_noise(rng, dim=dim, num_heads=num_heads, dist=dist))
  eye = np.eye(dim, dtype=np.float32)
  a1 = (alpha1 * z1 + beta1 * eye).astype(np.float32)
  u, s, vt = np.linalg.svd(a1)  # Batched over heads; singular values descending.
  root = np.sqrt(s[:, None, :r])
  wq = u[:, :, :r] * root
  wk = np.swapaxes(vt[:, :r, :], 1, 2) * root
  a2 = (alpha2 * z2 - beta2 * eye).astype(np.float32)
  u2, s2, vt2 = np.linalg.svd(a2)
  root2 = np.sqrt(s2)
  return MimeticLayer(wq, wk, u2 * root2[None, :], root2[:, None] * vt2, a1, a2)


def mimetic_init(
  vit_params: Params,
  rng: jax.Array,
  *,
  num_heads: int,
  alpha1: float = 0.7,
  beta1: float = 0.7,
  alpha2: float = 0.4,
  beta2: float = 0.4,
  dist: str = "uniform",
  pos_embed: str = "keep",
  grid: int | tuple[int, int] | None = None,
) -> dict[str, Any]:
  """Mimetic init of every block's Q/K/V/out; other params are returned unchanged.

  Layer l uses `mimetic_layer_weights(jax.random.fold_in(rng, l), ...)`. The qkv and out biases
  are zeroed (our choice, §B.2). `pos_embed="sincos"` additionally writes the fixed 2-D sin-cos
  PE into the patch rows, which is what gives mimetic attention its locality (PP^T, §B.2);
  with the default learned trunc-normal(0.02) PE the init gives almost pure self-attention.
  """
  new = dict(vit_params)
  dim = vit_params["block_0"]["attn"]["qkv"]["kernel"].shape[0]
  for layer in range(attention_params.num_layers(vit_params)):
    w = mimetic_layer_weights(
      jax.random.fold_in(rng, layer),
      dim,
      num_heads,
      alpha1=alpha1,
      beta1=beta1,
      alpha2=alpha2,
      beta2=beta2,
      dist=dist,
    )
    new = attention_params.set_qk(new, layer, w.wq, w.wk)
    attn = new[f"block_{layer}"]["attn"]
    qkv, out = dict(attn["qkv"]), dict(attn["out"])
    kernel = attention_params.host_copy(qkv["kernel"])
    kernel[:, 2 * dim :] = w.wv
    qkv["kernel"] = jnp.asarray(kernel)
    out["kernel"] = jnp.asarray(w.wo, dtype=out["kernel"].dtype)
    for p in (qkv, out):
      if "bias" in p:
        p["bias"] = jnp.zeros_like(p["bias"])
    new = attention_params.with_leaf(new, (f"block_{layer}", "attn"), dict(attn, qkv=qkv, out=out))
  return attention_params.apply_pos_embed(new, pos_embed, grid)
