"""ResNet-50, the paper's CNN baseline (Table 1/3), as the official code's cvlib `resnet50`.

cvlib's ImageNet ResNet is torchvision's: bottleneck v1.5 (the stride sits on the 3x3 conv),
7x7/2 stem + 3x3/2 max-pool, 1x1 conv + BN projection shortcuts, global average pool, Linear
head. Initialisation follows torchvision so a from-scratch run starts where the official one did:
Kaiming-normal (fan_out, ReLU gain) convolutions, BN scale 1 / bias 0, and the Linear layer left
at PyTorch's default U(+-1/sqrt(fan_in)) for weight and bias.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from vitboot_jax.models import common
from vitboot_jax.models.kernels import XLA, Kernels

# torch.nn.init.kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, 2 / (k*k*out)),
# untruncated. Flax's HWIO kernel gives fan_out = k*k*out as PyTorch does.
kaiming_normal_fan_out = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def conv_and_norm(
  *, train: bool, dtype: Any, kernels: Kernels, bn_momentum: float, bn_eps: float
) -> tuple[Callable[..., nn.Conv], Callable[..., nn.BatchNorm]]:
  """The layers every ResNet here is built from: a bias-free, Kaiming-initialised convolution
  through the injected kernels, and a BatchNorm in training or evaluation mode."""
  conv = functools.partial(
    nn.Conv,
    use_bias=False,
    kernel_init=kaiming_normal_fan_out,
    dtype=dtype,
    conv_general_dilated=kernels.conv_general_dilated,
  )
  bn = functools.partial(
    nn.BatchNorm,
    use_running_average=not train,
    momentum=bn_momentum,
    epsilon=bn_eps,
    dtype=dtype,
  )
  return conv, bn


def classifier(x: jax.Array, num_classes: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
  """(float32 logits, pre_logits): global average pool, then the Linear head "fc" at PyTorch's
  default init. Called inside a compact `__call__`, whose module owns "fc"."""
  pre_logits = jnp.mean(x, axis=(1, 2))
  fan_in = x.shape[-1]
  logits = nn.Dense(
    num_classes,
    kernel_init=common.torch_linear_default(fan_in),
    bias_init=common.torch_linear_default(fan_in),
    dtype=dtype,
    name="fc",
  )(pre_logits)
  return logits.astype(jnp.float32), pre_logits


class Bottleneck(nn.Module):
  """1x1 -> 3x3 (strided) -> 1x1 (x4), BN after each conv, projection when the shape changes."""

  width: int
  stride: int = 1
  expansion: int = 4
  zero_init_last_bn: bool = False
  bn_momentum: float = 0.9
  bn_eps: float = 1e-5
  dtype: Any = jnp.float32
  kernels: Kernels = XLA

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    conv, bn = conv_and_norm(
      train=train,
      dtype=self.dtype,
      kernels=self.kernels,
      bn_momentum=self.bn_momentum,
      bn_eps=self.bn_eps,
    )
    out_chs = self.width * self.expansion
    s = (self.stride, self.stride)
    y = nn.relu(bn(name="bn1")(conv(self.width, (1, 1), name="conv1")(x)))
    y = conv(self.width, (3, 3), strides=s, padding=((1, 1), (1, 1)), name="conv2")(y)
    y = nn.relu(bn(name="bn2")(y))
    y = conv(out_chs, (1, 1), name="conv3")(y)
    # Zero-init of the last BN (Goyal et al.) makes each block start as the identity; torchvision
    # and cvlib keep it off by default, and so do we.
    last_scale = nn.initializers.zeros if self.zero_init_last_bn else nn.initializers.ones
    y = bn(scale_init=last_scale, name="bn3")(y)
    shortcut = x
    if self.stride != 1 or x.shape[-1] != out_chs:
      shortcut = conv(out_chs, (1, 1), strides=s, name="downsample_conv")(x)
      shortcut = bn(name="downsample_bn")(shortcut)
    return nn.relu(y + shortcut)


class ResNet(nn.Module):
  """ImageNet-style bottleneck ResNet; returns `(logits, out)` like the agent CNN.

  `out["features"]` holds the four stage outputs (NHWC, strides 4, 8, 16, 32) and
  `out["pre_logits"]` the globally pooled final features.
  """

  num_classes: int
  stage_sizes: Sequence[int] = (3, 4, 6, 3)
  stem_width: int = 64
  expansion: int = 4
  zero_init_residual: bool = False
  bn_momentum: float = 0.9  # Flax momentum = 1 - PyTorch momentum (0.1).
  bn_eps: float = 1e-5
  dtype: Any = jnp.float32
  kernels: Kernels = XLA

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False):
    conv, bn = conv_and_norm(
      train=train,
      dtype=self.dtype,
      kernels=self.kernels,
      bn_momentum=self.bn_momentum,
      bn_eps=self.bn_eps,
    )
    x = conv(self.stem_width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), name="conv1")(
      images.astype(self.dtype)
    )
    x = bn(name="bn1")(x)
    x = nn.relu(x)
    # PyTorch's MaxPool2d pads with -inf, as Flax's max_pool does.
    x = self.kernels.max_pool(x, 3, stride=2, pad=1)
    features = []
    for stage, num_blocks in enumerate(self.stage_sizes):
      for block in range(num_blocks):
        x = Bottleneck(
          width=self.stem_width * 2**stage,
          stride=2 if stage > 0 and block == 0 else 1,
          expansion=self.expansion,
          zero_init_last_bn=self.zero_init_residual,
          bn_momentum=self.bn_momentum,
          bn_eps=self.bn_eps,
          dtype=self.dtype,
          kernels=self.kernels,
          name=f"layer{stage + 1}_{block}",
        )(x, train=train)
      features.append(x)
    logits, pre_logits = classifier(x, self.num_classes, self.dtype)
    return logits, {"features": tuple(features), "pre_logits": pre_logits}


def resnet50(
  num_classes: int,
  dtype: Any = jnp.float32,
  *,
  zero_init_residual: bool = False,
  kernels: Kernels = XLA,
) -> ResNet:
  """The official baseline: stages [3, 4, 6, 3], 23.53M parameters for 10 classes."""
  return ResNet(
    num_classes=num_classes,
    stage_sizes=(3, 4, 6, 3),
    zero_init_residual=zero_init_residual,
    dtype=dtype,
    kernels=kernels,
  )
