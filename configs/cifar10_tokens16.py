r"""CPU replication at the paper's token grid: 32-px CIFAR-10 with patch 2, 16x16 tokens.

The paper upscales CIFAR to 224 px with patch 16: 14x14 tokens of ~2.3x2.3 original pixels each.
This config keeps the 32-px pixels and takes patch 2, 16x16 tokens of 2x2 pixels, at a cost a
2-core CPU can pay. Everything else is the quickstart's: 10% of CIFAR-10 per class (5,000
images), the 144-d / 6-layer / 9-head ViT, batch 64, and the official recipe (AdamW 1e-3 wd 0.05
on every leaf, per-epoch cosine, the mode's official loss weights, per-epoch feature decay).
The agent's stem keeps the official geometry scaled down: the official Agent-S runs its first
block at 56x56 and the rest at 28 and 14 against 14x14 tokens; here the stem keeps 32x32
("small_full"), block 0 runs at 32x32 (twice the token grid) and the later blocks at 16x16.

Command (the CIFAR-10 image folder; any `root/{train,test}/<class>/*.png` works):
  python -m vitboot_jax.main --config=configs/cifar10_tokens16.py:mode=vit,epochs=10 \
    --workdir=workdirs/tokens16_vit --config.data.dir=../shared/data/cifar10
All rows (issue 22: 5 modes x 2 seeds, Table 4 in joint mode) through the replication runner:
  bash launch/cpu_replication.sh ROOT 10 0,1 --config=configs/cifar10_tokens16.py \
    --data_dir=../shared/data/cifar10
Args: mode=shared|joint|vit|agent (default shared), epochs=N (default 10), and the method
switches of configs/vits_cifar10.py (align=none, kd=0, feature=0, decay=none, ...).
Time and results: see docs/results.md ("16x16-token replication") once measured.
"""

from vitboot_jax import configlib


def get_config(arg=None):
  args = configlib.parse_arg(arg)
  c = configlib.base_config()
  c.data.name = "folder"
  c.data.dir = "../shared/data/cifar10"
  c.data.num_classes = 10
  c.data.normalisation = "cifar10"
  c.data.train_fraction = 0.1
  c.data.shuffle_buffer = 5000
  c.image_size = 32
  c.model.patch_size = 2
  configlib.set_vit(c, "vit_cpu")
  configlib.set_agent_stem(c, "small_full")
  c.agent.downsample_after = (0,)  # 32x32 in block 0, then the 16x16 token grid.
  configlib.set_mode(c, args.get("mode", "shared"))
  configlib.apply_method_args(c, args)
  c.num_epochs = int(args.get("epochs", 10))
  c.checkpoint_every_steps = 100
  c.eval_every_epochs = 1  # Learning curves (the paper's Fig. 5 question) need every epoch.
  c.log_every_steps = 20
  return c
