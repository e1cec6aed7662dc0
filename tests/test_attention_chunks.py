"""Chunked attention on CPU (cpu/attention_chunks.py): the same outputs, gradients, dropout masks
and maps as the plain."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tests import tolerances
from vitboot_jax.cpu import attention_chunks
from vitboot_jax.cpu import kernels as cpu_kernels
from vitboot_jax.models import kernels as kernels_lib
from vitboot_jax.models import vit as vit_lib


def _qkv(batch=8, heads=3, tokens=17, dim=4, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 3)
  return [jax.random.normal(k, (batch, heads, tokens, dim)).astype(dtype) for k in keys]


@pytest.mark.parametrize(
  "attention, dtype, rtol",
  [("softmax", jnp.float32, 1e-5), ("entmax", jnp.float32, 1e-4), ("softmax", jnp.bfloat16, 2e-2)],
)
@pytest.mark.slow
def test_chunks_give_the_plain_values_gradients_and_masks(attention, dtype, rtol):
  q, k, v = _qkv(dtype=dtype)
  cotangent = jax.random.normal(jax.random.key(5), v.shape).astype(dtype)

  def loss(q, k, v, alpha, chunk):
    core = functools.partial(
      vit_lib.attend,
      attention=attention,
      alpha=alpha,
      dropout_rate=0.3,
      dropout_key=jax.random.key(7),
      num_rows=q.shape[0],
      dtype=dtype,
      kernels=cpu_kernels.CPU,
    )
    out = attention_chunks.attend_in_chunks(core, q, k, v, chunk)[0] if chunk else core(q, k, v)[0]
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32))

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), static_argnums=4)
  alpha = jnp.float32(1.3)
  plain_value, plain_grads = grad(q, k, v, alpha, 0)
  for chunk in (1, 2, 4):
    value, grads = grad(q, k, v, alpha, chunk)
    np.testing.assert_allclose(value, plain_value, rtol=rtol, atol=rtol)
    for ours, ref in zip(grads, plain_grads):
      ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
      np.testing.assert_allclose(ours, ref, rtol=rtol, atol=rtol * np.abs(ref).max())


@pytest.mark.slow
def test_chunk_masks_are_the_whole_batch_masks():
  """Dropped probabilities sit where the whole-batch mask drops them (zero output rows)."""
  q, k, v = _qkv()
  v = jnp.ones_like(v)  # Output = row sum of the kept, rescaled probabilities.
  core = functools.partial(
    vit_lib.attend,
    attention="softmax",
    alpha=None,
    dropout_rate=0.5,
    dropout_key=jax.random.key(3),
    num_rows=q.shape[0],
    kernels=cpu_kernels.CPU,
  )
  plain = np.asarray(core(q, k, v)[0])
  chunked = np.asarray(attention_chunks.attend_in_chunks(core, q, k, v, 2)[0])
  np.testing.assert_allclose(chunked, plain, rtol=1e-5)
  assert np.abs(plain - 1).max() > 0.1  # The mask did something.


def _cpu(budget: int, shards: int) -> kernels_lib.Kernels:
  cpu = cpu_kernels.for_shards(shards)
  attention = dataclasses.replace(cpu.attention, train_bytes=budget, whole_batch_bytes=0)
  return dataclasses.replace(cpu, attention=attention)


def test_images_per_chunk_budget_and_devices():
  kernels = _cpu(3 * 4 * 5 * 5 * 4, 8)  # 4 images of 3x5x5, batch over 8 devices.
  # 64 images on 8 devices: 8 per device, at most 4 per device per slice -> 4 x 8.
  assert kernels.attention.images(64, 3, 5) == 32
  # 24 per device: the largest divisor of 24 within the budget is 4.
  assert kernels.attention.images(192, 3, 5) == 32
  # A batch the devices do not divide is sliced as on one device: largest divisor of 9 <= 4.
  assert kernels.attention.images(9, 3, 5) == 3
  # One image above the budget still makes a slice of one image (per device).
  assert kernels.attention.images(16, 3, 50) == 8
  # The xla set never slices: one call of the core on the whole batch.
  q, k, v = _qkv(batch=64)
  calls = []
  kernels_lib.XLA.attention(lambda *t: calls.append(len(t)) or t[:2], q, k, v, train=True)
  assert calls == [3]


def test_cpu_set_keeps_a_small_batchs_training_attention_whole():
  cpu = cpu_kernels.for_shards(2)
  # Quickstart (9 heads, 65 tokens), batch 64 on two devices: 4.9 MB per device, one op.
  assert cpu.attention.images(64, 9, 65) == 64
  # Twice the batch per device: slices within the budget; evaluation keeps its own budget.
  assert cpu.attention.images(128, 9, 65) == 32
  assert cpu.attention.images(64, 9, 65, train=False) == 64
  # 16x16 tokens (257): one image per device per slice.
  assert cpu.attention.images(64, 9, 257) == 2


@pytest.mark.slow
def test_vit_train_step_identical_with_and_without_chunks():
  """Whole ViT, dropout on, batch sharded over the 8 devices: the loss and gradients agree."""
  model = vit_lib.ViT(
    num_classes=5, patch_size=4, embed_dim=12, depth=2, num_heads=3, mlp_dim=24, dropout=0.1
  )
  images = jax.random.normal(jax.random.key(1), (32, 16, 16, 3))
  labels = jnp.arange(32) % 5
  params = model.init(jax.random.key(0), images[:1])["params"]
  mesh = Mesh(np.array(jax.devices()), ("data",))
  images = jax.device_put(images, NamedSharding(mesh, PartitionSpec("data")))

  def run(kernels: kernels_lib.Kernels):
    def loss(params, images):
      logits, _ = model.clone(kernels=kernels).apply(
        {"params": params}, images, train=True, rngs={"dropout": jax.random.key(2)}
      )
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

    return jax.jit(jax.value_and_grad(loss))(params, images)

  # Budget of 2 images: 4 per device -> slices of 2 per device, 16 in all, 2 loop steps.
  chunked = _cpu(2 * 3 * 17 * 17 * 4, 8)
  assert chunked.attention.images(32, 3, 17) == 16
  plain_loss, plain_grads = run(_cpu(0, 8))
  chunked_loss, chunked_grads = run(chunked)
  np.testing.assert_allclose(chunked_loss, plain_loss, rtol=1e-5)
  tolerances.assert_trees_close_to_scale(chunked_grads, plain_grads, 1e-4, "grads", floor=1e-6)


@pytest.mark.slow
def test_evaluation_runs_in_slices_and_still_exposes_the_probabilities():
  """Eval attention runs in the same slices; outputs and captured maps equal the whole batch's."""
  model = vit_lib.ViT(num_classes=5, patch_size=4, embed_dim=12, depth=2, num_heads=3, mlp_dim=24)
  images = jax.random.normal(jax.random.key(4), (8, 16, 16, 3))
  params = model.init(jax.random.key(0), images[:1])["params"]

  def run(budget: int):
    cpu = cpu_kernels.CPU
    attention = dataclasses.replace(cpu.attention, inference_bytes=budget)
    kernels = dataclasses.replace(cpu, attention=attention)
    assert kernels.attention.images(8, 3, 17, train=False) == (2 if budget else 8)
    return model.clone(kernels=kernels).apply(
      {"params": params}, images, train=False, capture_intermediates=True, mutable=["intermediates"]
    )

  (logits, _), captured = run(2 * 3 * 17 * 17 * 4)
  (want_logits, _), want_captured = run(0)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-6)
  probs = jax.tree.leaves(captured)
  want_probs = jax.tree.leaves(want_captured)
  assert len(probs) == len(want_probs) > 0
  for got, want in zip(probs, want_probs, strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
