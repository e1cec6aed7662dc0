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
DRLOC_VARIANTS = ("l1", "ce", "reg")  # drloc_head.py
DRLOC_POOLS = ("auto", "always", "none")  # drloc_head.pool_grid
KERNELS = ("auto", "xla", "cpu")  # kernel_sets.py


def hinted_layers(depth: int, last: int = 0) -> tuple[int, ...]:
  """The paired layers the feature (hint) term acts on: all `depth` (official), or the `last` k
  (config.loss.feature_layers; losses.feature_losses, and the projectors models/build.py makes)."""
  return tuple(range(depth - last, depth)) if last else tuple(range(depth))
