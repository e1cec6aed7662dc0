r"""ViT-B (384/12/6) on ImageNet-1k subsets from scratch, the paper's Table 3.

Args (comma-separated): subset=0.05|0.1|0.5 (per-class fraction of the training set, default
0.1; 0.01 also works), mode=shared|joint|vit|agent (default shared), agent=res_like|base, and
the method switches of configs/common.py.

Command (tfds `imagenet2012` prepared in DATA_DIR; no download is attempted):
  python -m vitboot_jax.main --config=configs/vitb_imagenet.py:subset=0.1 \
    --workdir=workdirs/vitb_in10 --config.data.dir=DATA_DIR
Image-folder layout instead (root/train/<wnid>/*.JPEG, root/val/<wnid>/*.JPEG):
  ... --config.data.name=folder --config.data.dir=ROOT --config.data.eval_split=val

Official recipe: 224 px, RandomResizedCrop(scale 0.6-1) + flip, eval resize 256 / centre crop
224, batch 64, 240 epochs, AdamW 1e-3 wd 0.05, per-epoch cosine; the subset is per class, fixed by
the class index (nested: the 5% subset is inside the 10% one); the val set is always the full 50k.
Hardware/time: 10% is ~128k images, ~2.0k steps/epoch, ~480k steps; days on one GPU (not
measured here).
Expected top-1 (the paper's): `python -m vitboot_jax.tools.sweep --table=imagenet`.
"""

from configs import common
from vitboot_jax import configlib


def get_config(arg=None):
  arg = common.parse_arg(arg, mode="shared", agent="res_like", subset=0.1, **common.SWITCHES)
  c = configlib.base_config()
  c.mode = arg.mode
  c.data.update(common.imagenet(arg.subset))
  c.image_size = 224
  c.batch_size = 64
  c.num_epochs = 240
  c.checkpoint_every_steps = 2000

  # ViT-B (the paper's, DeiT-S-like): 384 wide, 12 layers, 6 heads, patch 16, no dropout.
  c.model.name = "vit_b"
  c.model.patch_size = 16
  c.model.embed_dim = 384
  c.model.depth = 12
  c.model.num_heads = 6
  c.model.mlp_dim = 1536
  c.model.dropout = 0.0
  c.model.ln_eps = 1e-6

  # Agent-B: post-norm; the res-like stem down-samples after blocks 2 and 8 (28 -> 14 -> 7).
  c.agent.stem = common.agent_stem(arg.agent)
  c.agent.stem_channels = 64
  c.agent.pre_norm = False
  c.agent.downsample_after = (2, 8) if arg.agent == "res_like" else ()
  # Alone and joint: the standalone agent's dropout; shared: the ViT's (the blocks are shared).
  c.agent.mlp_dropout = 0.1 if arg.mode in ("agent", "joint") else 0.0
  c.agent.residual_dropout = 0.0

  c.loss.update(common.loss_weights(arg.mode))  # The official weights of the mode.

  # AdamW on every leaf, per-epoch cosine, no warmup.
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
