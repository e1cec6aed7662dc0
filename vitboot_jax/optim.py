"""Learning-rate schedules and optimizers built from `config.optim`.

The defaults reproduce the official runs (docs/reference/official_pytorch_code.md §4): AdamW over
every parameter and a cosine
schedule stepped once per epoch. The alternatives (per-step cosine with warmup, no decay on
biases/norms/embeddings, torch-style SGD for the CNN baselines) are one config field away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

# Leaves that are never decayed with config.optim.decay_all=False, whatever their rank: the ViT's
# learnable position embedding and cls token are 3-D but are embeddings, not weights.
NO_DECAY_NAMES = frozenset({"pos_embed", "cls"})


def lr_schedule(optim_cfg: Any, steps_per_epoch: int, num_epochs: int) -> optax.Schedule:
  """The learning rate as a function of the (possibly traced) step.

  "cosine_epoch" (official CosineAnnealingLR stepped per epoch): lr * (1 + cos(pi e / E)) / 2 with
  e = floor(step / steps_per_epoch), constant inside an epoch. "cosine_step": the same curve per
  step, reaching 0 after the last step. "constant": lr. "multistep" (torch's MultiStepLR, as He et
  al. 2016's CIFAR ResNets): lr times gamma at each of the milestones, fractions of the steps (He
  et al.: 0.5 and 0.75, 32k and 48k of 64k iterations). Any schedule is preceded by a linear warmup
  of warmup_epochs * steps_per_epoch steps when that is positive (the decay then runs over the
  remaining steps); warmup starts at lr / warmup_steps rather than 0 so no step is wasted.
  """
  if steps_per_epoch <= 0 or num_epochs <= 0:
    raise ValueError(
      f"lr_schedule needs positive steps_per_epoch and num_epochs; got {steps_per_epoch}, "
      f"{num_epochs}"
    )
  name = optim_cfg.schedule
  base_lr = float(optim_cfg.lr)
  warmup_steps = int(round(float(optim_cfg.warmup_epochs) * steps_per_epoch))
  total_steps = num_epochs * steps_per_epoch
  if warmup_steps >= total_steps:
    raise ValueError(
      f"config.optim.warmup_epochs={optim_cfg.warmup_epochs} leaves no steps after warmup "
      f"(config.num_epochs={num_epochs})"
    )
  decay_steps = total_steps - warmup_steps
  decay_epochs = decay_steps / steps_per_epoch
  # Steps after warmup at which "multistep" multiplies the lr by gamma.
  boundaries = [int(round(float(f) * decay_steps)) for f in optim_cfg.get("milestones", ())]
  gamma = float(optim_cfg.get("gamma", 0.1))

  def decay_factor(t: jax.Array) -> jax.Array:
    """Decay in [0, 1] as a function of the integer step `t` counted from the end of warmup."""
    if name == "constant":
      return jnp.ones((), jnp.float32)
    if name == "multistep":
      passed = sum((t >= b).astype(jnp.float32) for b in boundaries)
      return jnp.power(jnp.float32(gamma), passed)
    if name == "cosine_epoch":
      # Integer division: exact epoch boundaries for any step count.
      progress = (t // steps_per_epoch).astype(jnp.float32) / decay_epochs
    else:
      progress = t.astype(jnp.float32) / decay_steps
    progress = jnp.clip(progress, 0.0, 1.0)
    return 0.5 * (1.0 + jnp.cos(math.pi * progress))

  def schedule(step: jax.Array | int) -> jax.Array:
    step = jnp.asarray(step).astype(jnp.int32)
    lr = base_lr * decay_factor(jnp.maximum(step - warmup_steps, 0))
    if warmup_steps > 0:
      ramp = jnp.minimum(1.0, (step + 1).astype(jnp.float32) / warmup_steps)
      lr = jnp.where(step < warmup_steps, base_lr * ramp, lr)
    return lr

  return schedule


def weight_decay_mask(params: Any) -> Any:
  """True for leaves to decay when decay_all is False: matrices/kernels, not embeddings.

  Biases and norm scales (ndim < 2) are excluded, and so are leaves named in NO_DECAY_NAMES.
  """

  def decay(path: tuple[Any, ...], leaf: Any) -> bool:
    last = path[-1] if path else None
    name = getattr(last, "key", getattr(last, "name", None))
    return jnp.ndim(leaf) >= 2 and name not in NO_DECAY_NAMES

  return jax.tree.map_with_path(decay, params)


def owner(key: str) -> str:
  """The model a top-level parameter key belongs to: its own, its DrLoc head "drloc_<model>" and
  its hint projector "hint_<model>" are updated by that model's chain."""
  return key.removeprefix("drloc_").removeprefix("hint_")


def make_optimizer(
  optim_cfg: Any,
  steps_per_epoch: int,
  num_epochs: int,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Builds the optax chain [clip] -> optimizer and returns it with its schedule.

  The train step combines the models' gradients (align.combine) before this chain, so clipping
  and the optimizer see the combined gradient. The schedule is returned so the step can log
  lr(step) without reading optimizer state.
  """
  schedule = lr_schedule(optim_cfg, steps_per_epoch, num_epochs)
  mask = None if optim_cfg.decay_all else weight_decay_mask
  if optim_cfg.name == "adamw":
    # Decoupled decay scaled by lr, exactly torch.optim.AdamW.
    opt = optax.adamw(
      learning_rate=schedule,
      b1=optim_cfg.b1,
      b2=optim_cfg.b2,
      eps=optim_cfg.eps,
      weight_decay=optim_cfg.weight_decay,
      mask=mask,
    )
  else:  # "sgd": configlib.validate checked the config's choice.
    # torch.optim.SGD: decay is added to the gradient before momentum (L2, not decoupled), and the
    # first momentum buffer equals the gradient, which optax.trace reproduces.
    momentum = float(optim_cfg.momentum)
    opt = optax.chain(
      optax.add_decayed_weights(optim_cfg.weight_decay, mask=mask),
      optax.sgd(learning_rate=schedule, momentum=momentum if momentum > 0 else None),
    )
  stages = []
  if optim_cfg.clip_norm > 0:
    stages.append(optax.clip_by_global_norm(optim_cfg.clip_norm))
  stages.append(opt)
  return optax.chain(*stages), schedule


def mode_optimizer(
  config: ml_collections.ConfigDict, names: Sequence[str], steps_per_epoch: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """`make_optimizer` for a mode training the models `names` (ModelSet.names).

  Joint mode gives each model its own copy of the chain (and its own clipping); every other mode
  updates its one parameter tree with one chain. A model's loss parameters (its DrLoc head
  "drloc_<name>", the ViT's hint projector "hint_vit") belong to that model's chain, as they do
  in single-model modes. config.agent_frozen (a joint variant) gives the agent no updates.
  """
  tx, schedule = make_optimizer(config.optim, steps_per_epoch, config.num_epochs)
  if config.mode == "joint":
    labels = lambda params: {k: jax.tree.map(lambda _, k=k: owner(k), v) for k, v in params.items()}
    chains = {name: tx for name in names}
    if config.get("agent_frozen", False):
      chains["agent"] = optax.set_to_zero()
    tx = optax.multi_transform(chains, labels)
  return tx, schedule
