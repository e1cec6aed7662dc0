r"""ViT-B (the paper's 384/12 layers/6 heads, DeiT-S-like) on CIFAR-100, Table 1 "B" rows.

Args: mode=shared|joint|vit|agent (default shared), agent=res_like|base (default res_like);
method switches sam=1, attention=entmax, init=mimetic|impulse3|impulse5, drloc=LAMBDA,
taps=centered (see configs/vits_cifar100.py).
The 6-head CONV uses the official first-6 raster taps of the 3x3 window (taps=official); set
--config.agent.taps=centered for the symmetric 6-tap window.

Command:
  python -m vitboot_jax.main --config=configs/vitb_cifar100.py --workdir=workdirs/vitb_c100

Official recipe as configs/vits_cifar100.py; the agent is post-norm and the res-like agent
down-samples after blocks 2 and 8 (28 -> 14 -> 7). Hardware/time: the paper used 2 GPUs; about
1.5-2x the ViT-S cost per step (not measured here).
Expected top-1 (the paper's): `python -m vitboot_jax.tools.sweep --table=cifar100`.
"""

from configs import common
from vitboot_jax import configlib


def get_config(arg=None):
  arg = common.parse_arg(arg, mode="shared", agent="res_like", **common.SWITCHES)
  c = configlib.base_config()
  c.mode = arg.mode
  c.data.update(common.cifar("cifar100"))
  c.image_size = 224  # CIFAR upsampled, as the paper.
  c.batch_size = 64
  c.num_epochs = 240

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
