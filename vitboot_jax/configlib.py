"""The config schema: defaults, the paper's model presets and validation.

Config files in `configs/` are data: they start from `base_config()`, pick presets and override
fields. Every field a user may set is created here, so a typo in `--config.x.y=v` fails loudly
(ml_collections refuses unknown keys) and `validate()` names the field and the fix.
"""

from __future__ import annotations

import ml_collections

from vitboot_jax.errors import ConfigError

MODES = ("vit", "agent", "joint", "shared", "cnn")
AGENT_STEMS = ("res_like", "patch", "small", "small_full")
TAPS = ("official", "centered")
INITS = ("official", "standard")
# Attention initialisers applied on top of the standard scheme (ViT only).
ATTENTION_INITS = ("mimetic", "impulse3", "impulse5")
FEATURE_DECAYS = ("epoch", "step", "none")  # How the feature-loss weight decays (losses.py).
ADAPTERS = ("seq1d", "pool2d")  # Feature size adaptation (losses.py).

# ViT shapes from the paper's Table 2 / the official yaml files. "vit_b" is the paper's ViT-B
# (384/12/6, DeiT-S-like), not the standard ViT-B/16.
VIT_PRESETS = {
  "vit_s": dict(embed_dim=288, depth=6, num_heads=9, mlp_dim=1152, dropout=0.1, ln_eps=1e-5),
  "vit_b": dict(embed_dim=384, depth=12, num_heads=6, mlp_dim=1536, dropout=0.0, ln_eps=1e-6),
  # 32-px CPU runs (patch 4 -> 8x8 tokens); 9 heads so the full 3x3 CONV window is used.
  "vit_cpu": dict(embed_dim=144, depth=6, num_heads=9, mlp_dim=288, dropout=0.0, ln_eps=1e-5),
  # Unit tests only.
  "vit_tiny": dict(embed_dim=36, depth=2, num_heads=9, mlp_dim=72, dropout=0.0, ln_eps=1e-5),
}

# Agent settings of the official configs (reference §2.1, §2.6). `downsample_after` is for the
# res-like stem; the patch stem never down-samples.
AGENT_PRESETS = {
  "vit_s": dict(pre_norm=True, res_like_downsample_after=(0, 1)),
  "vit_b": dict(pre_norm=False, res_like_downsample_after=(2, 8)),
  "vit_cpu": dict(pre_norm=True, res_like_downsample_after=(0,)),
  "vit_tiny": dict(pre_norm=True, res_like_downsample_after=(0,)),
}

# Official per-dataset normalisation (the CIFAR-100 std reuses CIFAR-10's, as the official code).
KERNELS = ("auto", "xla", "cpu")

