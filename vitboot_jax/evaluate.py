"""Exact evaluation of every model: each example counted once, padding masked out.

The jitted step returns per-batch *sums* (correct top-1/top-5 and CE, weighted by the mask);
the host adds them up and divides by the number of real examples at the end, so the result does
not depend on the batch size (the official code averages per-batch accuracies instead).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vitboot_jax.method import losses
from vitboot_jax.models.build import ModelSet


def label_rank(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Each label's position in lax.top_k's order of its row (larger first, ties to the lower
  class index); a row with a non-finite logit ranks beyond every k. Row-local, so a
  batch-sharded step needs no gather (XLA does not partition top_k: it gathered every device's
  logits)."""
  num_classes = logits.shape[-1]
  label_logit = jnp.take_along_axis(logits, labels[:, None], axis=-1)
  classes = jnp.arange(num_classes)
  tied_before = (logits == label_logit) & (classes < labels[:, None])
  rank = jnp.sum((logits > label_logit) | tied_before, axis=-1)
  return jnp.where(jnp.all(jnp.isfinite(logits), axis=-1), rank, jnp.iinfo(rank.dtype).max)


def make_eval_step(
  models: ModelSet, prepare: Callable[[jax.Array], jax.Array] | None = None
) -> Callable[[Any, Any, dict[str, jax.Array]], dict]:
  """`eval_step(params, batch_stats, batch) -> {name: {"top1", "top5", "ce"} sums, "count"}`.

  `prepare` (step_preprocess.make_prepare) finishes uint8 images on the device.
  """

  def eval_step(params, batch_stats, batch):
    variables = {"params": params, "batch_stats": batch_stats}
    images = batch["image"] if prepare is None else prepare(batch["image"])
    outputs, _ = models.apply(variables, images, train=False)
    mask = batch["mask"].astype(jnp.float32)
    labels = batch["label"]
    count = jnp.sum(mask)
    sums = {"count": count}

    def measures(logits):
      rank = label_rank(logits, labels)
      return {
        "top1": jnp.sum(mask * (rank == 0)),
        "top5": jnp.sum(mask * (rank < 5)),
        # A sum, as top1/top5: the host divides the totals by the split's count.
        "ce": losses.cross_entropy(logits, labels, weights=mask) * jnp.maximum(count, 1.0),
      }

    for name, (logits, extras) in outputs.items():
      sums[name] = measures(logits)
      if "cls_logits" in extras:  # A distilled ViT: its class head alone too (eval/top1_vit_cls).
        sums[f"{name}_cls"] = measures(extras["cls_logits"])
    return sums

  return eval_step


def evaluate(
  eval_step: Callable[..., dict],
  params: Any,
  batch_stats: Any,
  batches: Iterable[Any],
  in_flight: int = 2,
) -> dict[str, float]:
  """Runs `eval_step` over global batches; returns {"eval/top1_vit": ..., "eval/count": n}.

  Each batch's sums are fetched `in_flight` batches behind its dispatch, so the host prepares
  and transfers the next batches while the device computes, with at most `in_flight` + 1
  batches' inputs alive (the kernel set's `eval_batches_in_flight`); the sums are added up in
  float64 on the host, in batch order."""
  totals: dict[str, Any] | None = None
  pending: collections.deque = collections.deque()

  def add(totals, sums):
    sums = jax.tree.map(np.float64, jax.device_get(sums))
    return sums if totals is None else jax.tree.map(np.add, totals, sums)

  for batch in batches:
    pending.append(eval_step(params, batch_stats, batch))
    if len(pending) > in_flight:
      totals = add(totals, pending.popleft())
  while pending:
    totals = add(totals, pending.popleft())
  if totals is None:
    raise ValueError("the evaluation split is empty; check config.data.eval_split")
  count = totals.pop("count")
  out = {"eval/count": float(count)}
  for name, sums in totals.items():
    for key, value in sums.items():
      out[f"eval/{key}_{name}"] = float(value / max(count, 1.0))
  return out
