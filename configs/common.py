"""What the config files share: arg parsing, the dataset blocks and the loss weights per mode.

Config files import it as `from configs import common` (run from the repository root, as every
command in the docs does).
"""

from __future__ import annotations

import ml_collections

from vitboot_jax.base.errors import unknown_choice
from vitboot_jax.data.randaugment_policy import DEIT_POLICY

# Loss weights of each mode, the official configs' values. Joint: ce 1, kd 1, feature 10; shared:
# half of each. The paper's Eq. 9 text names alpha=1, beta=10 the other way round; the official
# configs (which produced the tables) put 10 on the feature term. Single-model modes: ce only.
LOSS_WEIGHTS = {
  "vit": dict(ce_vit=1.0, ce_agent=1.0, kd_vit=0.0, kd_agent=0.0, feature_vit=0.0),
  "agent": dict(ce_vit=1.0, ce_agent=1.0, kd_vit=0.0, kd_agent=0.0, feature_vit=0.0),
  "cnn": dict(ce_vit=1.0, ce_agent=1.0, kd_vit=0.0, kd_agent=0.0, feature_vit=0.0),
  "joint": dict(ce_vit=1.0, ce_agent=1.0, kd_vit=1.0, kd_agent=1.0, feature_vit=10.0),
  "shared": dict(ce_vit=0.5, ce_agent=0.5, kd_vit=0.5, kd_agent=0.5, feature_vit=5.0),
}


def loss_weights(mode: str) -> dict:
  """The official loss weights of `mode` (LOSS_WEIGHTS), with a clear error for a typo."""
  if mode not in LOSS_WEIGHTS:
    raise ValueError(unknown_choice("mode", mode, LOSS_WEIGHTS))
  return LOSS_WEIGHTS[mode]


def agent_stem(kind: str) -> str:
  """The agent= arg, the paper's agent kinds, as config.agent.stem: "res_like" or "base" (the
  ViT-like patch stem, config.agent.stem="patch")."""
  stems = {"res_like": "res_like", "base": "patch"}
  if kind not in stems:
    raise ValueError(unknown_choice("agent", kind, stems))
  return stems[kind]


# The method switches every ViT config accepts as args, with their off values (see switches()).
SWITCHES = dict(
  sam=0.0,
  attention="softmax",
  init=None,  # official unless a recipe sets its own; init= given always wins.
  drloc=0.0,
  taps="official",
  align="pcgrad",
  kd=None,
  feature=None,
  decay="epoch",
  adapt="seq1d",
  # Variants of the feature (hint) term and the agent's start: the mechanism study (README).
  form="official",
  layers=0,
  projector="none",
  balance=0.0,
  until=1.0,
  gate=0.0,
  teacher="",
  teacher_cnn="",
  frozen=False,
  teacher_eval=False,
  # DeiT's hard distillation from the agent (the "Can the agent help?" study).
  distill="none",
  # The field's recipe (data/recipe_augment.py): recipe=deit turns on the set below with DeiT's
  # values; each can also be set alone (and overrides the recipe's value).
  recipe="none",
  randaug=None,
  erase=None,
  mixup=None,
  cutmix=None,
  smoothing=None,
  drop_path=None,
)

# Labelled recipes (recipe=NAME): no paper row uses one. Each sets the augmentation and
# regularisation below (AUGMENT) and may set config.optim fields ("optim") and the ViT's init
# ("init", unless init= is given). DeiT's (Touvron et al. 2021, its main.py defaults for DeiT-S):
# RandAugment rand-m9-mstd0.5-inc1, random erasing 0.25 ('pixel'), mixup 0.8 and CutMix 1.0 (one a
# batch, switch probability 0.5), label smoothing 0.1, drop path 0.1.
AUGMENT = ("randaug", "erase", "mixup", "cutmix", "smoothing", "drop_path")
RECIPES = {
  "none": dict(randaug="", erase=0.0, mixup=0.0, cutmix=0.0, smoothing=0.0, drop_path=0.0),
  "deit": dict(
    randaug=DEIT_POLICY, erase=0.25, mixup=0.8, cutmix=1.0, smoothing=0.1, drop_path=0.1
  ),
  # The small-data baseline (docs/results.md, "An honest ViT baseline"): the screening grid's
  # winner on a validation split, the quickstart ViT on 5,000 CIFAR-10 images at 100 epochs.
  # Warmup, no decay on norms, biases and embeddings, clipping at 1.0 (big_vision, timm); DeiT's
  # RandAugment at magnitude 5 instead of 9, its smoothing, half its drop path; timm's init.
  "small_data": dict(
    randaug="rand-m5-mstd0.5-inc1",
    erase=0.0,
    mixup=0.0,
    cutmix=0.0,
    smoothing=0.1,
    drop_path=0.05,
    optim=dict(warmup_epochs=5.0, decay_all=False, clip_norm=1.0),
    init="standard",
  ),
}


