r"""ViT-S (288/6/9) on ImageNet-1k subsets: the S variants the official code ships (no paper row).

Args: subset=0.05|0.1|0.5 (default 0.1), mode=shared|joint|vit|agent, agent=res_like|base.
Command:
  python -m vitboot_jax.main --config=configs/vits_imagenet.py:subset=0.1 \
    --workdir=workdirs/vits_in10 --config.data.dir=DATA_DIR
Same recipe as configs/vitb_imagenet.py; the paper reports no ImageNet numbers for ViT-S.
"""

from vitboot_jax import configlib


def get_config(arg=None):
  return configlib.paper_config("imagenet", "vit_s", arg)
