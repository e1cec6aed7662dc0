"""The config schema: every field with a neutral default, and validation.

Config files in `configs/` write their recipe literally on top of `base_config()`. Every field a
user may set is created here, so a typo in `--config.x.y=v` fails loudly (ml_collections refuses
unknown keys) and `validate()` names the field and the fix. Fields a config must set (the mode,
the data, the model shapes, the training length) hold placeholders that `validate()` rejects.
"""

from __future__ import annotations

import ml_collections

from vitboot_jax.base.errors import ConfigError, unknown_choice
from vitboot_jax.data import randaugment_policy
from vitboot_jax.models import choices

# The one list of each choice that is not a model's (those are models/choices.py's), each with
# the module that implements it; CHOICES below names the field that takes it.
MODES = ("vit", "agent", "joint", "shared", "cnn")
FEATURE_DECAYS = ("epoch", "step", "none")  # How the feature-loss weight decays (losses.py).
ADAPTERS = ("seq1d", "pool2d")  # Feature size adaptation (losses.py).
FEATURE_FORMULAS = ("official", "paper", "corr")  # The feature loss's form (losses.py).
PROJECTORS = ("none", "linear")  # A learnable map of the ViT's tokens before the hint (steps.py).
ALIGN_METHODS = ("pcgrad", "none")  # align.py
ALIGN_GRANULARITIES = ("global", "per_leaf")  # align.py
OPTIMIZERS = ("adamw", "sgd")  # optim.py
SCHEDULES = ("cosine_epoch", "cosine_step", "constant", "multistep")  # optim.py
DRLOC_NORMALIZATIONS = ("none", "code", "paper")  # The DrLoc targets' scale (method/drloc.py).
# Where batches are made: tf.data on the host, or gathered and augmented in the jitted step from
# the dataset held on the devices (device_pipeline.py).
PIPELINES = ("tfdata", "device")
ACCELERATOR_STEPS_PER_CALL = 8  # config.steps_per_call=0 on GPUs and TPUs.
AUGMENTS = ("cifar", "imagenet", "none")  # Both pipelines: tfdata_augment.py, step_preprocess.py.

