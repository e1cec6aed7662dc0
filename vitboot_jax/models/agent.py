"""The agent CNN: the ViT's blocks with MHSA replaced by a generalised convolution (CONV).

CONV has one kernel tap per attention head: y_i = sum_h W_h x_{i + delta_h} + b. We compute it as
one real convolution over a k x k kernel assembled from the tap matrices (zeros at unused
positions), never with the dense n x n selection matrices of the official code.

In shared mode the agent owns only its stem, its BatchNorms and its head. Its CONV (taps
W_V^h W_O^h, bias b_O; computed in factored form by `shared_conv`) and its MLP are read from the
ViT's parameter subtree, passed to `__call__` as `vit_params`: one parameter tree, no copy, no
synchronisation step. What it reads there, and under which names, is models/sharing.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from vitboot_jax.models import common, sharing
from vitboot_jax.models.kernels import XLA, Kernels


@functools.cache
def tap_positions(
  num_taps: int, scheme: str = "official"
) -> tuple[int, tuple[tuple[int, int], ...]]:
  """Returns (k, positions): the window size and the (row, col) of each tap inside it.

  "official": the first `num_taps` raster positions of the ceil(sqrt(H)) window; the official
  code asserts that window is odd (H=6 keeps only the top two rows). "centered": the H positions
  nearest the centre of the smallest odd window that holds them (ties in raster order), listed in
  raster order, so any head count works; for H = 1, 9, 25 it equals "official".
  """
  if num_taps < 1:
    raise ValueError(f"the agent needs at least one tap (head), got {num_taps}")
  if scheme == "official":
    k = math.ceil(math.sqrt(num_taps))
    if k % 2 == 0:
      raise ValueError(
        f"config.agent.taps='official' needs an odd window ceil(sqrt(heads)), but {num_taps} "
        "heads give an even window (the official code crashes here); use "
        "--config.agent.taps=centered"
      )
    raster = [(r, c) for r in range(k) for c in range(k)]
    return k, tuple(raster[:num_taps])
  # "centered": configlib.validate checked the config's choice.
  k = math.ceil(math.sqrt(num_taps))
  k += 1 - k % 2
  centre = (k - 1) / 2
  raster = [(r, c) for r in range(k) for c in range(k)]
  by_distance = sorted(
    range(k * k), key=lambda i: ((raster[i][0] - centre) ** 2 + (raster[i][1] - centre) ** 2, i)
  )
  return k, tuple(raster[i] for i in sorted(by_distance[:num_taps]))


def generalised_conv(
  x: jax.Array,
  taps: jax.Array,
  bias: jax.Array | None,
  *,
  scheme: str = "official",
  kernels: Kernels = XLA,
) -> jax.Array:
  """CONV on an NHWC map: stride 1, zero padding, tap h at positions[h] of the window."""
  k, positions = tap_positions(taps.shape[0], scheme)
  pad = (k - 1) // 2
  y = kernels.taps_conv(x, taps.astype(x.dtype), positions, k, ((pad, pad), (pad, pad)))
  return y if bias is None else y + bias.astype(y.dtype)


def shared_conv(
  x: jax.Array,
  w_v: jax.Array,
  w_o: jax.Array,
  bias: jax.Array,
  *,
  num_heads: int,
  scheme: str = "official",
  kernels: Kernels = XLA,
) -> jax.Array:
  """The shared agent's CONV, whose tap h is W_V^h W_O^h, in factored form.

  The value heads x W_V, each shifted to its tap's position (zero padding), then the output
  projection: the order of the official code's SharedConv (values, selection, W_O), and equal
  to `generalised_conv` over the product taps with 2 D^2 instead of H D^2 multiplies per pixel.
  """
  k, positions = tap_positions(num_heads, scheme)
  values = kernels.einsum("...k,kn->...n", x, w_v.astype(x.dtype))
  shifted = shift_heads(values, positions, (k - 1) // 2)
  y = kernels.einsum("...k,kn->...n", shifted, w_o.astype(x.dtype))
  return y + bias.astype(y.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def shift_heads(values: jax.Array, positions: tuple[tuple[int, int], ...], pad: int) -> jax.Array:
  """Moves head h's channels of an NHWC map to tap positions[h] of a window padded by `pad`.

  out[:, i, j, head h] = values[:, i + r_h - pad, j + c_h - pad, head h], zero outside. Its
  adjoint is the same shift with mirrored positions, which the custom VJP uses: autodiff's
  transpose of the pad-slice-concatenate form compiles to a far slower fusion on XLA:CPU.
  """
  _, height, width, d = values.shape
  d_k = d // len(positions)
  padded = jnp.pad(values, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  return jnp.concatenate(
    [
      padded[:, r : r + height, c : c + width, h * d_k : (h + 1) * d_k]
      for h, (r, c) in enumerate(positions)
    ],
    axis=-1,
  )


def _shift_heads_fwd(values, positions, pad):
  return shift_heads(values, positions, pad), None


def _shift_heads_bwd(positions, pad, _, cotangent):
  mirrored = tuple((2 * pad - r, 2 * pad - c) for r, c in positions)
  return (shift_heads(cotangent, mirrored, pad),)


shift_heads.defvjp(_shift_heads_fwd, _shift_heads_bwd)


def shared_dense(x: jax.Array, dense: Mapping[str, jax.Array], kernels: Kernels = XLA) -> jax.Array:
  """The ViT's Dense layer applied as a 1x1 convolution, in the agent's compute dtype."""
  kernel = dense["kernel"].astype(x.dtype)
  y = kernels.einsum("...k,kn->...n", x, kernel)
  return y + dense["bias"].astype(y.dtype)


# A flax layer class with the agent's dtype, kernels and BatchNorm mode bound by functools.partial.
ModuleDef = Any


def _inits(init: str) -> dict[str, Any]:
  if init == "official":
    return dict(
      patch=common.normal(1.0), stem_bias=common.official_bias, mlp_bias=common.official_bias
    )
  # "standard": configlib.validate checked the config's choice.
  return dict(patch=common.lecun_normal, stem_bias=common.zeros, mlp_bias=common.zeros)


class Stem(nn.Module):
  """Input projection: "res_like" (224 -> 28x28), "patch" (like the ViT), "small" (32 px -> 16),
  "small_full" (32 px -> 32: the first blocks at twice a 16x16 token grid, as res_like's 56 vs 14).
  """

  kind: str
  embed_dim: int
  patch_size: int = 16
  channels: int = 64
  init_scheme: str = "official"
  conv: ModuleDef = nn.Conv
  norm: ModuleDef = nn.BatchNorm
  kernels: Kernels = XLA

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    inits = _inits(self.init_scheme)
    if self.kind == "patch":
      p = self.patch_size
      return self.conv(
        self.embed_dim,
        (p, p),
        strides=(p, p),
        padding="VALID",
        kernel_init=inits["patch"],
        bias_init=common.zeros,
        name="conv",
      )(x)
    if self.kind == "res_like":
      k1, s1, p1 = 7, 2, 3
    else:  # "small", "small_full": configlib.validate checked the config's choice.
      k1, s1, p1 = 3, 1, 1
    s2 = 1 if self.kind == "small_full" else 2
    x = self.conv(
      self.channels,
      (k1, k1),
      strides=(s1, s1),
      padding=((p1, p1), (p1, p1)),
      use_bias=False,
      kernel_init=common.xavier_uniform,
      name="conv1",
    )(x)
    x = self.norm(name="bn")(x)
    x = self.kernels.gelu(x)
    if self.kind == "res_like":
      x = self.kernels.max_pool(x, 3, stride=2, pad=1)
    return self.conv(
      self.embed_dim,
      (3, 3),
      strides=(s2, s2),
      padding=((1, 1), (1, 1)),
      kernel_init=common.xavier_uniform,
      bias_init=inits["stem_bias"],
      name="conv2",
    )(x)


class AgentBlock(nn.Module):
  """CONV + MLP with BatchNorm, pre-norm (x + CONV(BN(x))) or post-norm (x + BN(CONV(x)))."""

  num_taps: int
  mlp_dim: int
  pre_norm: bool = True
  taps: str = "official"
  mlp_dropout: float = 0.0
  residual_dropout: float = 0.0
  drop_path: float = 0.0
  init_scheme: str = "official"
  dense: ModuleDef = nn.Dense
  norm: ModuleDef = nn.BatchNorm
  kernels: Kernels = XLA

  @nn.compact
  def __call__(
    self, x: jax.Array, *, train: bool, shared: Mapping[str, Any] | None = None
  ) -> jax.Array:
    d = x.shape[-1]
    bn = lambda name: self.norm(name=name)
    dropout = self.kernels.dropout
    drop = lambda y: common.DropPath(self.drop_path)(
      common.Dropout(self.residual_dropout, kernel=dropout)(y, deterministic=not train),
      deterministic=not train,
    )
    if shared is None:
      # Standalone / joint agent: full-rank taps; xavier with fan = D * taps as the official
      # Conv_SL (3x3 conv) and Conv_ManyHead ([D, D, H]) initialisers.
      taps = self.param("conv_taps", common.xavier_uniform, (self.num_taps, d, d))
      conv_bias = self.param("conv_bias", common.zeros, (d,))
      conv = lambda y: generalised_conv(y, taps, conv_bias, scheme=self.taps, kernels=self.kernels)
      inits = _inits(self.init_scheme)
      dense = functools.partial(
        self.dense, kernel_init=common.xavier_uniform, bias_init=inits["mlp_bias"]
      )
      fc1, fc2 = dense(self.mlp_dim, name="fc1"), dense(d, name="fc2")
    else:
      attn, mlp = shared["attn"], shared["mlp"]
      qkv, out = attn[sharing.QKV], attn[sharing.OUT]
      # b_O only; b_V is not part of the CONV (docs/reference/official_pytorch_code.md §2.6).
      conv = lambda y: shared_conv(
        y,
        sharing.value_kernel(qkv["kernel"]),
        out["kernel"],
        out["bias"],
        num_heads=self.num_taps,
        scheme=self.taps,
        kernels=self.kernels,
      )
      fc1 = lambda y: shared_dense(y, mlp[sharing.MLP_IN], self.kernels)
      fc2 = lambda y: shared_dense(y, mlp[sharing.MLP_OUT], self.kernels)

    def mlp_branch(y):
      y = self.kernels.gelu(fc1(y))
      return fc2(common.Dropout(self.mlp_dropout, kernel=dropout)(y, deterministic=not train))

    if self.pre_norm:
      x = x + drop(conv(bn("bn1")(x)))
      return x + drop(mlp_branch(bn("bn2")(x)))
    x = x + drop(bn("bn1")(conv(x)))
    return x + drop(bn("bn2")(mlp_branch(x)))


class Agent(nn.Module):
  """Returns `(logits, out)`; `out["features"][l]` is block l's NHWC output before down-sampling.

  Fields are config.agent's (`init_scheme` is its `init`: flax modules own the name `init`) and
  the ViT's shape from config.model.

  With `shared=True`, `__call__` needs `vit_params` (the ViT's `params` subtree) and the agent
  creates no CONV or MLP weights of its own.
  """

  num_classes: int
  embed_dim: int = 288
  depth: int = 6
  num_heads: int = 9  # = CONV taps.
  mlp_dim: int = 1152
  stem: str = "res_like"
  stem_channels: int = 64
  patch_size: int = 16
  pre_norm: bool = True
  downsample_after: Sequence[int] = (0, 1)
  taps: str = "official"
  mlp_dropout: float = 0.0
  residual_dropout: float = 0.0
  drop_path: float = 0.0  # Stochastic depth's rate at the last block (common.drop_path_rates).
  bn_momentum: float = 0.9
  bn_eps: float = 1e-5
  init_scheme: str = "official"
  shared: bool = False
  dtype: Any = jnp.float32
  kernels: Kernels = XLA

  @nn.compact
  def __call__(
    self, images: jax.Array, *, train: bool = False, vit_params: Mapping[str, Any] | None = None
  ):
    if self.shared and vit_params is None:
      raise ValueError("a shared agent reads the ViT's weights: pass vit_params=params['vit']")
    tap_positions(self.num_heads, self.taps)  # Fail at build time on an unsupported head count.
    norm = functools.partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=self.bn_momentum,
      epsilon=self.bn_eps,
      dtype=self.dtype,
    )
    x = Stem(
      kind=self.stem,
      embed_dim=self.embed_dim,
      patch_size=self.patch_size,
      channels=self.stem_channels,
      init_scheme=self.init_scheme,
      conv=functools.partial(
        nn.Conv, dtype=self.dtype, conv_general_dilated=self.kernels.conv_general_dilated
      ),
      norm=norm,
      kernels=self.kernels,
      name="stem",
    )(images.astype(self.dtype))
    features = []
    rates = common.drop_path_rates(self.drop_path, self.depth)
    for layer in range(self.depth):
      x = AgentBlock(
        num_taps=self.num_heads,
        mlp_dim=self.mlp_dim,
        pre_norm=self.pre_norm,
        taps=self.taps,
        mlp_dropout=self.mlp_dropout,
        residual_dropout=self.residual_dropout,
        drop_path=rates[layer],
        init_scheme=self.init_scheme,
        dense=functools.partial(nn.Dense, dtype=self.dtype, dot_general=self.kernels.dot_general),
        norm=norm,
        kernels=self.kernels,
        name=f"block_{layer}",
      )(x, train=train, shared=sharing.shared_block(vit_params, layer) if self.shared else None)
      features.append(x)
      if layer in self.downsample_after:
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    x = norm(name="head_bn")(x)
    pre_logits = jnp.mean(self.kernels.gelu(x), axis=(1, 2))
    logits = nn.Dense(
      self.num_classes,
      kernel_init=common.torch_linear_default(self.embed_dim),
      bias_init=common.torch_linear_default(self.embed_dim),
      dtype=self.dtype,
      name="head",
    )(pre_logits)
    return logits.astype(jnp.float32), {"features": tuple(features), "pre_logits": pre_logits}
