r"""ViT-S (288/6/9) on ImageNet-1k subsets: the S variants the official code ships (no paper row).

Args: subset=0.05|0.1|0.5 (default 0.1), mode=shared|joint|vit|agent, agent=res_like|base, and
the method switches of configs/common.py.
Command:
  python -m vitboot_jax.main --config=configs/vits_imagenet.py:subset=0.1 \
    --workdir=workdirs/vits_in10 --config.data.dir=DATA_DIR
Same recipe as configs/vitb_imagenet.py; the paper reports no ImageNet numbers for ViT-S.
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

  # ViT-S (the paper's Table 2): 288 wide, 6 layers, 9 heads, patch 16.
  c.model.name = "vit_s"
  c.model.patch_size = 16
  c.model.embed_dim = 288
  c.model.depth = 6
  c.model.num_heads = 9
  c.model.mlp_dim = 1152
  c.model.dropout = 0.1
  c.model.ln_eps = 1e-5

  # Agent-S: pre-norm; the res-like stem down-samples after blocks 0 and 1 (56 -> 28 -> 14).
  c.agent.stem = common.agent_stem(arg.agent)
  c.agent.stem_channels = 64
  c.agent.pre_norm = True
  c.agent.downsample_after = (0, 1) if arg.agent == "res_like" else ()
  # Alone and joint: the standalone agent's dropout; shared: the ViT's (the blocks are shared).
  c.agent.mlp_dropout = 0.1
  c.agent.residual_dropout = 0.0 if arg.mode in ("agent", "joint") else 0.1

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