def parse_arg(arg: str | None, **spec) -> ml_collections.ConfigDict:
  """Parses "mode=joint,agent=base" against `spec` (name=default), big_vision style.

  Values take the type of their default (int, float, bool or str; a None default keeps the
  string); a name not in `spec` fails, naming the ones the config accepts.
  """
  out = ml_collections.ConfigDict(spec, type_safe=False)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config arg {item!r} must look like key=value (e.g. mode=joint)")
    key, value = (part.strip() for part in item.split("=", 1))
    if key not in spec:
      raise ValueError(f"config arg {key!r} is unknown; this config takes {sorted(spec)}")
    default = spec[key]
    if isinstance(default, bool):
      out[key] = value.lower() in ("1", "true", "yes")
    elif isinstance(default, (int, float)):
      out[key] = type(default)(value)
    else:
      out[key] = value
  return out


def switches(c: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
  """The method switches (args of SWITCHES), one config field each.

  sam=RHO (sam=1 means the official rho 0.1), attention=entmax (the "Sparse" rows),
  init=mimetic|impulse3|impulse5|standard, drloc=LAMBDA, taps=centered, align=none|pcgrad
  (shared: the authors' code | the paper's Algorithm 1), and Table 4's loss ablations: kd=W (both
  KD weights; kd=0 is "Feat Only"), feature=W (feature=0 is "KD Only"), decay=epoch|step|none
  ("No Decay"), adapt=seq1d|pool2d ("AP-2D"). kd= and feature= unset keep the mode's weights.

  Variants of the feature term and of the agent's start, none in the paper or the authors' code
  (the mechanism study; each off by default): form=paper (Eq. 6's L2-normalised distance instead of
  the official LayerNorm-MSE) or form=corr (1 - the correlation over positions, per channel: no
  reward for one token shared by all positions), layers=K (the last K layer pairs only),
  projector=linear (a learnable linear map of the ViT's tokens before the loss, FitNets), balance=C
  (the hint's gradient on the ViT at most C times the CE's), until=F (the hint during the first
  fraction F of the steps only), gate=A (the hint off until the agent's running train top-1 reaches
  A), teacher=PATH (joint: the agent starts from a run of ours), teacher_cnn=NAME (joint: a CNN of
  models/choices.CNNS in the agent's place, read by teacher= from a mode=cnn run of it; the hint
  pairs its stages with ViT layers, --config.loss.hint_pairs=T:L,T:L or evenly spaced) and frozen=1
  (joint: the agent's weights never change; its BatchNorm runs in training mode and its running
  statistics move, unless teacher_eval=1: it then predicts in evaluation mode, without dropout,
  from its running statistics).
  distill=hard (joint; DeiT, Touvron et al. 2021): a distillation token after cls whose own head
  learns the agent's argmax, the ViT's loss 1/2 CE + 1/2 CE(distillation head, agent argmax) as
  DeiT's, evaluation the mean of the two heads' logits.
  """
  c.sam.rho = 0.1 if arg.sam == 1 else arg.sam
  c.model.attention = arg.attention
  c.model.init = arg.init or "official"
  c.drloc.weight = arg.drloc
  c.agent.taps = arg.taps
  c.align = arg.align
  if arg.kd is not None:
    c.loss.kd_vit = c.loss.kd_agent = float(arg.kd)
  if arg.feature is not None:
    c.loss.feature_vit = float(arg.feature)
  c.loss.feature_decay = arg.decay
  c.loss.adapt = arg.adapt
  c.loss.feature_loss = arg.form
  c.loss.feature_layers = arg.layers
  c.loss.feature_projector = arg.projector
  c.loss.feature_balance = arg.balance
  c.loss.feature_until = arg.until
  c.loss.feature_gate = arg.gate
  c.agent_init_from = arg.teacher
  if arg.teacher_cnn:
    c.cnn.name = arg.teacher_cnn
  c.agent_frozen = arg.frozen
  c.agent_frozen_eval = arg.teacher_eval
  if arg.distill not in ("none", "hard"):
    raise ValueError(unknown_choice("distill", arg.distill, ("none", "hard")))
  if arg.distill == "hard":
    c.model.distill_token = True
    c.loss.ce_vit = c.loss.distill_vit = 0.5
  recipe(c, arg)


def recipe(c: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
  """recipe=NAME (RECIPES) and its parts alone: randaug=POLICY, erase=P, mixup=ALPHA, cutmix=ALPHA,
  smoothing=S, drop_path=R (the ViT's, and the agent's where the agent trains: not a frozen
  teacher); a recipe's optimizer fields and init too (init= given keeps its own)."""
  if arg.recipe not in RECIPES:
    raise ValueError(unknown_choice("recipe", arg.recipe, RECIPES))
  values = dict(RECIPES[arg.recipe])
  for name in AUGMENT:
    if arg[name] is not None:
      values[name] = arg[name] if name == "randaug" else float(arg[name])
  c.optim.update(values.get("optim", {}))
  if arg.init is None and "init" in values:
    c.model.init = values["init"]
  c.data.randaugment = values["randaug"]
  c.data.random_erase = values["erase"]
  c.mix.mixup_alpha = values["mixup"]
  c.mix.cutmix_alpha = values["cutmix"]
  c.loss.label_smoothing = values["smoothing"]
  c.model.drop_path = values["drop_path"]
  trains_agent = arg.mode in ("agent", "shared") or (arg.mode == "joint" and not arg.frozen)
  c.agent.drop_path = values["drop_path"] if trains_agent else 0.0


def cifar(name: str) -> dict:
  """tfds cifar10 / cifar100: the full training set, 32-px images upsampled on the device.

  Train: zero-pad 4, crop 32, flip, resize; test: resize. The CIFAR-100 normalisation reuses the
  CIFAR-10 std, as the official code.
  """
  return dict(
    name=name,
    dir=None,
    train_split="train",
    eval_split="test",
    num_classes={"cifar10": 10, "cifar100": 100}[name],
    train_fraction=1.0,
    augment="cifar",
    normalisation=name,
    stored_size=32,
    shuffle_buffer=50_000,
    cache=True,
    eval_batch_size=256,
    pipeline="tfdata",
  )


def imagenet(subset: float) -> dict:
  """tfds imagenet2012: a per-class `subset` of the training set (nested: 5% inside 10%), the
  full 50k validation set. RandomResizedCrop(0.6-1) + flip; eval resize 256, centre crop 224."""
  return dict(
    name="imagenet2012",
    dir=None,
    train_split="train",
    eval_split="validation",
    num_classes=1000,
    train_fraction=subset,
    augment="imagenet",
    normalisation="imagenet",
    stored_size=0,
    shuffle_buffer=20_000,
    cache=False,  # Does not fit in memory: stream it.
    eval_batch_size=256,
    pipeline="tfdata",  # Images of many sizes, GBs: they stay on the host.
  )


def dataset(name: str, subset: float = 0.1) -> dict:
  """The data block of a paper dataset: "cifar10", "cifar100" or "imagenet" (a `subset`)."""
  if name in ("cifar10", "cifar100"):
    return cifar(name)
  if name == "imagenet":
    return imagenet(subset)
  raise ValueError(unknown_choice("dataset", name, ("cifar10", "cifar100", "imagenet")))


def cifar10_32px() -> dict:
  """The CPU runs' data: tfds cifar10 (prepared on first use) at 32 px, 10% of each class (5,000
  training images), the full 10,000 test images. An image folder of the same images:
  --config.data.name=folder --config.data.dir=ROOT."""
  return dict(
    name="cifar10",
    dir=None,
    train_split="train",
    eval_split="test",
    num_classes=10,
    train_fraction=0.1,
    augment="cifar",
    normalisation="cifar10",
    stored_size=0,
    shuffle_buffer=5000,
    cache=True,
    eval_batch_size=128,  # Faster than 256 or 64 on 2 CPU cores (docs/performance.md).
    pipeline="tfdata",
  )
