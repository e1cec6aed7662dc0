r"""Unit/end-to-end test config: configs/cifar_resnet.py's recipe on the tests' tiny image folder
(batch 16, one epoch). Not for results.

Args: model= (default resnet20), classes= (default 10).
"""

from configs import cifar_resnet, common


def get_config(arg=None):
  arg = common.parse_arg(arg, model="resnet20", classes=10)
  c = cifar_resnet.get_config(f"model={arg.model},epochs=1")
  c.data.name = "folder"
  c.data.num_classes = arg.classes
  c.data.train_fraction = 1.0
  c.data.shuffle_buffer = 256
  c.data.eval_batch_size = 32
  c.batch_size = 16
  c.eval_every_epochs = 1
  c.log_every_steps = 1
  c.checkpoint_every_steps = 4
  return c
