r"""Quickstart: a small ViT + agent on 32-px CIFAR-10, shared mode, minutes on a laptop CPU.

Command (tfds `cifar10`, downloaded on first use into ~/tensorflow_datasets or $TFDS_DATA_DIR):
  python -m vitboot_jax.main --config=configs/quickstart.py --workdir=workdirs/quickstart
An image folder of CIFAR-10 instead (`ROOT/{train,test}/<class>/*.jpg`; what CI uses):
  ... --config.data.name=folder --config.data.dir=ROOT

Model: ViT 144-d, 6 layers, 9 heads, patch 4 (8x8 tokens); agent with the small 32-px stem
(16x16) down-sampling after block 0. 10% of the training set per class (5,000 images), batch 64.
Args: mode=shared|joint|vit|agent (default shared), epochs=N (default 5), and the method switches
of configs/common.py.
Time and results: docs/results.md.
"""

from configs import common
from vitboot_jax import configlib


def get_config(arg=None):
  return from_args(common.parse_arg(arg, mode="shared", epochs=5, **common.SWITCHES))


def from_args(arg):
  """The quickstart's config from parsed args (mode, epochs and the switches): configs/
  image_folder.py builds on it."""
  c = configlib.base_config()
  c.mode = arg.mode
  c.data.update(common.cifar10_32px())
  c.image_size = 32
  c.batch_size = 64
  c.num_epochs = arg.epochs
  c.checkpoint_every_steps = 200
  # Two evaluations (after epochs 3 and 5) keep the first run short; the replication tables
  # evaluate every epoch for their curves.
  c.eval_every_epochs = 3
  c.log_every_steps = 20

  # ViT: 144 wide, 6 layers, 9 heads (the full 3x3 CONV window), patch 4 (8x8 tokens).
  c.model.name = "vit_cpu"
  c.model.patch_size = 4
  c.model.embed_dim = 144
  c.model.depth = 6
  c.model.num_heads = 9
  c.model.mlp_dim = 288
  c.model.dropout = 0.0
  c.model.ln_eps = 1e-5

  # Agent: the small 32-px stem (16x16), down-sampling to the 8x8 token grid after block 0.
  c.agent.stem = "small"
  c.agent.stem_channels = 64
  c.agent.pre_norm = True
  c.agent.downsample_after = (0,)
  # Alone and joint: the standalone agent's dropout; shared: the ViT's (the blocks are shared).
  c.agent.mlp_dropout = 0.1 if arg.mode in ("agent", "joint") else 0.0
  c.agent.residual_dropout = 0.0

  c.loss.update(common.loss_weights(arg.mode))  # The official weights of the mode.

  # The paper's recipe: AdamW on every leaf, per-epoch cosine, no warmup.
  c.optim.name = "adamw"
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.optim.decay_all = True
  c.optim.schedule = "cosine_epoch"
  c.optim.warmup_epochs = 0.0
  # The official single-model worker clips at 0.1; the mutual workers' clipping is a no-op and
  # the SAM worker ignores it.
  c.optim.clip_norm = 0.1 if arg.mode == "vit" and not arg.sam else 0.0

  common.switches(c, arg)
  return c
