"""EfficientNet-B2, the paper's second CNN baseline, as timm's `efficientnet_b2` (not pretrained).

The official code builds it with `timm.models.efficientnet.efficientnet_b2(num_classes=C)` and no
other argument, so timm's class defaults apply: drop_rate 0 and drop_path_rate 0 (timm only
*comments* that training should use 0.3 / 0.2). Both are configurable here and default to 0.

Architecture (B0 stages scaled by width 1.1 and depth 1.2, timm rounding): 3x3/2 stem to 32
channels; MBConv stages (depthwise-separable first, then inverted residuals with expansion 6),
squeeze-excite sized from the block *input* channels (ratio 0.25), SiLU, BatchNorm; 1x1 head
conv to 1408 channels, global average pool, dropout, Linear. Padding is symmetric k // 2
(timm's default, not the TF "same" of the tf_ variants). Initialisation is timm's
`_init_weight_goog`, so the from-scratch start matches the official run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from vitboot_jax.models import common


class StageDef(NamedTuple):
  """One row of timm's arch_def: 'ds'/'ir', repeats, kernel, first stride, expansion, channels."""

  block: str
  repeats: int
  kernel: int
  stride: int
  expand_ratio: int
  out_chs: int
  se_ratio: float = 0.25


# timm `_gen_efficientnet` arch_def (the EfficientNet-B0 baseline before scaling).
B0_STAGES: tuple[StageDef, ...] = (
  StageDef("ds", 1, 3, 1, 1, 16),
  StageDef("ir", 2, 3, 2, 6, 24),
  StageDef("ir", 2, 5, 2, 6, 40),
  StageDef("ir", 3, 3, 2, 6, 80),
  StageDef("ir", 3, 5, 1, 6, 112),
  StageDef("ir", 4, 5, 2, 6, 192),
  StageDef("ir", 1, 3, 1, 6, 320),
)


def make_divisible(v: float, divisor: int = 8, round_limit: float = 0.9) -> int:
  """timm's make_divisible: nearest multiple of `divisor`, never more than 10% below `v`."""
  new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
  if new_v < round_limit * v:
    new_v += divisor
  return new_v


def round_channels(channels: int, multiplier: float = 1.0, divisor: int = 8) -> int:
  """timm's round_channels: scale by the width multiplier, then make divisible by 8."""
  return make_divisible(channels * multiplier, divisor) if multiplier else channels


def round_repeats(repeats: int, depth_multiplier: float) -> int:
  """timm's depth scaling for a single-block-type stage: ceil (depth_trunc='ceil')."""
  return int(math.ceil(repeats * depth_multiplier))


def goog_conv_init(groups: int = 1) -> common.Initializer:
  """timm `_init_weight_goog` for convs: N(0, 2 / fan_out), fan_out = k*k*out / groups.

  Flax's variance_scaling would count a depthwise kernel's fan_out as k*k*C; timm (and TF) use
  k*k, hence a hand-written initialiser.
  """

  def init(key, shape, dtype=jnp.float32):
    fan_out = shape[0] * shape[1] * shape[-1] // groups
    return jax.random.normal(key, shape, dtype) * math.sqrt(2.0 / fan_out)

  return init


class SqueezeExcite(nn.Module):
  """Global pool -> 1x1 reduce (+bias) -> SiLU -> 1x1 expand (+bias) -> sigmoid gate."""

  reduced_chs: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    chs = x.shape[-1]
    s = jnp.mean(x, axis=(1, 2), keepdims=True)
    s = nn.Conv(
      self.reduced_chs,
      (1, 1),
      kernel_init=goog_conv_init(),
      bias_init=nn.initializers.zeros,
      dtype=self.dtype,
      name="conv_reduce",
    )(s)
    s = nn.silu(s)
    s = nn.Conv(
      chs,
      (1, 1),
      kernel_init=goog_conv_init(),
      bias_init=nn.initializers.zeros,
      dtype=self.dtype,
      name="conv_expand",
    )(s)
    return x * nn.sigmoid(s)


