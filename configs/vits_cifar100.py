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
Hardware and time: the paper used 2 GPUs (batch 32 each); 240 epochs are ~187k steps. On one
modern GPU with --config.compute_dtype=bfloat16 expect about a day (not measured here).
Expected final-epoch top-1 (paper / official README, CIFAR-100): shared ViT-S 75.50, agent 74.06;
joint ViT-S 76.19, agent 74.06; ViT-S alone 61.25; Agent-S alone 74.62.
"""

from vitboot_jax import configlib


def get_config(arg=None):
  return configlib.paper_config("cifar100", "vit_s", arg)
