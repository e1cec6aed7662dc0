r"""ViT-S (288/6 layers/9 heads) on CIFAR-100 from scratch, the paper's Table 1 "S" rows.

Args (comma-separated, e.g. `--config=configs/vits_cifar100.py:mode=joint,agent=base`):
  mode:  shared (default, "Ours-Shared"), joint ("Ours-Joint"), vit (ViT-S baseline),
         agent (Agent-S baseline).
  agent: res_like (default) or base (the ViT-like patch stem).
  Method switches (any mode): sam=1 (SAM, rho 0.1), attention=entmax (the "Sparse" rows),
  init=mimetic|impulse3|impulse5, drloc=LAMBDA, taps=centered; align=none (shared as the
  authors' code) | pcgrad (the paper's Algorithm 1, default); Table 4: kd=0 (Feat Only),
  feature=0 (KD Only), decay=none (No Decay), adapt=pool2d (AP-2D).

Command:
  python -m vitboot_jax.main --config=configs/vits_cifar100.py --workdir=workdirs/vits_c100

Official recipe: 224 px (CIFAR upsampled), batch 64, 240 epochs, AdamW 1e-3 wd 0.05 on every leaf,
per-epoch cosine, no warmup; shared loss weights ce .5/.5, kd .5/.5 (T=4), feature 5 (decaying).
Hardware: the paper used 2 GPUs (batch 32 each); 240 epochs are ~187k steps. Step times
measured on GPUs: docs/accelerators.md.
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
