"""Attention in batch slices for the `cpu` set: each slice's [heads, T, T] logits and
probabilities stay in cache from forward to backward (docs/performance.md)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vitboot_jax.cpu import slices


def attend_in_chunks(
  core, q: jax.Array, k: jax.Array, v: jax.Array, chunk: int, *, train: bool = True
) -> tuple[jax.Array, jax.Array | None]:
  """`core(q, k, v, rows)` over slices of `chunk` images: (output, probabilities or None).

  `rows` are each slice's indices in the whole batch, so dropout draws the whole batch's mask.
  Training rematerialises each slice in backward and returns no probabilities; evaluation
  returns them reassembled (unused, they cost nothing: the step drops them).
  Slices are strided (slices.batch_slices), so every device holds its share of each.
  """
  b = q.shape[0]
  rows = slices.batch_slices(jnp.arange(b, dtype=jnp.int32), chunk)
  parts = (*(slices.batch_slices(t, chunk) for t in (q, k, v)), rows)
  if train:
    out = jax.lax.map(jax.checkpoint(lambda args: core(*args)[0]), parts)
    return slices.merge_batch_slices(out), None
  out, probs = jax.lax.map(lambda args: core(*args), parts)
  return slices.merge_batch_slices(out), slices.merge_batch_slices(probs)


@dataclasses.dataclass(frozen=True)
class AttentionChunks:
  """The `cpu` set's `attention`: `core` over batch slices within byte budgets.

  train_bytes: > 0 runs training attention in rematerialised slices whose attention matrices
    take at most this many bytes; 0 keeps one whole-batch op.
  whole_batch_bytes: training attention stays one op on each device's whole batch (no slices,
    no rematerialisation) while its attention matrices take at most this many bytes.
  inference_bytes: the same as `train_bytes` for evaluation (slices without rematerialisation).
  shards: how many devices the batch is split over.
  """

  train_bytes: int = 0
  whole_batch_bytes: int = 0
  inference_bytes: int = 0
  shards: int = 1

  def images(self, batch: int, heads: int, tokens: int, itemsize: int = 4, *, train: bool = True):
    """The largest slice of the batch whose [heads, T, T] attention fits the budget.

    Returns `batch` (one slice) when the budget is 0, or, in training, when each device's share
    fits `whole_batch_bytes`. The slice is a multiple of `shards` when they divide the batch, so
    every slice has the same number of images on each device and the loop needs no
    communication.
    """
    budget = self.train_bytes if train else self.inference_bytes
    if not budget:
      return batch
    per_image = heads * tokens * tokens * itemsize
    whole = slices.images_per_slice(batch, per_image, self.whole_batch_bytes, self.shards)
    if train and whole == batch:
      return batch
    return slices.images_per_slice(batch, per_image, budget, self.shards)

  def __call__(self, core, q: jax.Array, k: jax.Array, v: jax.Array, *, train: bool):
    b, heads, tokens, _ = q.shape
    chunk = self.images(b, heads, tokens, train=train)
    if chunk < b:
      return attend_in_chunks(core, q, k, v, chunk, train=train)
    return core(q, k, v)