# Official per-dataset normalisation (the CIFAR-100 std reuses CIFAR-10's, as the official code).
NORMALISATION = {
  "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
  "cifar100": ((0.5071, 0.4867, 0.4408), (0.2023, 0.1994, 0.2010)),
  "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}

# Every field that takes one of a fixed set of values, and the set. validate() checks them all
# here, once, before jax loads; the modules that implement a choice trust the config.
CHOICES: dict[str, tuple[str, ...]] = {
  "mode": MODES,
  "kernels": choices.KERNELS,
  "data.pipeline": PIPELINES,
  "data.augment": AUGMENTS,
  "data.normalisation": tuple(NORMALISATION),
  "model.init": choices.INITS + choices.ATTENTION_INITS,
  "model.attention": choices.ATTENTIONS,
  "cnn.name": choices.CNNS,
  "agent.stem": choices.AGENT_STEMS,
  "agent.taps": choices.TAPS,
  "agent.init": choices.INITS,
  "loss.feature_loss": FEATURE_FORMULAS,
  "loss.adapt": ADAPTERS,
  "loss.feature_decay": FEATURE_DECAYS,
  "loss.feature_projector": PROJECTORS,
  "drloc.variant": choices.DRLOC_VARIANTS,
  "drloc.normalize": DRLOC_NORMALIZATIONS,
  "drloc.pool": choices.DRLOC_POOLS,
  "align": ALIGN_METHODS,
  "align_granularity": ALIGN_GRANULARITIES,
  "optim.name": OPTIMIZERS,
  "optim.schedule": SCHEDULES,
}


def base_config() -> ml_collections.ConfigDict:
  """Every field; placeholders ("", 0, -1) where a config must set the value (see REQUIRED)."""
  c = ml_collections.ConfigDict()
  c.mode = ""  # One of MODES.
  c.seed = 0
  c.image_size = 0
  c.batch_size = 0  # Global batch, split over all devices and hosts.
  c.num_epochs = 0
  c.total_steps = -1  # > 0 caps training (smoke runs); -1 trains num_epochs.
  c.log_every_steps = 50
  # Also log the ViT's cross-entropy and hint gradient shares (hint_grad_ratio) on logging steps:
  # a diagnostic whose second, batched backward sits in every step under a conditional, which
  # costs every step time and memory (docs/performance.md); the study tables turn it on.
  c.log_hint_shares = False
  c.eval_every_steps = -1  # > 0: evaluate every N steps; -1: every eval_every_epochs epochs.
  c.eval_every_epochs = 1  # With eval_every_steps=-1: after every N-th epoch (and at the end).
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  # Optimiser steps per jitted call (a scan over that many batches): a short accelerator step
  # is then not paced by the host. Evaluations and checkpoints still land on their own steps.
  # 0: ACCELERATOR_STEPS_PER_CALL on GPUs and TPUs, where a call's overhead is a quarter of a
  # ViT-S step at batch 64, and 1 on CPUs, whose XLA runs a scanned step slower (docs/).
  c.steps_per_call = 0
  c.compute_dtype = "float32"  # "bfloat16" on GPU/TPU.
  # Pre-trained ViT weights for a fresh run (init_from.py): a timm/DeiT .safetensors, .npz, .pth
  # or a workdir of ours; "" trains from scratch.
  c.init_from = ""
  # Joint-mode variants (the mechanism study): the agent starts from a run of ours (its workdir
  # or checkpoint: the agent's params and BatchNorm statistics; "" from scratch), and is frozen
  # (never updated: a fixed teacher).
  c.agent_init_from = ""
  c.agent_frozen = False
  c.agent_frozen_eval = False  # A frozen agent predicts in evaluation mode (its inference).
  # Kernel set (kernel_sets.py): "auto" takes "cpu" when the mesh's devices are CPUs, else
  # "xla"; "xla" / "cpu" force one (a kernel A/B is this flip).
  c.kernels = "auto"

  c.data = ml_collections.ConfigDict()
  c.data.name = ""  # A tfds name, "folder" for an image-folder root, "npz" for DIR/<split>.npz.
  c.data.pipeline = "tfdata"  # One of PIPELINES.
  c.data.dir = ml_collections.FieldReference(None, field_type=str)  # tfds data_dir or folder root.
  c.data.train_split = "train"
  c.data.eval_split = "test"
  # Validation, which choices among runs read (never the test split): "" none; "held_out" the
  # last val_fraction of each class of the training split in the subset order (data/splits.py),
  # left out of training; the name of a split of its own (an image folder's "val"); or "auto":
  # an image folder's "val" where it exists, else "held_out".
  c.data.val_split = ""
  c.data.val_fraction = 0.1
  c.data.num_classes = 0
  c.data.train_fraction = 1.0  # Per-class fraction of the training set (the paper's subsets).
  c.data.augment = "none"  # "cifar" | "imagenet" | "none"
  c.data.normalisation = ""  # A key of NORMALISATION.
  # > 0: every stored image is this size square (CIFAR: 32); below image_size the host ships it
  # as uint8 and the steps resize and normalise on the device. 0: resize on the host.
  c.data.stored_size = 0
  c.data.shuffle_buffer = 50_000
  c.data.cache = True  # Cache decoded training images in memory (small datasets).
  c.data.eval_batch_size = 256
  # The field's recipe (data/recipe_augment.py; each off by default, as in every paper row), run in
  # the jitted step on both pipelines: RandAugment as a timm policy string ("": off; DeiT's is
  # "rand-m9-mstd0.5-inc1") and random erasing's probability (DeiT: 0.25, 'pixel' mode).
  c.data.randaugment = ""
  c.data.random_erase = 0.0

  # The ViT (modes vit, joint, shared); -1: the config sets it.
  c.model = ml_collections.ConfigDict()
  c.model.name = ""  # A label ("vit_s", "vit_b", ...) for logs and tools.
  c.model.patch_size = -1
  c.model.embed_dim = -1
  c.model.depth = -1
  c.model.num_heads = -1
  c.model.mlp_dim = -1
  c.model.dropout = 0.0
  c.model.drop_path = 0.0  # Stochastic depth at the last block, 0 at the first (DeiT-S: 0.1).
  c.model.ln_eps = 1e-6
  c.model.init = "official"  # "official" | "standard" | "mimetic" | "impulse3" | "impulse5"
  c.model.attention = "softmax"  # "softmax" | "entmax" (the paper's "Sparse" rows)
  # A variant (joint): DeiT's distillation token, its head trained on the agent's argmax
  # (loss.distill_vit); evaluation averages the two heads.
  c.model.distill_token = False

  # The CNN of mode "cnn": "resnet50" | "efficientnet_b2" (the paper's baselines, 224 px) |
  # "resnet20" | "resnet32" | "resnet56" (He et al.'s CIFAR ResNets, 32 px). Mode "joint": set, it
  # takes the agent's place as the ViT's partner (a CNN teacher, teacher_cnn=NAME); "": the agent.
  c.cnn = ml_collections.ConfigDict()
  c.cnn.name = ""

  # The agent (modes agent, joint, shared): the ViT's shape with a convolutional stem.
  c.agent = ml_collections.ConfigDict()
  # "patch" (the ViT-like stem) | "res_like" | "small" / "small_full" (32-px images)
  c.agent.stem = "patch"
  c.agent.stem_channels = 64
  c.agent.pre_norm = True
  c.agent.downsample_after = ()  # Blocks after which the res-like / small stems halve the grid.
  c.agent.taps = "official"  # "official" | "centered"
  c.agent.mlp_dropout = 0.0
  c.agent.residual_dropout = 0.0
  c.agent.drop_path = 0.0  # Stochastic depth in the agent's residual blocks, as the ViT's.
  c.agent.bn_momentum = 0.9  # PyTorch momentum 0.1.
  c.agent.bn_eps = 1e-5
  c.agent.init = "official"

  # Loss weights: cross-entropy only; configs/common.py holds the official weights of each mode.
  c.loss = ml_collections.ConfigDict()
  c.loss.ce_vit = 1.0
  c.loss.ce_agent = 1.0
  c.loss.ce_cnn = 1.0
  c.loss.kd_vit = 0.0
  c.loss.kd_agent = 0.0
  c.loss.feature_vit = 0.0
  c.loss.temperature = 4.0
  c.loss.label_smoothing = (
    0.0  # The CE targets' smoothing (DeiT: 0.1); KD targets are the teacher's.
  )
  c.loss.distill_vit = 0.0  # The ViT's distillation head: CE on the agent's argmax (DeiT hard).
  c.loss.feature_loss = "official"  # "official" (LN + MSE) | "paper" (Eq. 6)
  c.loss.adapt = "seq1d"  # "seq1d" (official 1-D pooling) | "pool2d" (Table 4's AP-2D)
  # "epoch" (official, piecewise constant) | "step" | "none" (constant: Table 4's "No Decay")
  c.loss.feature_decay = "epoch"
  # Variants of the feature (hint) term; each default is the official recipe (losses.py, steps.py).
  c.loss.feature_until = 1.0  # The hint acts during this fraction of the steps, then is off.
  c.loss.feature_gate = 0.0  # > 0: the hint is off until the agent's running train top-1 >= it.
  c.loss.feature_layers = 0  # > 0: only the last k paired layers; 0: every pair (official).
  c.loss.feature_projector = (
    "none"  # "linear": a learnable D x D map of the ViT's tokens (FitNets).
  )
  # > 0: the hint's gradient on the ViT is scaled down to at most this multiple of the CE's norm.
  c.loss.feature_balance = 0.0
  # Which teacher feature map feeds which ViT layer, "t:l,t:l" (0-based; teacher maps resampled to
  # the ViT's token grid, projected where the widths differ). "": the agent's layer l feeds layer l
  # (official); a CNN teacher's stages feed evenly spaced layers (choices.spaced_pairs).
  c.loss.hint_pairs = ""

  # Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) of the batch with itself reversed, as
  # timm's Mixup in 'batch' mode: with probability `prob` a batch is mixed, by CutMix with
  # probability `switch_prob` when both alphas are > 0; an alpha of 0 turns that one off.
  c.mix = ml_collections.ConfigDict()
  c.mix.mixup_alpha = 0.0  # DeiT: 0.8
  c.mix.cutmix_alpha = 0.0  # DeiT: 1.0
  c.mix.prob = 1.0
  c.mix.switch_prob = 0.5

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
  c.optim.lr = -1.0  # Placeholder: 0 is a valid (frozen) learning rate.
  c.optim.weight_decay = 0.0
  c.optim.decay_all = True  # Official: every leaf decayed (norms, biases, embeddings included).
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-8
  c.optim.momentum = 0.0  # SGD only; the official baselines use none.
  # "cosine_epoch" (official) | "cosine_step" | "constant" | "multistep"
  c.optim.schedule = "cosine_epoch"
  # "multistep": the lr is multiplied by gamma at each milestone, a fraction of the steps after
  # warmup (He et al. 2016's CIFAR ResNets: 0.5 and 0.75, gamma 0.1).
  c.optim.milestones = (0.5, 0.75)
  c.optim.gamma = 0.1
  c.optim.warmup_epochs = 0.0
  c.optim.clip_norm = 0.0  # 0 disables; the official mutual runs never clip in effect.
  return c


def device_resize_from(config: ml_collections.ConfigDict) -> int:
  """The stored side the host ships images at (uint8) for the steps to resize, or 0.

  When every stored image is config.data.stored_size square (CIFAR: 32) and smaller than
  config.image_size, the CIFAR and "none" pipelines ship the augmented crop as uint8 at that
  size (3 kB instead of 602 kB at 224 px) and the jitted steps resize and normalise it on the
  device (step_preprocess.py); the host then does no float work at all.
  """
  stored = int(config.data.get("stored_size", 0))
  if stored and stored < config.image_size and config.data.augment in ("cifar", "none"):
    return stored
  return 0


# Fields a config must set (base_config() holds placeholders: "", 0 or -1), for every mode and
# for the models a mode trains (the agent has the ViT's shape).
REQUIRED = ("mode", "image_size", "batch_size", "num_epochs", "optim.lr")
REQUIRED += ("data.name", "data.num_classes", "data.normalisation")
REQUIRED_BY_MODE = {
  "vit": ("model.patch_size", "model.embed_dim", "model.depth", "model.num_heads", "model.mlp_dim"),
  "cnn": ("cnn.name",),
}
REQUIRED_BY_MODE["agent"] = REQUIRED_BY_MODE["joint"] = REQUIRED_BY_MODE["shared"] = (
  REQUIRED_BY_MODE["vit"]
)


def _unset(c: ml_collections.ConfigDict, fields: tuple[str, ...]) -> list[str]:
  """The fields of `fields` that still hold base_config()'s placeholder."""
  placeholders = base_config()
  out = []
  for field in fields:
    value, placeholder = c, placeholders
    for key in field.split("."):
      value, placeholder = value[key], placeholder[key]
    if value == placeholder:
      out.append(f"config.{field}")
  return out


def total_steps(c: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  """The optimiser steps of the run: num_epochs, capped by config.total_steps when positive."""
  total = steps_per_epoch * c.num_epochs
  return min(total, c.total_steps) if c.total_steps > 0 else total


def steps_per_call(c: ml_collections.ConfigDict, platform: str) -> int:
  """Optimiser steps per jitted call on `platform` ("cpu", "gpu", "cuda", "tpu"), 0 resolved."""
  k = c.get("steps_per_call", 1)  # Configs written before the field: one step a call.
  if k > 0:
    return k
  return 1 if platform == "cpu" else ACCELERATOR_STEPS_PER_CALL


def check_choices(c: ml_collections.ConfigDict) -> None:
  """Every field of CHOICES holds one of its values. A field at base_config()'s value is skipped:
  a valid default, or a placeholder that REQUIRED reports where the mode needs the field."""
  defaults = base_config()
  for field, allowed in CHOICES.items():
    value, default = c, defaults
    for key in field.split("."):
      value, default = value.get(key, default[key]), default[key]  # Older configs lack new fields.
    if value != default and value not in allowed:
      raise ConfigError(unknown_choice(f"config.{field}", value, allowed))


def _validate_validation(data: ml_collections.ConfigDict) -> None:
  """The validation split is held out or a split of its own, never the test or training split."""
  val_split = data.get("val_split", "")
  if not val_split:
    return
  if val_split in ("held_out", "auto"):  # "auto": run/startup.from_data settles it.
    if not 0.0 < data.val_fraction < 1.0:
      raise ConfigError(
        f"config.data.val_fraction={data.val_fraction} must be in (0, 1): the share of each "
        "class of the training split held out for validation"
      )
  elif val_split == data.eval_split:
    raise ConfigError(
      f"config.data.val_split={val_split!r} is the test split (config.data.eval_split): choices "
      "read on it are optimistic; set --config.data.val_split=held_out to hold validation images "
      "out of the training split"
    )
  elif val_split == data.train_split:
    raise ConfigError(
      f"config.data.val_split={val_split!r} is the training split itself, so validation would "
      "overlap training; set --config.data.val_split=held_out to hold images out of it"
    )


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Fails fast with a message that names the field and the fix."""
  unset = _unset(c, REQUIRED) + _unset(c, REQUIRED_BY_MODE.get(c.mode, ()))
  if unset:
    raise ValueError(
      f"{', '.join(unset)} not set: a config file sets them (base_config() holds only "
      "placeholders); see configs/vits_cifar100.py for a complete one"
    )
  check_choices(c)
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
  _validate_validation(c.data)
  if c.batch_size <= 0:
    raise ConfigError(f"config.batch_size={c.batch_size} must be positive")
  if not isinstance(c.eval_every_epochs, int) or c.eval_every_epochs < 1:
    raise ConfigError(
      f"config.eval_every_epochs={c.eval_every_epochs!r} must be a positive integer"
    )
  steps_per_call = c.get("steps_per_call", 1)
  if not isinstance(steps_per_call, int) or isinstance(steps_per_call, bool) or steps_per_call < 0:
    raise ConfigError(
      f"config.steps_per_call={steps_per_call!r} must be an integer >= 0 (1: one step a call; "
      f"0: {ACCELERATOR_STEPS_PER_CALL} on accelerators, 1 on CPUs)"
    )
  if num_devices is not None:
    check_devices(c, num_devices)
  _validate_schedule(c)
  _validate_hint_variants(c)
  _validate_distillation(c)
  _validate_recipe(c)


def _validate_schedule(c: ml_collections.ConfigDict) -> None:
  """The multistep schedule's milestones (increasing fractions in (0, 1)) and gamma (in (0, 1])."""
  if c.optim.schedule != "multistep":
    return
  milestones = tuple(c.optim.get("milestones", ()))
  numbers = all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in milestones)
  if (
    not milestones
    or not numbers
    or not all(0.0 < m < 1.0 for m in milestones)
    or any(a >= b for a, b in zip(milestones, milestones[1:]))
  ):
    raise ConfigError(
      f"config.optim.milestones={milestones!r} must be increasing fractions of the steps in "
      "(0, 1), e.g. (0.5, 0.75)"
    )
  gamma = c.optim.get("gamma", 0.1)
  if not 0.0 < gamma <= 1.0:
    raise ConfigError(f"config.optim.gamma={gamma} must be in (0, 1] (the lr's factor)")


def _validate_hint_variants(c: ml_collections.ConfigDict) -> None:
  """The variants of the feature term and the agent's start (configs/common.py's switches)."""
  loss = c.loss
  if not 0.0 < loss.feature_until <= 1.0:
    raise ConfigError(
      f"config.loss.feature_until={loss.feature_until} must be in (0, 1] (the fraction of the "
      "steps with the hint on; 1 is the official recipe)"
    )
  if not 0.0 <= loss.feature_gate < 1.0:
    raise ConfigError(
      f"config.loss.feature_gate={loss.feature_gate} must be in [0, 1) (the agent's running train "
      "top-1 that switches the hint on; 0 is the official recipe)"
    )
  layers = loss.feature_layers
  if not isinstance(layers, int) or layers < 0 or (layers > 0 and layers > c.model.depth):
    raise ConfigError(
      f"config.loss.feature_layers={loss.feature_layers!r} must be an integer in "
      f"[0, {c.model.depth}] (the last k paired layers; 0: all, the official recipe)"
    )
  if loss.feature_balance < 0:
    raise ConfigError(
      f"config.loss.feature_balance={loss.feature_balance} must be >= 0 (0: off, the official "
      "recipe)"
    )
  hint_variant = (
    loss.feature_loss != "official"
    or loss.feature_until < 1.0
    or loss.feature_gate > 0
    or loss.feature_layers > 0
    or loss.feature_projector != "none"
    or loss.feature_balance > 0
    or bool(loss.get("hint_pairs", ""))
  )
  if hint_variant and (c.mode not in ("joint", "shared") or not loss.feature_vit):
    raise ConfigError(
      f"a feature-term variant is set but mode {c.mode!r} with config.loss.feature_vit="
      f"{loss.feature_vit} has no feature term; use mode joint or shared with a feature weight"
    )
  if c.get("agent_frozen_eval", False) and not c.agent_frozen:
    raise ConfigError(
      "config.agent_frozen_eval (teacher_eval=1) runs a frozen agent in evaluation mode; set "
      "config.agent_frozen (frozen=1) too"
    )
  _validate_teacher(c)
  if (c.agent_init_from or c.agent_frozen) and c.mode != "joint":
    raise ConfigError(
      f"config.agent_init_from / config.agent_frozen are joint-mode variants (the agent has its "
      f"own weights there); mode {c.mode!r} cannot use them"
    )


def _validate_teacher(c: ml_collections.ConfigDict) -> None:
  """A CNN in the agent's place (joint) and the hint's pairs of teacher maps and ViT layers."""
  if c.cnn.name and c.mode not in ("cnn", "joint"):
    raise ConfigError(
      f"config.cnn.name={c.cnn.name!r} names the CNN of mode cnn, or joint's teacher in the "
      f"agent's place; mode {c.mode!r} trains no CNN: drop it"
    )
  spec = c.loss.get("hint_pairs", "")
  if not spec:
    return
  try:
    pairs = choices.parse_hint_pairs(spec)
  except ValueError as error:
    raise ConfigError(f"config.loss.hint_pairs={spec!r}: {error}") from None
  stages = choices.CNN_STAGES[c.cnn.name] if c.cnn.name else c.model.depth
  teacher = f"the {c.cnn.name}" if c.cnn.name else "the agent"
  layers = [layer for _, layer in pairs]
  bad = [f"{t}:{layer}" for t, layer in pairs if t >= stages or layer >= c.model.depth]
  if bad or len(set(layers)) != len(layers) or c.loss.feature_layers:
    raise ConfigError(
      f"config.loss.hint_pairs={spec!r}: each pair is TEACHER:LAYER with {teacher}'s maps "
      f"0..{stages - 1} and the ViT's layers 0..{c.model.depth - 1}, each layer at most once, "
      f"and config.loss.feature_layers left at 0{f'; not {bad[0]}' if bad else ''}"
    )


def _validate_recipe(c: ml_collections.ConfigDict) -> None:
  """The field's recipe (data/recipe_augment.py): a known policy, alphas >= 0, probabilities."""
  spec = c.data.get("randaugment", "")
  if spec:
    try:
      randaugment_policy.parse_policy(spec)
    except ValueError as error:
      raise ConfigError(f"config.data.randaugment={spec!r}: {error}") from None
  fields = {
    "config.mix.mixup_alpha": (c.mix.mixup_alpha, 0.0, None),
    "config.mix.cutmix_alpha": (c.mix.cutmix_alpha, 0.0, None),
    "config.mix.prob": (c.mix.prob, 0.0, 1.0),
    "config.mix.switch_prob": (c.mix.switch_prob, 0.0, 1.0),
    "config.data.random_erase": (c.data.random_erase, 0.0, 1.0),
    "config.loss.label_smoothing": (c.loss.label_smoothing, 0.0, 1.0),
    "config.model.drop_path": (c.model.drop_path, 0.0, 1.0),
    "config.agent.drop_path": (c.agent.drop_path, 0.0, 1.0),
  }
  for name, (value, low, high) in fields.items():
    if not isinstance(value, (int, float)) or isinstance(value, bool):
      raise ConfigError(f"{name}={value!r} must be a number")
    if value < low:
      raise ConfigError(f"{name}={value} must be >= {low:g} (0: off)")
    if high is not None and value > high:
      raise ConfigError(f"{name}={value} must be in [{low:g}, {high:g}] (a probability or rate)")
  for name in ("config.loss.label_smoothing", "config.model.drop_path", "config.agent.drop_path"):
    if fields[name][0] >= 1.0:
      raise ConfigError(f"{name}={fields[name][0]} must be below 1 (1 would remove all signal)")


def _validate_distillation(c: ml_collections.ConfigDict) -> None:
  """DeiT's hard distillation (distill=hard): a token and its loss, together, from a joint agent."""
  token, weight = c.model.get("distill_token", False), c.loss.get("distill_vit", 0.0)
  if not token and not weight:
    return
  if not (token and weight > 0):
    raise ConfigError(
      f"config.model.distill_token={token} with config.loss.distill_vit={weight}: the "
      "distillation token and its loss go together (the switch distill=hard sets both)"
    )
  if c.mode != "joint":
    raise ConfigError(
      f"distill=hard needs the agent as its teacher (mode joint); mode {c.mode!r} has none"
    )
  clashes = {
    "config.model.init": c.model.init if c.model.init in choices.ATTENTION_INITS else None,
    "config.init_from": c.init_from or None,
  }
  clashes = {k: v for k, v in clashes.items() if v is not None}
  if clashes:
    named = ", ".join(f"{k}={v!r}" for k, v in clashes.items())
    raise ConfigError(
      f"distill=hard cannot be combined with {named}: it reads or writes the tokens as "
      "[cls, patches] and the distillation token would sit among them"
    )


def check_devices(c: ml_collections.ConfigDict, num_devices: int) -> None:
  """The checks that need the device count (known once JAX has started)."""
  if c.data.get("pipeline", "tfdata") == "device" and c.data.eval_batch_size % num_devices:
    raise ConfigError(
      f"config.data.eval_batch_size={c.data.eval_batch_size} is not divisible by the "
      f"{num_devices} devices; use a multiple of {num_devices}"
    )
  if c.batch_size % num_devices:
    raise ConfigError(
      f"config.batch_size={c.batch_size} is not divisible by the {num_devices} devices; "
      f"use a multiple of {num_devices}"
    )
