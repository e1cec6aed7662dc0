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

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vitboot_jax import align as align_lib
from vitboot_jax import drloc, losses
from vitboot_jax.data import device_preprocess
from vitboot_jax.models import sharing
from vitboot_jax.models.build import ModelSet
from vitboot_jax.state import TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
StepFn = Callable[[TrainState, Any], tuple[TrainState, Metrics]]


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
) -> tuple[jax.Array, Metrics]:
  """The weighted loss of model `name` ("vit", "agent" or "cnn") and its terms.

  L_vit   = ce_vit CE + kd_vit KD(vit <- sg agent) + feature_vit w(t) sum_l feat_l(vit, sg agent)
  L_agent = ce_agent CE + kd_agent KD(agent <- sg vit)
  and, with a distillation token (a variant), distill_vit CE(the ViT's distillation head,
  argmax of the agent's logits): DeiT's hard distillation.
  plus drloc.weight L_drloc for a model with a `drloc_task`. Terms whose weight is 0, or whose
  partner model is absent, are left out. `projectors`: the ViT's hint projector (a variant);
  `parts` (of PARTS): which weighted terms the returned loss sums (all: the loss; one: that
  term's share, for gradients split by term).
  """
  w = config.loss
  other = {"vit": "agent", "agent": "vit"}.get(name)  # CNN baselines have no partner.
  logits, extras = outputs[name]
  terms = {
    f"ce_{name}": losses.cross_entropy(logits, labels),
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
  log_hint: jax.Array | bool = False,
) -> tuple[dict[str, Any], dict[str, Any], Metrics]:
  """({name: gradient of that model's loss w.r.t. all params}, new batch_stats, loss terms).

  Where the ViT has a feature term, the norms of its CE and feature shares of the ViT's gradient
  are measured when `log_hint` is true (one batched pullback of both shares; a traced `log_hint`
  puts it under a conditional, zeros when false; a Python False leaves it and its metrics out),
  or every step with config.loss.feature_balance > 0, which scales the feature share down to at
  most feature_balance x the CE share's norm.
  """
  images, labels = batch["image"], batch["label"]
  outputs, pullbacks, new_stats = {}, {}, dict(variables["batch_stats"])
  for name in models.names:

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
      )

    (loss, model_terms), (cotangent, loss_params_grad) = jax.value_and_grad(
      loss_of_own_output, argnums=(0, 1), has_aux=True
    )(outputs[name], loss_params)
    if "feature" in model_terms:  # The ViT's hint: measure (and with a cap, scale) its share.
      shares = functools.partial(
        _shares, loss_of_own_output, outputs[name], loss_params, pullbacks[name]
      )
      grads[name], loss_params_grad, hint_metrics = _hinted_gradient(
        config, shares, pullbacks[name], cotangent, loss_params_grad, log_hint
      )
      terms.update(hint_metrics)
    else:
      (grads[name],) = pullbacks[name](cotangent)
    # The forward never reads the loss params, so their pulled-back gradient is zero.
    grads[name] = {**grads[name], **loss_params_grad}
    terms.update(model_terms)
    terms[f"loss_{name}"] = loss
  return grads, new_stats, terms


def _hinted_gradient(
  config: ml_collections.ConfigDict,
  shares: Callable[[list[tuple[str, ...]]], list[tuple[Any, Any]]],
  pullback: Callable[[Any], tuple[Any]],
  cotangent: Any,
  loss_params_grad: Any,
  log_hint: jax.Array | bool,
) -> tuple[Any, Any, Metrics]:
  """The ViT's gradient (params, loss params) and the norms of its CE and hint shares.

  Official: one pullback of the whole loss, the shares measured on logging steps only. With
  config.loss.feature_balance > 0, the hint's share is scaled to at most that multiple of the CE
  share's norm, every step.
  """
  balance = config.loss.get("feature_balance", 0.0)
  if balance > 0:
    (g_ce, p_ce), (g_feature, p_feature), (g_rest, p_rest) = shares(
      [("ce",), ("feature",), ("kd", "distill", "drloc")]
    )
    norm_ce, norm_feature = optax.global_norm(g_ce), optax.global_norm(g_feature)
    scale = jnp.minimum(1.0, balance * norm_ce / jnp.maximum(norm_feature, 1e-12))
    combine = lambda c, f, r: c + scale * f + r
    metrics = {**_hint_norms(norm_ce, norm_feature), "feature_balance_scale": scale}
    return (
      jax.tree.map(combine, g_ce, g_feature, g_rest),
      jax.tree.map(combine, p_ce, p_feature, p_rest),
      metrics,
    )
  (grad,) = pullback(cotangent)

  def measure():
    (g_ce, _), (g_feature, _) = shares([("ce",), ("feature",)])
    return _hint_norms(optax.global_norm(g_ce), optax.global_norm(g_feature))

  zeros = lambda: _hint_norms(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
  if isinstance(log_hint, bool):  # Known when traced: no conditional needed.
    return grad, loss_params_grad, measure() if log_hint else {}
  return grad, loss_params_grad, jax.lax.cond(log_hint, measure, zeros)


def _shares(
  loss_fn: Callable[..., tuple[jax.Array, Metrics]],
  own: Any,
  loss_params: dict[str, Any],
  pullback: Callable[[Any], tuple[Any]],
  groups: list[tuple[str, ...]],
) -> list[tuple[Any, Any]]:
  """Per group of loss parts (PARTS): that share's gradient on the params (one batched pullback
  for all groups) and on the loss params."""
  cotangents = [
    jax.grad(lambda o, p, parts=parts: loss_fn(o, p, parts)[0], argnums=(0, 1))(own, loss_params)
    for parts in groups
  ]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[c for c, _ in cotangents])
  (batched,) = jax.vmap(pullback)(stacked)
  return [(jax.tree.map(lambda x, i=i: x[i], batched), p) for i, (_, p) in enumerate(cotangents)]


