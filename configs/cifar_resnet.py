r"""A CIFAR ResNet (He et al. 2016) trained alone on 5,000 CIFAR-10 images at 32 px, its recipe.

Args: model=resnet20|resnet32|resnet56 (default resnet20), epochs=N (default 180).

Command:
  python -m vitboot_jax.main --config=configs/cifar_resnet.py:model=resnet56,epochs=180 \
    --workdir=workdirs/resnet56
An image folder of CIFAR-10 instead: ... --config.data.name=folder --config.data.dir=ROOT

What it is: ResNet-20/32/56 (models/cifar_resnet.py, the paper's option-A shortcuts; 0.27M,
0.46M, 0.85M parameters) on 10% of each CIFAR-10 class (configs/common.cifar10_32px), the full
test set; a frozen teacher for a ViT of the same data (`teacher=` of the ViT configs).
Recipe: He et al. 2016, section 4.2 (CIFAR-10): SGD with momentum 0.9, lr 0.1, weight decay 1e-4,
batch 128, 4-px zero pad + 32-px random crop + horizontal flip, the lr divided by 10 at 50% and
75% of training (32k and 48k of 64k iterations), no warmup for these depths.
Labelled deviations: the length is in epochs of the 5,000 images (180 by default, about the
paper's 182 epochs of its 45k training images; here 7,020 steps of 128, not 64k); inputs are
normalised by the CIFAR-10 channel mean and std, not the per-pixel mean; weight decay applies to
every parameter (as the paper's Torch code did).
"""

from configs import common
from vitboot_jax import configlib
from vitboot_jax.base.errors import unknown_choice

MODELS = ("resnet20", "resnet32", "resnet56")


def get_config(arg=None):
  arg = common.parse_arg(arg, model="resnet20", epochs=180)
  if arg.model not in MODELS:  # The 224-px baselines have their own recipe (cnn_baselines.py).
    raise ValueError(unknown_choice("model", arg.model, MODELS))
  c = configlib.base_config()
  c.mode = "cnn"
  c.cnn.name = arg.model
  c.data.update(common.cifar10_32px())
  c.image_size = 32
  c.batch_size = 128
  c.num_epochs = arg.epochs
  c.checkpoint_every_steps = 200
  c.eval_every_epochs = 5  # A curve of the plateau without an evaluation after every epoch.
  c.log_every_steps = 20

  c.loss.update(common.loss_weights("cnn"))

  # SGD with momentum on every leaf, the lr divided by 10 at 50% and 75% of the steps.
  c.optim.name = "sgd"
  c.optim.lr = 0.1
  c.optim.momentum = 0.9
  c.optim.weight_decay = 1e-4
  c.optim.decay_all = True
  c.optim.schedule = "multistep"
  c.optim.milestones = (0.5, 0.75)
  c.optim.gamma = 0.1
  c.optim.warmup_epochs = 0.0
  c.optim.clip_norm = 0.0
  return c
