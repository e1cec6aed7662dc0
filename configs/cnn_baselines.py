r"""The paper's CNN baselines trained from scratch: ResNet-50 and EfficientNet-B2 (Table 1, 3).

Args: model=resnet50|efficientnet_b2 (default resnet50), dataset=cifar10|cifar100|imagenet
(default cifar100), subset=0.05|0.1|0.5 (ImageNet only, default 0.1).

Command:
  python -m vitboot_jax.main --config=configs/cnn_baselines.py:model=resnet50,dataset=cifar100 \
    --workdir=workdirs/resnet50_c100

Official recipe: 224 px, batch 64, 240 epochs, SGD lr 0.05, wd 5e-4, NO momentum (the official
configs leave it at torch's default 0; --config.optim.momentum=0.9 is one switch away), cosine
per epoch. EfficientNet-B2 runs without dropout/drop-path, as the official timm call.
Parameters (10 classes): ResNet-50 23,528,522; EfficientNet-B2 7,715,084.
Expected final-epoch top-1 (paper, CIFAR-10 / CIFAR-100): ResNet50 94.92 / 77.57;
EfficientNet-B2 94.14 / 75.55. ImageNet 5% / 10% / 50%: ResNet50 35.43 / 50.86 / 70.05.
"""

from vitboot_jax import configlib


def get_config(arg=None):
  args = configlib.parse_arg(arg)
  c = configlib.base_config()
  configlib.set_dataset(c, args.get("dataset", "cifar100"), float(args.get("subset", 0.1)))
  configlib.set_mode(c, "cnn")
  c.cnn.name = args.get("model", "resnet50")
  return c
