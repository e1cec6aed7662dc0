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
Expected final-epoch top-1 (paper, CIFAR-100): shared ViT-B 75.71, agent 74.11; joint ViT-B 77.83,
agent 76.57; ViT-B alone 53.07; Agent-B alone 74.78.
"""

from vitboot_jax import configlib


def get_config(arg=None):
  return configlib.paper_config("cifar100", "vit_b", arg)
