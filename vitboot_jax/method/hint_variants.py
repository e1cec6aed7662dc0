"""The mechanism study's variants of the hint (the ViT's feature term), kept apart from the
paper's step: steps.py runs the official recipe and calls this module through one seam, a
`Variants` that `for_config` builds only when a switch is set (None: the official step, unchanged).

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
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vitboot_jax.method import losses

Metrics = dict[str, jax.Array]
# (groups of loss parts) -> per group (its gradient on the params, on the loss params).
Shares = Callable[[list[tuple[str, ...]]], list[tuple[Any, Any]]]

# The gate's running statistics in batch_stats (checkpointed with the state), only when it is set.
GATE = "feature_gate"
GATE_DECAY = 0.98  # The running top-1's time constant: ~50 steps.


def initial_stats(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Training statistics beside the models' BatchNorm ones: the hint gate's, when set."""
  if not config.loss.get("feature_gate", 0.0):
    return {}
  zero = jnp.zeros((), jnp.float32)
  return {GATE: {"top1_ema": zero, "steps": zero, "open": zero}}


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
  """The hint variants of one run (fields: the config's), applied by the step through
  `hint_weight`, `vit_gradient` and `after_step`."""

  until: float
  gate: float
  balance: float
  log_shares: bool
  log_every_steps: int
  total_steps: int

  def hint_weight(
    self, weight: jax.Array, step: jax.Array, batch_stats: dict[str, Any]
  ) -> jax.Array:
    """The hint's weight at `step` with `until` and the gate applied to the official `weight`."""
    if self.until < 1.0:
      weight = weight * losses.hint_on(step, self.total_steps, self.until)
    if self.gate:
      if GATE not in batch_stats:
        raise ValueError(
          "config.loss.feature_gate is set but the state has no gate statistics: create it with "
          "state.create_state(..., stats=hint_variants.initial_stats(config))"
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
    shares: Shares,
    pullback: Callable[[Any], tuple[Any]],
    cotangent: Any,
    loss_params_grad: Any,
    log_hint: jax.Array | bool,
  ) -> tuple[Any, Any, Metrics]:
    """The ViT's gradient (params, loss params) and the norms of its CE and hint shares: with
    `balance`, the hint's share scaled to at most that multiple of the CE share's norm, every
    step; else one pullback of the whole loss, the shares measured when `log_hint`."""
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

  def after_step(
    self, batch_stats: dict[str, Any], new_stats: dict[str, Any], metrics: Metrics
  ) -> tuple[dict[str, Any], Metrics]:
    """`new_stats` with the gate's statistics after the step, `metrics` with its running top-1."""
    if not self.gate:
      return new_stats, metrics
    gate = update_gate(batch_stats[GATE], metrics["train/top1_agent"], self.gate)
    return {**new_stats, GATE: gate}, {**metrics, "train/feature_gate_top1": running_top1(gate)}


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


def _hint_norms(norm_ce: jax.Array, norm_feature: jax.Array) -> Metrics:
  """The ViT's gradient norms of its weighted CE and feature terms, and their ratio."""
  return {
    "grad_norm_ce_share_vit": norm_ce,
    "grad_norm_feature_share_vit": norm_feature,
    "hint_grad_ratio": norm_feature / jnp.maximum(norm_ce, 1e-12),
  }
