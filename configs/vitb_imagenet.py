r"""ViT-B (384/12/6) on ImageNet-1k subsets from scratch, the paper's Table 3.

Args (comma-separated): subset=0.05|0.1|0.5 (per-class fraction of the training set, default
0.1; 0.01 also works), mode=shared|joint|vit|agent (default shared), agent=res_like|base.

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
Expected final-epoch top-1 (paper, 5% / 10% / 50%): shared ViT-B 33.06 / 45.75 / 66.48; joint
36.01 / 49.73 / 71.36; ViT-B alone 16.60 / 28.11 / 63.40; Agent-B alone 35.28 / 47.46 / 68.13.
"""

from vitboot_jax import configlib


def get_config(arg=None):
  return configlib.paper_config("imagenet", "vit_b", arg)
