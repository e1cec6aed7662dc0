r"""Your own image folder: ROOT/train/<class>/*.{jpg,jpeg,png} and ROOT/test/<class>/..., any
image mode (grey, RGB, RGBA, palette) and size, resized to size x size.

Command (the ViT alone; `python -m vitboot_jax.tools.teach` with the same flags trains the agent
as its teacher first, then the ViT taught by it):
  python -m vitboot_jax.main --config=configs/image_folder.py --workdir=workdirs/mine \
    --config.data.dir=ROOT
Args: size=N (default 32; a multiple of 8, at least 32), epochs=N (default 50), val=F (default
0.1: that share of each class held out of ROOT/train for validation, unless ROOT/val exists,
which is then the validation split; 0: none), mode=vit|agent|joint|shared (default vit), and the
method switches of configs/common.py.

Every training image is trained on (config.data.train_fraction=1.0), less the validation images;
the classes are the folders of ROOT/train (config.data.num_classes is counted from them). The
models are the quickstart's (configs/quickstart.py), sized for the input: the ViT's patch is
size / 8, so its token grid stays 8x8; the agent's small stem (size / 2) halves its map after
its first blocks until it reaches about the same grid. The recipe is the quickstart's (the
study's recommended recipe replaces it once chosen: docs/results.md). The first line of the log
says what was trained on.
"""

import math

from configs import common, quickstart


def get_config(arg=None):
  arg = common.parse_arg(arg, mode="vit", epochs=50, size=32, val=0.1, **common.SWITCHES)
  if arg.size < 32 or arg.size % 8:
    raise ValueError(f"config arg size={arg.size} must be a multiple of 8, at least 32")
  if not 0.0 <= arg.val < 1.0:
    raise ValueError(f"config arg val={arg.val} must be in [0, 1): the share held out")
  c = quickstart.from_args(arg)
  c.data.update(
    name="folder",
    train_fraction=1.0,
    # "auto": ROOT/val where it exists, else val_fraction of each class held out of ROOT/train.
    val_split="auto" if arg.val else "",
    val_fraction=arg.val or 0.1,
    num_classes=0,  # Counted from ROOT/train's class folders at start-up.
    normalisation="imagenet",  # Natural images of any kind: ImageNet's statistics.
    stored_size=0,  # Images of any size are resized on the host.
    shuffle_buffer=50_000,
  )
  c.image_size = arg.size
  c.model.patch_size = arg.size // 8
  # The small stem gives size / 2; each down-sampling after a block halves it, down to ~8x8.
  halvings = max(1, min(c.model.depth - 1, round(math.log2(arg.size / 16))))
  c.agent.downsample_after = tuple(range(halvings))
  return c
