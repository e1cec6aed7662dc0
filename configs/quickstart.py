r"""Quickstart: a small ViT + agent on 32-px CIFAR-10, shared mode, minutes on a laptop CPU.

Command (tfds `cifar10`, downloaded on first use into ~/tensorflow_datasets or $TFDS_DATA_DIR):
  python -m vitboot_jax.main --config=configs/quickstart.py --workdir=workdirs/quickstart
An image folder of CIFAR-10 instead (`ROOT/{train,test}/<class>/*.jpg`; what CI uses):
  ... --config.data.name=folder --config.data.dir=ROOT

Model: ViT 144-d, 6 layers, 9 heads, patch 4 (8x8 tokens); agent with the small 32-px stem
(16x16) down-sampling after block 0. 10% of the training set per class (5,000 images), batch 64.
Args: mode=shared|joint|vit|agent (default shared), epochs=N (default 5), method switches.

Measured on the 2-core CPU VM (1 device, default args = 5 epochs, seed 0; README "Measured
results"): commit abc6ec9, 10.0 min wall on the idle VM, final top-1 on the 10,000 test images
ViT 23.30% / agent 30.08%; alone (mode=vit, mode=agent; 2 seeds) 42.05% / 42.53%. At this scale
the agent does not help the ViT: the feature term (weight 5) holds it back (feature_vit=0: ViT
39.79% / agent 44.04%).
"""

from vitboot_jax import configlib


def get_config(arg=None):
  args = configlib.parse_arg(arg)
  c = configlib.base_config()
  c.data.name = "cifar10"  # tfds; data.dir unset: tfds' default data directory.
  c.data.num_classes = 10
  c.data.normalisation = "cifar10"
  c.data.train_fraction = 0.1
  c.data.shuffle_buffer = 5000
  c.image_size = 32
  c.model.patch_size = 4
  configlib.set_vit(c, "vit_cpu")
  configlib.set_agent_stem(c, "small")
  configlib.set_mode(c, args.get("mode", "shared"))
  configlib.apply_method_args(c, args)
  c.num_epochs = int(args.get("epochs", 5))
  c.checkpoint_every_steps = 200
  # A full evaluation of both models on the 10,000 test images costs ~1 min on 2 CPU cores, 2/3
  # of a training epoch: evaluating after epochs 3 and 5 instead of all 5 saves ~3 minutes.
  c.eval_every_epochs = 3
  c.log_every_steps = 20
  return c
