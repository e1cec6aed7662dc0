"""The models' allowed choices, one list each: configlib checks a config against them before jax is
imported (this module imports nothing), and the modules that implement them trust the config."""

AGENT_STEMS = ("res_like", "patch", "small", "small_full")  # agent.py
TAPS = ("official", "centered")  # agent.py: where the CONV's heads read.
INITS = ("official", "standard")  # agent.py, vit.py
# ViT only: the standard scheme, then the attention rewritten on the host (attention_init.py,
# applied by build.ModelSet.init_on_host).
ATTENTION_INITS = ("mimetic", "impulse3", "impulse5")
ATTENTIONS = ("softmax", "entmax")  # vit.py: entmax is the paper's Sparse ViT.
# build.py: the paper's CNN baselines and He et al.'s CIFAR ResNets (cifar_resnet.py).
CNNS = ("resnet50", "efficientnet_b2", "resnet20", "resnet32", "resnet56")
# How many feature maps (out["features"]) each CNN returns: the stages a hint may read.
CNN_STAGES = {"resnet50": 4, "efficientnet_b2": 7, "resnet20": 3, "resnet32": 3, "resnet56": 3}
DRLOC_VARIANTS = ("l1", "ce", "reg")  # drloc_head.py
DRLOC_POOLS = ("auto", "always", "none")  # drloc_head.pool_grid
KERNELS = ("auto", "xla", "cpu")  # kernel_sets.py


def hinted_layers(depth: int, last: int = 0) -> tuple[int, ...]:
  """The paired layers the feature (hint) term acts on: all `depth` (official), or the `last` k
  (config.loss.feature_layers; losses.feature_losses, and the projectors models/build.py makes)."""
  return tuple(range(depth - last, depth)) if last else tuple(range(depth))


def parse_hint_pairs(spec: str) -> tuple[tuple[int, int], ...]:
  """config.loss.hint_pairs "t:l,t:l" (teacher feature map t feeds ViT layer l, 0-based) as
  ((t, l), ...); ValueError naming the format for anything else."""
  pairs = []
  for item in spec.split(","):
    teacher, sep, layer = item.strip().partition(":")
    if not (sep and teacher.strip().isdigit() and layer.strip().isdigit()):
      raise ValueError(
        f"{item.strip()!r} is not TEACHER:LAYER (two 0-based integers, e.g. '0:1,1:3,2:5')"
      )
    pairs.append((int(teacher), int(layer)))
  return tuple(pairs)


def spaced_pairs(stages: int, depth: int) -> tuple[tuple[int, int], ...]:
  """A CNN teacher's default hint: its last min(stages, depth) feature maps, in order, feed as many
  evenly spaced ViT layers ending at the last (3 stages, 12 layers: layers 3, 7, 11), as locality
  guidance (Li et al. 2022) pairs a ResNet's three stages with three of DeiT's layers."""
  k = min(stages, depth)
  return tuple((stages - k + i, round((i + 1) * depth / k) - 1) for i in range(k))