NORMALISATION = {
  "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
  "cifar100": ((0.5071, 0.4867, 0.4408), (0.2023, 0.1994, 0.2010)),
  "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


def base_config() -> ml_collections.ConfigDict:
  """Every field, with the official CIFAR-100 ViT-S shared-mode values as defaults."""
  c = ml_collections.ConfigDict()
  c.mode = "shared"
  c.seed = 0
  c.image_size = 224
  c.batch_size = 64  # Global batch, split over all devices and hosts.
  c.num_epochs = 240
  c.total_steps = -1  # > 0 caps training (smoke runs); -1 trains num_epochs.
  c.log_every_steps = 50
  c.eval_every_steps = -1  # > 0: evaluate every N steps; -1: every eval_every_epochs epochs.
  c.eval_every_epochs = 1  # With eval_every_steps=-1: after every N-th epoch (and at the end).
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  c.compute_dtype = "float32"  # "bfloat16" on GPU/TPU.
  # Pre-trained ViT weights for a fresh run (init_from.py): a timm/DeiT .safetensors, .npz, .pth
  # or a workdir of ours; "" trains from scratch.
  c.init_from = ""
  # Kernel set (models/kernels.py): "auto" takes "cpu" when the mesh's devices are CPUs, else
  # "xla"; "xla" / "cpu" force one (a kernel A/B is this flip).
  c.kernels = "auto"

  c.data = ml_collections.ConfigDict()
  c.data.name = "cifar100"  # A tfds name, or "folder" for an image-folder root.
  c.data.dir = ml_collections.FieldReference(None, field_type=str)  # tfds data_dir or folder root.
  c.data.train_split = "train"
  c.data.eval_split = "test"
  c.data.num_classes = 100
  c.data.train_fraction = 1.0  # Per-class fraction of the training set (the paper's subsets).
  c.data.augment = "cifar"  # "cifar" | "imagenet" | "none"
  c.data.normalisation = "cifar100"  # A key of NORMALISATION.
  # > 0: every stored image is this size square (CIFAR: 32); below image_size the host ships it
  # as uint8 and the steps resize and normalise on the device. 0: resize on the host.
  c.data.stored_size = 0
  c.data.shuffle_buffer = 50_000
  c.data.cache = True  # Cache decoded training images in memory (small datasets).
  c.data.eval_batch_size = 256

  c.model = ml_collections.ConfigDict()
  c.model.name = "vit_s"
  c.model.patch_size = 16
  c.model.embed_dim = 288
  c.model.depth = 6
  c.model.num_heads = 9
  c.model.mlp_dim = 1152
  c.model.dropout = 0.1
  c.model.ln_eps = 1e-5
  c.model.init = "official"  # "official" | "standard" | "mimetic" | "impulse3" | "impulse5"
  c.model.attention = "softmax"  # "softmax" | "entmax" (the paper's "Sparse" rows)

  # CNN baselines (mode "cnn"): "resnet50" | "efficientnet_b2".
  c.cnn = ml_collections.ConfigDict()
  c.cnn.name = "resnet50"

  c.agent = ml_collections.ConfigDict()
  c.agent.stem = "res_like"  # "res_like" | "patch" | "small" / "small_full" (32-px images)
  c.agent.stem_channels = 64
  c.agent.pre_norm = True
  c.agent.downsample_after = (0, 1)
  c.agent.taps = "official"  # "official" | "centered"
  c.agent.mlp_dropout = 0.1
  c.agent.residual_dropout = 0.0
  c.agent.bn_momentum = 0.9  # PyTorch momentum 0.1.
  c.agent.bn_eps = 1e-5
  c.agent.init = "official"

  # Loss weights: the official shared-mode values (reference §3). Joint configs use ce 1, kd 1,
  # feature 10. The paper's Eq. 9 text names alpha=1, beta=10 the other way round; the official
  # configs (which produced the tables) put 10 on the feature term.
  c.loss = ml_collections.ConfigDict()
  c.loss.ce_vit = 0.5
  c.loss.ce_agent = 0.5
  c.loss.ce_cnn = 1.0
  c.loss.kd_vit = 0.5
  c.loss.kd_agent = 0.5
  c.loss.feature_vit = 5.0
  c.loss.temperature = 4.0
  c.loss.feature_loss = "official"  # "official" (LN + MSE) | "paper" (Eq. 6)
  c.loss.adapt = "seq1d"  # "seq1d" (official 1-D pooling) | "pool2d" (Table 4's AP-2D)
  # "epoch" (official, piecewise constant) | "step" | "none" (constant: Table 4's "No Decay")
  c.loss.feature_decay = "epoch"

  # DrLoc (dense relative localisation, Liu et al. 2021): weight = lambda; 0 disables.
  c.drloc = ml_collections.ConfigDict()
  c.drloc.weight = 0.0
  c.drloc.models = ("vit",)  # Which models get the auxiliary task: "vit", "agent", "cnn".
  c.drloc.variant = "l1"  # "l1" (DrLoc) | "ce" | "reg"
  c.drloc.num_pairs = 64
  c.drloc.use_abs = True  # |offset| targets (drloc); False: signed (drloc*)
  c.drloc.normalize = "none"  # "none" (official code) | "code" | "paper"
  c.drloc.pool = "auto"  # Pool ViT grids >= 14 to 7 as the paper; "none" keeps them.
  c.drloc.hidden = 512
  c.drloc.layer = -1  # Which block's output (last by default).

  # SAM (Foret et al. 2021) around the optimizer; rho 0 disables. Official: rho 0.1.
  c.sam = ml_collections.ConfigDict()
  c.sam.rho = 0.0

  c.align = "pcgrad"  # "pcgrad" (Algorithm 1) | "none" (official summed gradients)
  c.align_granularity = "global"  # "global" | "per_leaf"

  c.optim = ml_collections.ConfigDict()
  c.optim.name = "adamw"  # "adamw" | "sgd"
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.optim.decay_all = True  # Official: every leaf decayed (norms, biases, embeddings included).
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  c.optim.momentum = 0.0  # SGD only; the official baselines use none.
  c.optim.schedule = "cosine_epoch"  # "cosine_epoch" (official) | "cosine_step" | "constant"
  c.optim.warmup_epochs = 0.0
  c.optim.clip_norm = 0.0  # 0 disables; the official mutual runs never clip in effect.
  return c


def set_vit(c: ml_collections.ConfigDict, name: str) -> None:
  """Applies a ViT preset and its matching agent settings to `c` in place."""
  if name not in VIT_PRESETS:
    raise ValueError(f"config.model.name={name!r} is unknown; choose one of {sorted(VIT_PRESETS)}")
  c.model.name = name
  for key, value in VIT_PRESETS[name].items():
    c.model[key] = value
  preset = AGENT_PRESETS[name]
  c.agent.pre_norm = preset["pre_norm"]
  c.agent.downsample_after = preset["res_like_downsample_after"]
  # The shared agent takes its dropout from the ViT (reference §2.6).
  c.agent.mlp_dropout = c.model.dropout
  c.agent.residual_dropout = c.model.dropout


def set_agent_stem(c: ml_collections.ConfigDict, stem: str) -> None:
  """`stem` is the paper's agent kind: "base" (patch stem) or "res_like"."""
  stem = {"base": "patch"}.get(stem, stem)
  if stem not in AGENT_STEMS:
    raise ValueError(
      f"agent={stem!r} is unknown; choose 'base', 'res_like', 'small' or 'small_full'"
    )
  c.agent.stem = stem
  if stem == "patch":
    c.agent.downsample_after = ()


def set_mode(c: ml_collections.ConfigDict, mode: str) -> None:
  """Sets the mode and its official loss weights (joint: 1/1/10; shared: .5/.5/5)."""
  if mode not in MODES:
    raise ValueError(f"config.mode={mode!r} is unknown; choose one of {MODES}")
  c.mode = mode
  if mode == "joint":
    c.loss.update(ce_vit=1.0, ce_agent=1.0, kd_vit=1.0, kd_agent=1.0, feature_vit=10.0)
  elif mode == "shared":
    c.loss.update(ce_vit=0.5, ce_agent=0.5, kd_vit=0.5, kd_agent=0.5, feature_vit=5.0)
  else:
    c.loss.update(ce_vit=1.0, ce_agent=1.0, kd_vit=0.0, kd_agent=0.0, feature_vit=0.0)
  # The single-model worker's clipping works and the official ViT configs clip at 0.1 (CNN
  # configs: none); in mutual runs the official clipping is a no-op (reference §4.2).
  c.optim.clip_norm = 0.1 if mode == "vit" else 0.0
  if mode == "cnn":
    # The official CNN baselines: SGD lr 0.05, wd 5e-4, no momentum (torch default), cosine.
    c.optim.update(name="sgd", lr=0.05, weight_decay=5e-4, momentum=0.0)
  if mode in ("agent", "joint"):
    # Standalone agents, and joint ones (the official joint configs load the standalone agent
    # config): MLP dropout 0.1 and no residual dropout, for S and B (reference §2.1, §2.7).
    c.agent.mlp_dropout = 0.1
    c.agent.residual_dropout = 0.0


METHOD_ARGS = ("sam", "attention", "init", "drloc", "taps")
METHOD_ARGS += ("align", "kd", "feature", "decay", "adapt")  # Shared variants, Table 4.


def apply_method_args(c: ml_collections.ConfigDict, args: dict[str, str]) -> None:
  """The method switches every paper config accepts as args (each one config field):

  sam=RHO (sam=1 means the official rho 0.1), attention=entmax (the "Sparse" rows),
  init=mimetic|impulse3|impulse5|standard, drloc=LAMBDA, taps=centered,
  align=none|pcgrad (shared: the authors' code | the paper's Algorithm 1), and Table 4's loss
  ablations: kd=W (both KD weights; kd=0 is "Feat Only"), feature=W (feature=0 is "KD Only"),
  decay=epoch|step|none ("No Decay"), adapt=seq1d|pool2d ("AP-2D").
  """
  if "sam" in args:
    rho = float(args["sam"])
    c.sam.rho = 0.1 if rho == 1 else rho
    if c.mode == "vit":
      c.optim.clip_norm = 0.0  # The official SAM worker ignores clip_max_norm (reference §4.3).
  if "attention" in args:
    c.model.attention = args["attention"]
  if "init" in args:
    c.model.init = args["init"]
  if "drloc" in args:
    c.drloc.weight = float(args["drloc"])
  if "taps" in args:
    c.agent.taps = args["taps"]
  if "align" in args:
    c.align = args["align"]
  if "kd" in args:
    c.loss.kd_vit = c.loss.kd_agent = float(args["kd"])
  if "feature" in args:
    c.loss.feature_vit = float(args["feature"])
  if "decay" in args:
    c.loss.feature_decay = args["decay"]
  if "adapt" in args:
    c.loss.adapt = args["adapt"]


def set_dataset(c: ml_collections.ConfigDict, dataset: str, subset: float = 0.1) -> None:
  """The data fields of a paper dataset: "cifar10", "cifar100" (tfds) or "imagenet" (tfds
  imagenet2012, per-class `subset` of the training set, full validation set)."""
  if dataset in ("cifar10", "cifar100"):
    c.data.update(name=dataset, num_classes=10 if dataset == "cifar10" else 100)
    c.data.update(normalisation=dataset, stored_size=32)
  elif dataset == "imagenet":
    c.data.update(name="imagenet2012", eval_split="validation", num_classes=1000)
    c.data.update(augment="imagenet", normalisation="imagenet", train_fraction=subset)
    c.data.update(cache=False, shuffle_buffer=20_000)  # Does not fit in memory: stream it.
    c.checkpoint_every_steps = 2000
  else:
    raise ValueError(f"dataset={dataset!r} is unknown; choose cifar10, cifar100 or imagenet")


def paper_config(dataset: str, vit: str, arg: str | None) -> ml_collections.ConfigDict:
  """A paper row: dataset + ViT preset + the args mode=, agent=, subset= and method switches."""
  args = parse_arg(arg)
  c = base_config()
  set_dataset(c, dataset, float(args.get("subset", 0.1)))
  set_vit(c, args.get("vit", vit))
  set_agent_stem(c, args.get("agent", "res_like"))
  set_mode(c, args.get("mode", "shared"))
  apply_method_args(c, args)
  return c


def parse_arg(arg: str | None) -> dict[str, str]:
  """Parses big_vision-style config args: "mode=joint,agent=base" -> dict."""
  out = {}
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config arg {item!r} must look like key=value (e.g. mode=joint)")
    key, value = item.split("=", 1)
    out[key.strip()] = value.strip()
  return out


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Fails fast with a message that names the field and the fix."""
  if c.mode not in MODES:
    raise ConfigError(f"config.mode={c.mode!r} is unknown; choose one of {MODES}")
  if c.get("kernels", "auto") not in KERNELS:
    raise ConfigError(f"config.kernels={c.kernels!r} is unknown; choose one of {KERNELS}")
  if c.agent.stem not in AGENT_STEMS:
    raise ConfigError(f"config.agent.stem={c.agent.stem!r} is unknown; choose one of {AGENT_STEMS}")
  if c.agent.taps not in TAPS:
    raise ConfigError(f"config.agent.taps={c.agent.taps!r} is unknown; choose one of {TAPS}")
  if c.model.init not in INITS + ATTENTION_INITS:
    raise ConfigError(
      f"config.model.init={c.model.init!r} is unknown; choose one of {INITS + ATTENTION_INITS}"
    )
  if c.agent.init not in INITS:
    raise ConfigError(f"config.agent.init={c.agent.init!r} is unknown; choose one of {INITS}")
  if c.image_size % c.model.patch_size:
    raise ConfigError(
      f"config.image_size={c.image_size} is not divisible by config.model.patch_size="
      f"{c.model.patch_size}; pick a patch size that divides the image size"
    )
  if c.model.embed_dim % c.model.num_heads:
    raise ConfigError(
      f"config.model.embed_dim={c.model.embed_dim} is not divisible by "
      f"config.model.num_heads={c.model.num_heads}"
    )
  if not 0.0 < c.data.train_fraction <= 1.0:
    raise ConfigError(f"config.data.train_fraction={c.data.train_fraction} must be in (0, 1]")
  if c.batch_size <= 0:
    raise ConfigError(f"config.batch_size={c.batch_size} must be positive")
  if not isinstance(c.eval_every_epochs, int) or c.eval_every_epochs < 1:
    raise ConfigError(
      f"config.eval_every_epochs={c.eval_every_epochs!r} must be a positive integer"
    )
  if num_devices is not None and c.batch_size % num_devices:
    raise ConfigError(
      f"config.batch_size={c.batch_size} is not divisible by the {num_devices} devices; "
      f"use a multiple of {num_devices}"
    )
  if c.loss.feature_decay not in FEATURE_DECAYS:
    raise ConfigError(
      f"config.loss.feature_decay={c.loss.feature_decay!r} is unknown; choose one of "
      f"{FEATURE_DECAYS}"
    )
  if c.loss.adapt not in ADAPTERS:
    raise ConfigError(f"config.loss.adapt={c.loss.adapt!r} is unknown; choose one of {ADAPTERS}")
  if c.align not in ("pcgrad", "none"):
    raise ConfigError(f"config.align={c.align!r} is unknown; choose 'pcgrad' or 'none'")
  if c.align_granularity not in ("global", "per_leaf"):
    raise ConfigError(
      f"config.align_granularity={c.align_granularity!r} is unknown; choose 'global' or 'per_leaf'"
    )
