"""The training step of every mode as one pure function `train_step(state, batch)`.

Every mode computes two gradient pytrees over the one parameter tree:
  g_V = d L_vit / d params   (pulled back through the ViT's forward only)
  g_A = d L_agent / d params (pulled back through the agent's forward only)
Teachers are under stop_gradient, so L_vit reaches the agent's outputs not at all and vice versa.
Each forward is differentiated once with its own `jax.vjp`, so the two gradients cost one
backward pass of each model, not two passes of both.
  vit / agent: one model, g = its gradient.
  joint:  g_V lives on params["vit"], g_A on params["agent"]; g = g_V + g_A (each model updated
          by its own loss, with global-batch gradients for both).
  shared: params["agent"] holds only the agent's private weights and the agent reads
          params["vit"]; on the tied entries g = (g_V + Align(g_A | g_V)) / 2, elsewhere each
          leaf's own gradient (Algorithm 1); align="none" gives g_V + g_A, the gradient of the
          summed losses (the official code).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vitboot_jax.data import recipe_augment
from vitboot_jax.method import align as align_lib
from vitboot_jax.method import drloc, losses
from vitboot_jax.models import sharing
from vitboot_jax.models.build import ModelSet
from vitboot_jax.state import TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
StepFn = Callable[[TrainState, Any], tuple[TrainState, Metrics]]
# Draws the gradient of a model with a feature term from its loss, in place of one pullback of
# the whole loss: (loss as a function of (own outputs, loss params, parts), own outputs, loss
# params, pullback of the forward, d loss / d outputs, d loss / d loss params) -> (gradient on
# the params, on the loss params, metrics).
HintGradient = Callable[..., tuple[Any, Any, Metrics]]
# A variant of how a step applies the ViT's feature term (hint_variants.Variants.hint): (state,
# the official weight w(t)) -> (the weight applied, the ViT's HintGradient or None).
Hint = Callable[[TrainState, jax.Array], tuple[jax.Array, HintGradient | None]]


def _accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))


# The weighted terms of a model's loss, in the order they are summed.
PARTS = ("ce", "kd", "distill", "feature", "drloc")


def model_loss(
  config: ml_collections.ConfigDict,
  name: str,
  outputs: dict[str, Any],
  labels: jax.Array,
  feature_weight: jax.Array,
  drloc_task: drloc.Task | None = None,
  *,
  projectors: dict[str, Any] | None = None,
  parts: tuple[str, ...] = PARTS,
  targets: jax.Array | None = None,
  pairs: tuple[tuple[int, int], ...] | None = None,
) -> tuple[jax.Array, Metrics]:
  """The weighted loss of model `name` ("vit", "agent" or "cnn") and its terms.

  L_vit   = ce_vit CE + kd_vit KD(vit <- sg agent) + feature_vit w(t) sum_l feat_l(vit, sg agent)
  L_agent = ce_agent CE + kd_agent KD(agent <- sg vit)
  and, with a distillation token (a variant), distill_vit CE(the ViT's distillation head,
  argmax of the agent's logits): DeiT's hard distillation.
  plus drloc.weight L_drloc for a model with a `drloc_task`. Terms whose weight is 0, or whose
  partner model is absent, are left out. `projectors`: the ViT's hint projector (a variant);
  `parts` (of PARTS): which weighted terms the returned loss sums (all: the loss; one: that
  term's share, for gradients split by term). `targets` (the field's recipe: smoothed or mixed
  labels, data/recipe_augment.py) replace the labels in the CE; the KD, distillation and hint
  terms read the partner's outputs on the same (mixed) images, and top-1 stays the labels'.
  `pairs`: which partner map feeds which ViT layer (ModelSet.hint_pairs; None: by index). The
  partner "agent" may be a CNN teacher (models/build.py); its maps are then its stages.
  """
  w = config.loss
  other = {"vit": "agent", "agent": "vit"}.get(name)  # CNN baselines have no partner.
  logits, extras = outputs[name]
  ce = losses.cross_entropy if targets is None else losses.soft_cross_entropy
  terms = {
    f"ce_{name}": ce(logits, labels if targets is None else targets),
    f"top1_{name}": _accuracy(logits, labels),
  }
  weighted = {"ce": w[f"ce_{name}"] * terms[f"ce_{name}"]}
  if other in outputs and w[f"kd_{name}"]:
    terms[f"kd_{name}"] = losses.kd(logits, outputs[other][0], w.temperature)
    weighted["kd"] = w[f"kd_{name}"] * terms[f"kd_{name}"]
  if other in outputs and name == "vit" and w.get("distill_vit", 0.0):
    teacher = jnp.argmax(outputs[other][0], -1)
    terms["distill_vit"] = losses.cross_entropy(extras["dist_logits"], teacher)
    terms["top1_dist_vit"] = _accuracy(extras["dist_logits"], labels)
    weighted["distill"] = w.distill_vit * terms["distill_vit"]
  if other in outputs and name == "vit" and w.feature_vit:
    feature, per_layer = losses.feature_losses(
      outputs["vit"][1]["features"],
      outputs["agent"][1]["features"],
      formula=w.feature_loss,
      adapt=w.adapt,
      last=w.get("feature_layers", 0),
      projectors=projectors,
      pairs=pairs,
    )
    terms["feature"] = feature
    terms.update({f"feature_{layer}": value for layer, value in per_layer.items()})
    weighted["feature"] = w.feature_vit * feature_weight * feature
  if drloc_task is not None:
    terms[f"drloc_{name}"] = drloc.task_loss(drloc_task, extras, config.drloc)
    weighted["drloc"] = config.drloc.weight * terms[f"drloc_{name}"]
  total = jnp.zeros((), jnp.float32)
  summed = [weighted[part] for part in PARTS if part in weighted and part in parts]
  if summed:  # Summed left to right from the first term, as the official loss is.
    total = summed[0]
    for value in summed[1:]:
      total += value
  return total, terms


def model_gradients(
  config: ml_collections.ConfigDict,
  models: ModelSet,
  variables: dict[str, Any],
  batch: Batch,
  rng: jax.Array,
  feature_weight: jax.Array,
  hint_gradient: HintGradient | None = None,
) -> tuple[dict[str, Any], dict[str, Any], Metrics]:
  """({name: gradient of that model's loss w.r.t. all params}, new batch_stats, loss terms).

  `hint_gradient` (a variant's; None: one pullback of the loss, the official recipe) draws the
  gradient of the model with a feature term, the ViT, from its loss.
  """
  images, labels, targets = batch["image"], batch["label"], batch.get("target")
  outputs, pullbacks, new_stats = {}, {}, dict(variables["batch_stats"])
  frozen = config.get("agent_frozen", False)
  for name in models.names:
    if name == "agent" and frozen and config.get("agent_frozen_eval", False):
      # A finished teacher predicts as at inference: no dropout, its BatchNorm's running stats.
      outputs[name] = models.apply(variables, images, train=False, names=(name,))[0][name]
      continue

    def forward(params, name=name):
      out, stats = models.apply(
        {**variables, "params": params}, images, train=True, rng=rng, names=(name,)
      )
      return out[name], stats.get(name)

    outputs[name], pullbacks[name], stats = jax.vjp(forward, variables["params"], has_aux=True)
    if stats is not None:
      new_stats[name] = stats

  grads, terms = {}, {}
  for name in models.names:
    setting = models.drloc.get(name)
    # Parameters the loss reads but the forward does not: the DrLoc head, the hint projector.
    loss_params = models.loss_params(name, variables["params"])

    # The loss as a function of this model's own outputs and loss parameters; the partner's
    # outputs are teachers.
    def loss_of_own_output(own, loss_params, parts=PARTS, name=name, setting=setting):
      task = None
      if setting:
        task_rng = jax.random.fold_in(rng, drloc.RNG_STREAM + models.names.index(name))
        task = drloc.Task(setting, loss_params[f"drloc_{name}"], task_rng)
      return model_loss(
        config,
        name,
        {**outputs, name: own},
        labels,
        feature_weight,
        task,
        projectors=loss_params.get(f"hint_{name}"),
        parts=parts,
        targets=targets,
        pairs=models.hint_pairs,
      )

    (loss, model_terms), (cotangent, loss_params_grad) = jax.value_and_grad(
      loss_of_own_output, argnums=(0, 1), has_aux=True
    )(outputs[name], loss_params)
    if hint_gradient is not None and "feature" in model_terms:
      grads[name], loss_params_grad, hint_metrics = hint_gradient(
        loss_of_own_output, outputs[name], loss_params, pullbacks[name], cotangent, loss_params_grad
      )
      terms.update(hint_metrics)
    elif name == "agent" and frozen:
      # A frozen teacher is never updated (its chain is set_to_zero): no backward through it.
      grads[name] = jax.tree.map(jnp.zeros_like, variables["params"])
    else:
      (grads[name],) = pullbacks[name](cotangent)
    # The forward never reads the loss params, so their pulled-back gradient is zero.
    grads[name] = {**grads[name], **loss_params_grad}
    terms.update(model_terms)
    terms[f"loss_{name}"] = loss
  return grads, new_stats, terms


def make_train_step(
  config: ml_collections.ConfigDict,
  models: ModelSet,
  tx: optax.GradientTransformation,
  schedule: Callable[[jax.Array], jax.Array],
  steps_per_epoch: int,
  prepare: Callable[[jax.Array], jax.Array],
  hint: Hint | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
  """Returns the pure `train_step(state, batch) -> (state, metrics)`; jit it with donation.

  `prepare` finishes the shipped images on the device (step_preprocess.make_prepare, built once
  by the caller). `hint` (None: the official recipe) is the one seam of the mechanism study's
  variants (hint_variants.wrap), asked once a step for the hint's weight and the ViT's gradient.
  """
  names = models.names
  # The model input of every model: prepare (resize, normalise), and the field's recipe if on.
  batch_fn = recipe_augment.make_batch_fn(config, prepare)

  def direction(params, batch_stats, batch, rng, weight, hint_gradient=None):
    """The update direction of the mode at `params`, the new BatchNorm stats and metrics."""
    variables = {"params": params, "batch_stats": batch_stats}
    grads, new_stats, terms = model_gradients(
      config, models, variables, batch, rng, weight, hint_gradient
    )
    metrics = {f"train/{k}": v for k, v in terms.items()}
    if len(names) == 1:
      grad = grads[names[0]]
    elif models.shared:
      grad, info = align_lib.combine(
        grads["vit"],
        grads["agent"],
        sharing.shared_mask(params),
        method=config.align,
        granularity=config.align_granularity,
      )
      metrics["train/align_cosine"] = info["cosine"]
      metrics["train/align_conflict"] = info["conflict"]
      metrics["train/align_conflict_fraction"] = info["conflict_fraction"]
    else:  # joint: each gradient lives on its own model's subtree.
      grad = jax.tree.map(jnp.add, grads["vit"], grads["agent"])
    for name in names:
      metrics[f"train/grad_norm_{name}"] = optax.global_norm(grads[name])
    metrics["train/grad_norm"] = optax.global_norm(grad)
    return grad, new_stats, metrics

  def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    batch = batch_fn(batch, rng)  # Uint8 crops: resized on the device.
    weight = losses.feature_weight(
      state.step, steps_per_epoch, config.num_epochs, per=config.loss.feature_decay
    )
    hint_gradient = None
    if hint is not None:
      weight, hint_gradient = hint(state, weight)
    grad, new_stats, metrics = direction(
      state.params, state.batch_stats, batch, rng, weight, hint_gradient
    )
    if config.sam.rho > 0:
      # SAM: ascend to w + rho g/||g|| (global norm of the global-batch direction), take the
      # mode's direction there, and apply it at w. BatchNorm statistics come from the first
      # pass; the perturbed pass reuses the same dropout masks.
      scale = config.sam.rho / (optax.global_norm(grad) + 1e-12)
      perturbed = jax.tree.map(lambda p, g: p + scale * g.astype(p.dtype), state.params, grad)
      grad, _, _ = direction(perturbed, state.batch_stats, batch, rng, weight, hint_gradient)
      metrics["train/sam_grad_norm"] = optax.global_norm(grad)

    updates, opt_state = tx.update(grad, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["train/lr"] = schedule(state.step)
    metrics["train/feature_weight"] = weight
    new_state = state.replace(
      step=state.step + 1, params=params, batch_stats=new_stats, opt_state=opt_state
    )
    return new_state, metrics

  return train_step


def make_multi_step(step_fn: StepFn, num_steps: int) -> Callable[..., tuple[TrainState, Metrics]]:
  """Returns `multi_step(state, xs=None) -> (state, metrics)`: `num_steps` optimiser steps in one
  lax.scan, so one jitted call (jit it with donation) is not paced by the host per step.

  Step i runs `step_fn(state, x_i)`: x_i is xs[i] when xs is given (a pytree with a leading
  [num_steps] axis, e.g. stacked host batches), else None (a step that derives its batch from the
  carried state). Every metric comes back stacked, [num_steps] leading.
  """
  if num_steps < 1:
    raise ValueError(f"num_steps={num_steps} must be at least 1")

  def multi_step(state: TrainState, xs: Any = None) -> tuple[TrainState, Metrics]:
    return jax.lax.scan(step_fn, state, xs, length=num_steps)

  return multi_step
