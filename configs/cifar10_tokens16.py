r"""CPU replication at the paper's token grid: 32-px CIFAR-10 with patch 2, 16x16 tokens.

The paper upscales CIFAR to 224 px with patch 16: 14x14 tokens of ~2.3x2.3 original pixels each.
This config keeps the 32-px pixels and takes patch 2, 16x16 tokens of 2x2 pixels, at a cost a
2-core CPU can pay. Everything else is the quickstart's: 10% of CIFAR-10 per class (5,000
images), the 144-d / 6-layer / 9-head ViT, batch 64, and the official recipe (AdamW 1e-3 wd 0.05
on every leaf, per-epoch cosine, the mode's official loss weights, per-epoch feature decay).
The agent's stem keeps the official geometry scaled down: the official Agent-S runs its first
block at 56x56 and the rest at 28 and 14 against 14x14 tokens; here the stem keeps 32x32
("small_full"), block 0 runs at 32x32 (twice the token grid) and the later blocks at 16x16.

Command (tfds `cifar10`, prepared on first use; an image folder of CIFAR-10 instead:
`--config.data.name=folder --config.data.dir=ROOT` with `ROOT/{train,test}/<class>/*.jpg`):
  python -m vitboot_jax.main --config=configs/cifar10_tokens16.py:mode=vit,epochs=10 \
    --workdir=workdirs/tokens16_vit
All rows (5 modes x 2 seeds, Table 4 in joint mode) through the replication runner:
  bash launch/cpu_replication.sh ROOT 10 0,1 --config=configs/cifar10_tokens16.py \
    --data_dir=../shared/data/cifar10
Args: mode=shared|joint|vit|agent (default shared), epochs=N (default 10), and the method
switches of configs/common.py (align=none, kd=0, feature=0, decay=none, ...).
Time per epoch on a 2-core CPU and per run on one H100, and the results (every row, 2 seeds;
README "Small-scale replication"): docs/results.md.
"""

from configs import common
from vitboot_jax import configlib


def get_config(arg=None):
  arg = common.parse_arg(arg, mode="shared", epochs=10, **common.SWITCHES)
  c = configlib.base_config()
  c.mode = arg.mode
  c.data.update(common.cifar10_32px())
  c.image_size = 32
  c.batch_size = 64
  c.num_epochs = arg.epochs
  c.checkpoint_every_steps = 20  # Slow CPU steps: a kill loses minutes (docs/performance.md).
  c.eval_every_epochs = 1  # Learning curves (the paper's Fig. 5 question) need every epoch.
  c.log_every_steps = 20

  # ViT: 144 wide, 6 layers, 9 heads (the full 3x3 CONV window), patch 2 (16x16 tokens).
  c.model.name = "vit_cpu"
  c.model.patch_size = 2
  c.model.embed_dim = 144
  c.model.depth = 6
  c.model.num_heads = 9
  c.model.mlp_dim = 288
  c.model.dropout = 0.0
  c.model.ln_eps = 1e-5

  # Agent: the stem keeps 32x32, block 0 runs at 32x32, the later blocks at the 16x16 token grid.
  c.agent.stem = "small_full"
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
