r"""Unit/end-to-end test model: a 36-d, 2-layer ViT and its agent at 32 px. Not for results."""

from vitboot_jax import configlib


def get_config(arg=None):
  args = configlib.parse_arg(arg)
  c = configlib.base_config()
  c.data.name = args.get("data", "folder")
  c.data.num_classes = int(args.get("classes", 10))
  c.data.normalisation = "cifar10"
  c.data.shuffle_buffer = 256
  c.data.eval_batch_size = 32
  c.image_size = 32
  c.model.patch_size = 8
  configlib.set_vit(c, "vit_tiny")
  configlib.set_agent_stem(c, "small")
  configlib.set_mode(c, args.get("mode", "shared"))
  configlib.apply_method_args(c, args)
  c.batch_size = 16
  c.num_epochs = 1
  c.log_every_steps = 1
  c.checkpoint_every_steps = 4
  return c