class MBConv(nn.Module):
  """timm's DepthwiseSeparableConv (expand_ratio 1) or InvertedResidual (expand_ratio > 1).

  Sub-module names follow timm's (`conv_pw`, `bn1`, `conv_dw`, ...) so a timm state dict maps
  one to one. The residual (with drop-path) is used when stride is 1 and channels match.
  """

  out_chs: int
  kernel: int
  stride: int = 1
  expand_ratio: int = 1
  se_ratio: float = 0.25
  drop_path: float = 0.0
  bn_momentum: float = 0.9
  bn_eps: float = 1e-5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    in_chs = x.shape[-1]
    bn = functools.partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=self.bn_momentum,
      epsilon=self.bn_eps,
      dtype=self.dtype,
    )
    pointwise = lambda chs, name: nn.Conv(
      chs, (1, 1), use_bias=False, kernel_init=goog_conv_init(), dtype=self.dtype, name=name
    )
    # timm builds SE from the expanded width with ratio se_ratio / expand_ratio, i.e. from the
    # block input: round(in_chs * 0.25).
    se = SqueezeExcite(max(1, round(in_chs * self.se_ratio)), self.dtype, name="se")
    pad = self.kernel // 2

    def depthwise(y, name):
      chs = y.shape[-1]
      return nn.Conv(
        chs,
        (self.kernel, self.kernel),
        strides=(self.stride, self.stride),
        padding=((pad, pad), (pad, pad)),
        feature_group_count=chs,
        use_bias=False,
        kernel_init=goog_conv_init(groups=chs),
        dtype=self.dtype,
        name=name,
      )(y)

    if self.expand_ratio == 1:
      y = nn.silu(bn(name="bn1")(depthwise(x, "conv_dw")))
      y = se(y)
      y = bn(name="bn2")(pointwise(self.out_chs, "conv_pw")(y))
    else:
      mid_chs = make_divisible(in_chs * self.expand_ratio)
      y = nn.silu(bn(name="bn1")(pointwise(mid_chs, "conv_pw")(x)))
      y = nn.silu(bn(name="bn2")(depthwise(y, "conv_dw")))
      y = se(y)
      y = bn(name="bn3")(pointwise(self.out_chs, "conv_pwl")(y))
    if self.stride == 1 and in_chs == self.out_chs:
      # Stochastic depth: drop the whole residual branch per sample, rescale by 1/keep (timm).
      y = nn.Dropout(self.drop_path, broadcast_dims=(1, 2, 3))(y, deterministic=not train)
      y = y + x
    return y


class EfficientNet(nn.Module):
  """EfficientNet with compound scaling; returns `(logits, out)` like the agent CNN.

  `out["features"]` holds the output of each of the 7 MBConv stages (NHWC) and
  `out["pre_logits"]` the pooled head features, before the classifier dropout.
  """

  num_classes: int
  width_multiplier: float = 1.0
  depth_multiplier: float = 1.0
  stages: Sequence[StageDef] = B0_STAGES
  stem_size: int = 32
  num_features: int = 1280
  drop_rate: float = 0.0
  drop_path_rate: float = 0.0
  bn_momentum: float = 0.9  # Flax momentum = 1 - PyTorch momentum (0.1).
  bn_eps: float = 1e-5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False):
    chs = functools.partial(round_channels, multiplier=self.width_multiplier)
    bn = functools.partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=self.bn_momentum,
      epsilon=self.bn_eps,
      dtype=self.dtype,
    )
    x = nn.Conv(
      chs(self.stem_size),
      (3, 3),
      strides=(2, 2),
      padding=((1, 1), (1, 1)),
      use_bias=False,
      kernel_init=goog_conv_init(),
      dtype=self.dtype,
      name="conv_stem",
    )(images.astype(self.dtype))
    x = nn.silu(bn(name="bn1")(x))

    repeats = [round_repeats(s.repeats, self.depth_multiplier) for s in self.stages]
    total_blocks, block_idx = sum(repeats), 0
    features = []
    for stage_idx, (stage, num_blocks) in enumerate(zip(self.stages, repeats)):
      for i in range(num_blocks):
        x = MBConv(
          out_chs=chs(stage.out_chs),
          kernel=stage.kernel,
          stride=stage.stride if i == 0 else 1,
          expand_ratio=stage.expand_ratio,
          se_ratio=stage.se_ratio,
          # timm: rate grows linearly with the global block index, 0 for the first block.
          drop_path=self.drop_path_rate * block_idx / total_blocks,
          bn_momentum=self.bn_momentum,
          bn_eps=self.bn_eps,
          dtype=self.dtype,
          name=f"blocks_{stage_idx}_{i}",
        )(x, train=train)
        block_idx += 1
      features.append(x)

    x = nn.Conv(
      chs(self.num_features),
      (1, 1),
      use_bias=False,
      kernel_init=goog_conv_init(),
      dtype=self.dtype,
      name="conv_head",
    )(x)
    x = nn.silu(bn(name="bn2")(x))
    pre_logits = jnp.mean(x, axis=(1, 2))
    y = nn.Dropout(self.drop_rate)(pre_logits, deterministic=not train)
    # timm `_init_weight_goog` for Linear: U(+-1/sqrt(fan_out)) weight, zero bias.
    logits = nn.Dense(
      self.num_classes,
      kernel_init=common.torch_linear_default(self.num_classes),
      bias_init=nn.initializers.zeros,
      dtype=self.dtype,
      name="classifier",
    )(y)
    return logits.astype(jnp.float32), {"features": tuple(features), "pre_logits": pre_logits}


def efficientnet_b2(
  num_classes: int,
  dtype: Any = jnp.float32,
  drop_rate: float = 0.0,
  drop_path_rate: float = 0.0,
) -> EfficientNet:
  """timm `efficientnet_b2` as the official code calls it: 7,715,084 parameters for 10 classes.

  Width 1.1, depth 1.2; the nominal resolution is 260 but the model runs at any input size
  (the paper uses 224). Pass drop_rate=0.3, drop_path_rate=0.2 for timm's suggested training
  regularisation; the official baseline used neither.
  """
  return EfficientNet(
    num_classes=num_classes,
    width_multiplier=1.1,
    depth_multiplier=1.2,
    drop_rate=drop_rate,
    drop_path_rate=drop_path_rate,
    dtype=dtype,
  )
