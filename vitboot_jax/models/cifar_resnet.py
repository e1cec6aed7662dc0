"""He et al. 2016's CIFAR ResNets (the 6n+2 family): a CNN trained at 32 px, alone or as a teacher.

3x3 conv to 16 channels, three stages of n basic blocks at 16, 32 and 64 channels (32, 16 and 8
px at 32-px input; stride 2 at the first block of stages 2 and 3), global average pool, Linear
head. Shortcuts are the paper's option A (its CIFAR choice): the identity, and where the shape
changes the input subsampled by 2 and zero-padded in channels, so no shortcut has parameters.
That gives the paper's counts: ResNet-20 269,722 (0.27M) and ResNet-56 853,018 (0.85M) at 10
classes; ResNet-32 464,154 (0.46M). MACs per 32-px image (models/costs.py): forward 40.55M,
68.86M, 125.49M; a train step (tools/perf/benchmark.step_macs) 121.21M for ResNet-20 and 376.01M
for ResNet-56, three times the forward.

Convolutions take Kaiming-normal (fan_out) weights and BatchNorm scale 1 / bias 0 as the usual
PyTorch CIFAR ResNets do; the Linear layer keeps PyTorch's default, as resnet.py's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from vitboot_jax.models.kernels import XLA, Kernels
from vitboot_jax.models.resnet import classifier, conv_and_norm

# Blocks per stage n of ResNet-(6n+2).
DEPTHS = {"resnet20": 3, "resnet32": 5, "resnet56": 9}
STAGE_WIDTHS = (16, 32, 64)


class BasicBlock(nn.Module):
  """3x3 (strided) -> 3x3, BN after each conv, the option-A shortcut added before the last ReLU."""

  width: int
  stride: int = 1
  bn_momentum: float = 0.9  # Flax momentum = 1 - PyTorch momentum (0.1).
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
    same = ((1, 1), (1, 1))
    s = (self.stride, self.stride)
    y = nn.relu(bn(name="bn1")(conv(self.width, (3, 3), strides=s, padding=same, name="conv1")(x)))
    y = bn(name="bn2")(conv(self.width, (3, 3), padding=same, name="conv2")(y))
    shortcut = x[:, :: self.stride, :: self.stride]
    extra = self.width - x.shape[-1]
    if extra:  # Option A: the new channels are zeros, half on each side (no parameters).
      shortcut = jnp.pad(shortcut, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
    return nn.relu(y + shortcut)


class CifarResNet(nn.Module):
  """ResNet-(6n+2) for 32-px images; returns `(logits, out)` like resnet.ResNet.

  `out["features"]` holds the three stage outputs (NHWC, strides 1, 2, 4) and `out["pre_logits"]`
  the globally pooled final features.
  """

  num_classes: int
  blocks_per_stage: int = 3
  bn_momentum: float = 0.9
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
    x = conv(STAGE_WIDTHS[0], (3, 3), padding=((1, 1), (1, 1)), name="conv1")(
      images.astype(self.dtype)
    )
    x = nn.relu(bn(name="bn1")(x))
    features = []
    for stage, width in enumerate(STAGE_WIDTHS):
      for block in range(self.blocks_per_stage):
        x = BasicBlock(
          width=width,
          stride=2 if stage > 0 and block == 0 else 1,
          bn_momentum=self.bn_momentum,
          bn_eps=self.bn_eps,
          dtype=self.dtype,
          kernels=self.kernels,
          name=f"layer{stage + 1}_{block}",
        )(x, train=train)
      features.append(x)
    logits, pre_logits = classifier(x, self.num_classes, self.dtype)
    return logits, {"features": tuple(features), "pre_logits": pre_logits}


def cifar_resnet(
  name: str, num_classes: int, dtype: Any = jnp.float32, *, kernels: Kernels = XLA
) -> CifarResNet:
  """ResNet-20, -32 or -56 by `name` (a key of DEPTHS)."""
  return CifarResNet(
    num_classes=num_classes, blocks_per_stage=DEPTHS[name], dtype=dtype, kernels=kernels
  )