def _hint_norms(norm_ce: jax.Array, norm_feature: jax.Array) -> Metrics:
  """The ViT's gradient norms of its weighted CE and feature terms, and their ratio."""
  return {
    "grad_norm_ce_share_vit": norm_ce,
    "grad_norm_feature_share_vit": norm_feature,
    "hint_grad_ratio": norm_feature / jnp.maximum(norm_ce, 1e-12),
  }


# The gate of the hint on the agent's running train top-1 (config.loss.feature_gate), kept in
# batch_stats (running statistics, checkpointed with the state) only when the gate is set.
GATE = "feature_gate"
GATE_DECAY = 0.98  # The running top-1's time constant: ~50 steps.


def initial_stats(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Training statistics beside the models' BatchNorm ones: the hint gate's, when set."""
  if not config.loss.get("feature_gate", 0.0):
    return {}
  zero = jnp.zeros((), jnp.float32)
  return {GATE: {"top1_ema": zero, "steps": zero, "open": zero}}


def update_gate(gate: dict[str, jax.Array], top1: jax.Array, threshold: float) -> dict[str, Any]:
  """The gate after a step with the agent's batch top-1 `top1`: a bias-corrected running mean;
  once it reaches `threshold` the gate stays open."""
  ema = GATE_DECAY * gate["top1_ema"] + (1 - GATE_DECAY) * top1
  steps = gate["steps"] + 1
  running = ema / (1 - GATE_DECAY**steps)
  return {
    "top1_ema": ema,
    "steps": steps,
    "open": jnp.maximum(gate["open"], (running >= threshold).astype(jnp.float32)),
  }


def total_steps(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  """The optimiser steps of the run: num_epochs, capped by config.total_steps when positive."""
  total = steps_per_epoch * config.num_epochs
  return min(total, config.total_steps) if config.total_steps > 0 else total


def make_train_step(
  config: ml_collections.ConfigDict,
  models: ModelSet,
  tx: optax.GradientTransformation,
  schedule: Callable[[jax.Array], jax.Array],
  steps_per_epoch: int,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
  """Returns the pure `train_step(state, batch) -> (state, metrics)`; jit it with donation."""
  names = models.names
  prepare = device_preprocess.make_prepare(config)

  total = total_steps(config, steps_per_epoch)
  gate_threshold = config.loss.get("feature_gate", 0.0)

  def direction(params, batch_stats, batch, rng, weight, log_hint=False):
    """The update direction of the mode at `params`, the new BatchNorm stats and metrics."""
    variables = {"params": params, "batch_stats": batch_stats}
    grads, new_stats, terms = model_gradients(
      config, models, variables, batch, rng, weight, log_hint
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
    batch = {**batch, "image": prepare(batch["image"])}  # Uint8 crops: resized on the device.
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    weight = losses.feature_weight(
      state.step, steps_per_epoch, config.num_epochs, per=config.loss.feature_decay
    )
    until = config.loss.get("feature_until", 1.0)
    if until < 1.0:
      weight = weight * losses.hint_on(state.step, total, until)
    gate = state.batch_stats.get(GATE)
    if gate_threshold and gate is None:
      raise ValueError(
        "config.loss.feature_gate is set but the state has no gate statistics: create it with "
        "state.create_state(..., stats=steps.initial_stats(config))"
      )
    if gate is not None:
      weight = weight * gate["open"]
    log_hint = False  # Off: the shares' measurement is not compiled into the step at all.
    if config.log_hint_shares:
      logged = state.step + 1  # The step number the loop logs these metrics under.
      log_hint = (logged % config.log_every_steps == 0) | (logged == total)
    grad, new_stats, metrics = direction(
      state.params, state.batch_stats, batch, rng, weight, log_hint
    )
    if gate is not None:
      new_stats[GATE] = update_gate(gate, metrics["train/top1_agent"], gate_threshold)
      metrics["train/feature_gate_top1"] = new_stats[GATE]["top1_ema"] / (
        1 - GATE_DECAY ** new_stats[GATE]["steps"]
      )
    if config.sam.rho > 0:
      # SAM: ascend to w + rho g/||g|| (global norm of the global-batch direction), take the
      # mode's direction there, and apply it at w. BatchNorm statistics come from the first
      # pass; the perturbed pass reuses the same dropout masks.
      scale = config.sam.rho / (optax.global_norm(grad) + 1e-12)
      perturbed = jax.tree.map(lambda p, g: p + scale * g.astype(p.dtype), state.params, grad)
      grad, _, _ = direction(perturbed, state.batch_stats, batch, rng, weight)
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
