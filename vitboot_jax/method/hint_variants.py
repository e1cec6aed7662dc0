"""The mechanism study's variants of the hint (the ViT's feature term), kept apart from the
paper's step: `wrap` takes the official init and step (steps.make_train_step) and returns them
unchanged where no switch is set, else the variants' (trainer.make_steps calls it, once).

  until=F    (loss.feature_until)   the hint during the first fraction F of the steps only.
  gate=A     (loss.feature_gate)    the hint off until the agent's running train top-1 reaches A,
                                    then on for good; the running top-1 is kept in batch_stats.
  balance=C  (loss.feature_balance) the hint's share of the ViT's gradient scaled down to at most
                                    C times the CE share's norm, every step.
  log_hint_shares                   the norms of the ViT's CE and hint shares on logging steps (a
                                    diagnostic: the update is the same).
The variants of the hint's formula (form=, layers=, projector=) are the loss's own (losses.py and
the model set's projector).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vitboot_jax.state import TrainState

Metrics = dict[str, jax.Array]
StepFn = Callable[[TrainState, Any], tuple[TrainState, Metrics]]
# The ViT's loss as a function of its own outputs, its loss params and the parts it sums
# (steps.PARTS): (loss, terms).
LossFn = Callable[..., tuple[jax.Array, Metrics]]

# The gate's running statistics in batch_stats (checkpointed with the state), only when it is set.
GATE = "feature_gate"
GATE_DECAY = 0.98  # The running top-1's time constant: ~50 steps.


def hint_on(step: jax.Array | int, total_steps: int, until: float) -> jax.Array:
  """1 while `step` < until x total_steps, then 0: the hint for the first part of the run only
  (until=1 keeps it on throughout, the official recipe)."""
  return (jnp.asarray(step) < round(until * total_steps)).astype(jnp.float32)


def running_top1(gate: dict[str, jax.Array]) -> jax.Array:
  """The gate's bias-corrected running mean of the agent's train top-1."""
  return gate["top1_ema"] / (1 - GATE_DECAY ** gate["steps"])


def update_gate(gate: dict[str, jax.Array], top1: jax.Array, threshold: float) -> dict[str, Any]:
  """The gate after a step with the agent's batch top-1 `top1`; once the running top-1 reaches
  `threshold` the gate stays open."""
  new = {"top1_ema": GATE_DECAY * gate["top1_ema"] + (1 - GATE_DECAY) * top1}
  new["steps"] = gate["steps"] + 1
  is_open = (running_top1(new) >= threshold).astype(jnp.float32)
  return {**new, "open": jnp.maximum(gate["open"], is_open)}


@dataclasses.dataclass(frozen=True)
class Variants:
  """The hint variants of one run (fields: the config's), which the official step applies
  through its one seam, `hint` (steps.Hint)."""

  until: float
  gate: float
  balance: float
  log_shares: bool
  log_every_steps: int
  total_steps: int

  def hint(self, state: TrainState, weight: jax.Array) -> tuple[jax.Array, Callable[..., Any]]:
    """The hint at the state's step: its weight (`hint_weight` of the official `weight`) and
    how the ViT's gradient takes it (`vit_gradient`, the shares measured on logged steps)."""
    weight = self.hint_weight(weight, state.step, state.batch_stats)
    return weight, functools.partial(self.vit_gradient, log_hint=self.log_hint(state.step))

  def hint_weight(
    self, weight: jax.Array, step: jax.Array, batch_stats: dict[str, Any]
  ) -> jax.Array:
    """The hint's weight at `step` with `until` and the gate applied to the official `weight`."""
    if self.until < 1.0:
      weight = weight * hint_on(step, self.total_steps, self.until)
    if self.gate:
      if GATE not in batch_stats:
        raise ValueError(
          "config.loss.feature_gate is set but the state has no gate statistics: create it with "
          "the init of hint_variants.wrap (trainer.make_steps)"
        )
      weight = weight * batch_stats[GATE]["open"]
    return weight

  def log_hint(self, step: jax.Array) -> jax.Array | bool:
    """Whether this step measures the shares: on the steps the loop logs (a traced bool), or
    never (a Python False: the measurement is not compiled in)."""
    if not self.log_shares:
      return False
    logged = step + 1  # The step number the loop logs these metrics under.
    return (logged % self.log_every_steps == 0) | (logged == self.total_steps)

  def vit_gradient(
    self,
    loss_fn: LossFn,
    own: Any,
    loss_params: dict[str, Any],
    pullback: Callable[[Any], tuple[Any]],
    cotangent: Any,
    loss_params_grad: Any,
    log_hint: jax.Array | bool = False,
  ) -> tuple[Any, Any, Metrics]:
    """The ViT's gradient (params, loss params) and the norms of its CE and hint shares: with
    `balance`, the hint's share scaled to at most that multiple of the CE share's norm, every
    step; else one pullback of the whole loss, the shares measured when `log_hint`.

    `loss_fn` at `own` (the ViT's outputs) and `loss_params`, `pullback` (of its forward),
    `cotangent` and `loss_params_grad` (the whole loss's gradients): steps.model_gradients'.
    """
    shares = functools.partial(_shares, loss_fn, own, loss_params, pullback)
    if self.balance > 0:
      (g_ce, p_ce), (g_feature, p_feature), (g_rest, p_rest) = shares(
        [("ce",), ("feature",), ("kd", "distill", "drloc")]
      )
      norm_ce, norm_feature = optax.global_norm(g_ce), optax.global_norm(g_feature)
      scale = jnp.minimum(1.0, self.balance * norm_ce / jnp.maximum(norm_feature, 1e-12))
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


def for_config(config: ml_collections.ConfigDict, total_steps: int) -> Variants | None:
  """The run's hint variants, or None where the config runs the official hint."""
  loss = config.loss
  variants = Variants(
    until=loss.get("feature_until", 1.0),
    gate=loss.get("feature_gate", 0.0),
    balance=loss.get("feature_balance", 0.0),
    log_shares=bool(config.get("log_hint_shares", False)),
    log_every_steps=config.log_every_steps,
    total_steps=total_steps,
  )
  official = variants.until >= 1.0 and not (
    variants.gate or variants.balance or variants.log_shares
  )
  return None if official else variants


def wrap(
  config: ml_collections.ConfigDict,
  total_steps: int,
  init: Callable[[jax.Array], TrainState],
  make_step: Callable[..., StepFn],
) -> tuple[Callable[[jax.Array], TrainState], StepFn]:
  """The run's init (rng -> fresh state) and pure train step, from the official ones: `init`
  and `make_step(hint=...)` (steps.make_train_step, all else bound). Where no switch is set they
  are the official ones; else the step applies the variants' `hint`, and with the gate the state
  carries the gate's statistics, updated after each step from the agent's train top-1."""
  variants = for_config(config, total_steps)
  if variants is None:
    return init, make_step()
  step = make_step(hint=variants.hint)
  if not variants.gate:
    return init, step

  def gated_init(rng: jax.Array) -> TrainState:
    state, zero = init(rng), jnp.zeros((), jnp.float32)
    gate = {"top1_ema": zero, "steps": zero, "open": zero}  # Closed, no step seen.
    return state.replace(batch_stats={**state.batch_stats, GATE: gate})

  def train_step(state: TrainState, batch: Any) -> tuple[TrainState, Metrics]:
    new_state, metrics = step(state, batch)
    gate = update_gate(state.batch_stats[GATE], metrics["train/top1_agent"], variants.gate)
    metrics = {**metrics, "train/feature_gate_top1": running_top1(gate)}
    return new_state.replace(batch_stats={**new_state.batch_stats, GATE: gate}), metrics

  return gated_init, train_step


def _shares(
  loss_fn: LossFn,
  own: Any,
  loss_params: dict[str, Any],
  pullback: Callable[[Any], tuple[Any]],
  groups: list[tuple[str, ...]],
) -> list[tuple[Any, Any]]:
  """Per group of loss parts (steps.PARTS): that share's gradient on the params (one batched
  pullback for all groups) and on the loss params."""
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
