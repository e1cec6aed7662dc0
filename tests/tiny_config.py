r"""Unit/end-to-end test model: a 36-d, 2-layer ViT and its agent at 32 px. Not for results.

Args: mode= (default shared), data= (default folder), classes= (default 10) and the method
switches of configs/common.py.
"""

from configs import common
from vitboot_jax import configlib


def get_config(arg=None):
  arg = common.parse_arg(arg, mode="shared", data="folder", classes=10, **common.SWITCHES)
  c = configlib.base_config()
  c.mode = arg.mode
  c.data.name = arg.data
  c.data.num_classes = arg.classes
  c.data.augment = "cifar"
  c.data.normalisation = "cifar10"
  c.data.shuffle_buffer = 256
  c.data.eval_batch_size = 32
  c.image_size = 32
  c.batch_size = 16
  c.num_epochs = 1
  c.log_every_steps = 1
  c.checkpoint_every_steps = 4

  # ViT "vit_tiny": 36 wide, 2 layers, 9 heads, patch 8 (4x4 tokens).
  c.model.name = "vit_tiny"
  c.model.patch_size = 8
  c.model.embed_dim = 36
  c.model.depth = 2
  c.model.num_heads = 9
  c.model.mlp_dim = 72
  c.model.dropout = 0.0
  c.model.ln_eps = 1e-5

  # Agent: the small 32-px stem, down-sampling to the token grid after block 0.
  c.agent.stem = "small"
  c.agent.stem_channels = 64
  c.agent.pre_norm = True
  c.agent.downsample_after = (0,)
  c.agent.mlp_dropout = 0.1 if arg.mode in ("agent", "joint") else 0.0
  c.agent.residual_dropout = 0.0

  c.loss.update(common.loss_weights(arg.mode))  # The official weights of the mode.

  c.optim.name = "adamw"
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.optim.decay_all = True
  c.optim.schedule = "cosine_epoch"
  c.optim.warmup_epochs = 0.0
  c.optim.clip_norm = 0.1 if arg.mode == "vit" and not arg.sam else 0.0
  if arg.mode == "cnn":
    c.cnn.name = "resnet50"
    c.optim.update(name="sgd", lr=0.05, weight_decay=5e-4, momentum=0.0)

  common.switches(c, arg)
  return c
