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
Expected top-1 (the paper's): `python -m vitboot_jax.tools.sweep --table=cifar100` (also
cifar10, imagenet).
"""

from configs import common
from vitboot_jax import configlib


def get_config(arg=None):
  arg = common.parse_arg(arg, model="resnet50", dataset="cifar100", subset=0.1)
  c = configlib.base_config()
  c.mode = "cnn"
  c.cnn.name = arg.model
  c.data.update(common.dataset(arg.dataset, arg.subset))
  c.image_size = 224
  c.batch_size = 64
  c.num_epochs = 240
  if arg.dataset == "imagenet":
    c.checkpoint_every_steps = 2000

  c.loss.update(common.loss_weights("cnn"))

  # SGD on every leaf without momentum (torch's default, as the official configs), per-epoch
  # cosine, no clipping.
  c.optim.name = "sgd"
  c.optim.lr = 0.05
  c.optim.weight_decay = 5e-4
  c.optim.decay_all = True
  c.optim.momentum = 0.0
  c.optim.schedule = "cosine_epoch"
  c.optim.warmup_epochs = 0.0
  c.optim.clip_norm = 0.0
  return c
