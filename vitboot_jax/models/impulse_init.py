"""Impulse attention initialisation (Zheng, Li & Lucey, "structured init" v2;
docs/reference/related_methods.md §C, §D.3): per head, Q/K are pre-fitted so that softmax
attention over the positional pseudo-input LN(P) reproduces the convolution matrix of a random
k x k one-hot ("impulse") filter, i.e. a spatial shift. Fits are cached in memory and on disk
(they take seconds to minutes and depend only on the shapes and the rng).
"""

from __future__ import annotations

import hashlib
import math
import os
import pathlib
import threading
import warnings
import zipfile
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vitboot_jax.base import files
from vitboot_jax.models import attention_params
from vitboot_jax.models.attention_params import Params

_HIGHEST = jax.lax.Precision.HIGHEST
# Bump when the fit changes, so stale on-disk caches are never reused.
_CACHE_VERSION = 1


def layer_norm(x: jax.Array, eps: float = 1e-5) -> jax.Array:
  """Affine-free LayerNorm over the last axis: what LN1 computes at init (scale 1, bias 0)."""
  x = jnp.asarray(x, jnp.float32)
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps)


def pseudo_input(gh: int, gw: int, dim: int, eps: float = 1e-5) -> jax.Array:
  """The impulse fit's data-free input X~ = LN(P) [N, dim] (§C.3, pseudo_input='P')."""
  return layer_norm(attention_params.sincos2d(gh, gw, dim), eps)


def impulse_offsets(rng: jax.Array, num_heads: int, kernel_size: int) -> np.ndarray:
  """Per-head (row, col) shifts int32[H, 2] in [-ks//2, ks//2]^2, uniform, repeats allowed."""
  if kernel_size < 1 or kernel_size % 2 == 0:
    raise ValueError(f"impulse kernel_size must be odd and positive, got {kernel_size}")
  idx = np.asarray(jax.random.randint(rng, (num_heads,), 0, kernel_size**2))
  half = kernel_size // 2
  return np.stack([idx // kernel_size - half, idx % kernel_size - half], axis=1).astype(np.int32)


def impulse_targets(offsets: np.ndarray, gh: int, gw: int) -> np.ndarray:
  """Convolution matrices float32[H, N, N] of the impulses: T[(r,c), (r+m, c+n)] = 1 in-grid.

  Rows whose shifted position leaves the grid are all zero (zero-padded "same" correlation).
  """
  offsets = np.asarray(offsets)
  n = gh * gw
  rows, cols = np.divmod(np.arange(n), gw)
  t = np.zeros((len(offsets), n, n), np.float32)
  for h, (m, s) in enumerate(offsets):
    rr, cc = rows + m, cols + s
    valid = (rr >= 0) & (rr < gh) & (cc >= 0) & (cc < gw)
    t[h, np.arange(n)[valid], (rr * gw + cc)[valid]] = 1.0
  return t


class ImpulseFit(NamedTuple):
  """Pre-fitted Q/K for one set of heads; `q[h] @ k[h]` is head h's bilinear form."""

  q: np.ndarray  # float32[H, D, r]; W_q of head h
  k: np.ndarray  # float32[H, r, D]; W_k of head h is k[h].T
  offsets: np.ndarray  # int32[H, 2], (row, col) shift of each head's impulse
  loss_start: float  # MSE at iteration 0 (after the first renorm)
  loss_end: float  # MSE after the last step


def _head_maps(q: jax.Array, k: jax.Array, x: jax.Array, scale: float) -> jax.Array:
  """softmax(scale * x Q_h K_h x^T) for every head: [H, N, N]."""
  xq = jnp.einsum("nd,hdr->hnr", x, q, precision=_HIGHEST)
  xk = jnp.einsum("md,hrd->hmr", x, k, precision=_HIGHEST)
  logits = scale * jnp.einsum("hnr,hmr->hnm", xq, xk, precision=_HIGHEST)
  return jax.nn.softmax(logits, axis=-1)


@jax.jit
def _fit_qk(key, x, targets, steps, lr, renorm_every):
  """Adam on MSE(softmax(s X~ Q K X~^T), T) with the §C.3 norm cap; steps/lr/renorm are traced.

  `renorm_every <= 0` disables the renormalisation (it then converges to near-binary maps).
  """
  heads, d = targets.shape[0], x.shape[-1]
  r = d // heads
  scale = r**-0.5
  kq, kk = jax.random.split(key)
  bound = math.sqrt(1.0 / (r * heads))
  params = {
    "q": jax.random.uniform(kq, (heads, d, r), jnp.float32, -bound, bound),
    "k": jax.random.uniform(kk, (heads, r, d), jnp.float32, -bound, bound),
  }
  nq = jnp.mean(jnp.linalg.norm(params["q"], axis=1))  # Mean Q column norm at init.

  def renorm(p):
    return {
      "q": p["q"] / jnp.linalg.norm(p["q"], axis=1, keepdims=True) * nq,
      "k": p["k"] / jnp.linalg.norm(p["k"], axis=1, keepdims=True) * nq,
    }

  def loss_fn(p):
    return jnp.mean(jnp.square(_head_maps(p["q"], p["k"], x, scale) - targets))

  opt = optax.adam(lr)

  def body(i, carry):
    p, state = carry
    do = (renorm_every > 0) & (i % jnp.maximum(renorm_every, 1) == 0)
    p = jax.tree.map(lambda a, b: jnp.where(do, a, b), renorm(p), p)
    grads = jax.grad(loss_fn)(p)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state

  start = jax.lax.cond(renorm_every > 0, renorm, lambda p: p, params)
  loss_start = loss_fn(start)
  params, _ = jax.lax.fori_loop(0, steps, body, (params, opt.init(params)))
  return params["q"], params["k"], loss_start, loss_fn(params)


_MEMORY_CACHE: dict[str, ImpulseFit] = {}
_CACHE_LOCK = threading.Lock()


def clear_memory_cache() -> None:
  """Forgets the in-process impulse fits (the on-disk cache is left alone)."""
  with _CACHE_LOCK:
    _MEMORY_CACHE.clear()


def cache_dir() -> pathlib.Path:
  """`$VITBOOT_CACHE/attention_init` if set, else `~/.cache/vitboot_jax/attention_init`."""
  root = os.environ.get("VITBOOT_CACHE") or os.path.join("~", ".cache", "vitboot_jax")
  return pathlib.Path(root).expanduser() / "attention_init"


def _key_fingerprint(rng: jax.Array) -> str:
  rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.key_data(rng)
  return np.asarray(rng).astype(np.uint32).tobytes().hex()


def _cache_key(dim, heads, gh, gw, ks, steps, lr, renorm_every, rng) -> str:
  return (
    f"impulse-v{_CACHE_VERSION}-d{dim}-h{heads}-g{gh}x{gw}-k{ks}-steps{steps}-lr{float(lr)!r}"
    f"-renorm{renorm_every or 0}-seed{_key_fingerprint(rng)}"
  )


def _load(path: pathlib.Path, key: str, heads: int, dim: int) -> ImpulseFit | None:
  """The cached fit at `path`, or None if absent, unreadable or for another key."""
  try:
    with np.load(path, allow_pickle=False) as f:
      if str(f["key"]) != key:
        return None
      fit = ImpulseFit(
        f["q"].astype(np.float32),
        f["k"].astype(np.float32),
        f["offsets"].astype(np.int32),
        float(f["loss_start"]),
        float(f["loss_end"]),
      )
  except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
    return None
  r = dim // heads
  if fit.q.shape != (heads, dim, r) or fit.k.shape != (heads, r, dim):
    return None
  return fit


def _save(path: pathlib.Path, key: str, fit: ImpulseFit) -> None:
  """Writes the fit whole (files.replacing); a cache that cannot be written only warns."""
  try:
    with files.replacing(path) as f:
      np.savez(f, key=np.asarray(key), **fit._asdict())
  except OSError as e:
    warnings.warn(f"could not write the impulse-init cache {path}: {e}", stacklevel=3)


def fit_impulse_qk(
  rng: jax.Array,
  *,
  dim: int,
  num_heads: int,
  grid: int | tuple[int, int],
  kernel_size: int,
  steps: int = 10_000,
  lr: float = 1e-4,
  renorm_every: int | None = 100,
  disk_cache: bool = True,
) -> ImpulseFit:
  """Pre-optimised Q/K whose attention over LN(sincos PE) imitates random impulse filters.

  `rng` draws the offsets and the Q/K init. The result is cached per (dim, heads, grid, kernel,
  steps, lr, renorm, rng) in memory and, if `disk_cache`, as npz under `cache_dir()`, so the
  fit (seconds on CPU) runs once per process and, across processes, once per machine.
  """
  gh, gw = attention_params.grid_hw(grid)
  attention_params.head_dim(dim, num_heads)
  key = _cache_key(dim, num_heads, gh, gw, kernel_size, steps, lr, renorm_every, rng)
  with _CACHE_LOCK:
    if key in _MEMORY_CACHE:
      return _MEMORY_CACHE[key]
  path = cache_dir() / f"impulse_{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"
  fit = _load(path, key, num_heads, dim) if disk_cache else None
  if fit is None:
    rng_off, rng_qk = jax.random.split(rng)
    offsets = impulse_offsets(rng_off, num_heads, kernel_size)
    targets = jnp.asarray(impulse_targets(offsets, gh, gw))
    q, k, loss_start, loss_end = _fit_qk(
      rng_qk,
      pseudo_input(gh, gw, dim),
      targets,
      jnp.int32(steps),
      jnp.float32(lr),
      jnp.int32(renorm_every or 0),
    )
    fit = ImpulseFit(
      np.asarray(q, np.float32),
      np.asarray(k, np.float32),
      offsets,
      float(loss_start),
      float(loss_end),
    )
    if disk_cache:
      _save(path, key, fit)
  with _CACHE_LOCK:
    _MEMORY_CACHE[key] = fit
  return fit


def impulse_maps(fit: ImpulseFit, grid: int | tuple[int, int]) -> jax.Array:
  """Each head's attention [H, N, N] over the pseudo-input, as the fit saw it."""
  gh, gw = attention_params.grid_hw(grid)
  heads, dim = fit.q.shape[:2]
  return _head_maps(fit.q, fit.k, pseudo_input(gh, gw, dim), (dim // heads) ** -0.5)


def impulse_init(
  vit_params: Params,
  rng: jax.Array,
  *,
  num_heads: int,
  grid: int | tuple[int, int],
  kernel_size: int = 3,
  steps: int = 10_000,
  lr: float = 1e-4,
  renorm_every: int | None = 100,
  init_once: bool = True,
  pos_embed: str = "sincos",
  disk_cache: bool = True,
) -> dict[str, Any]:
  """Impulse init: every block's W_q/W_k from `fit_impulse_qk`; Q/K biases zeroed.

  With `init_once` (default, §C.3) one fit with `rng` goes to every layer, so all layers share
  the same offsets; otherwise layer l is fitted with `jax.random.fold_in(rng, l)`. V, out, MLP,
  norms, embeddings and head are untouched. `pos_embed="sincos"` (default) writes the sin-cos PE
  the fit assumed into the patch rows of `pos_embed`, since the fitted Q/K only produce impulses
  on that input; the method keeps it frozen (§C.3, §D.3), which is the optimiser's job.
  """
  dim = vit_params["block_0"]["attn"]["qkv"]["kernel"].shape[0]
  new = dict(vit_params)
  for layer in range(attention_params.num_layers(vit_params)):
    fit = fit_impulse_qk(
      rng if init_once else jax.random.fold_in(rng, layer),
      dim=dim,
      num_heads=num_heads,
      grid=grid,
      kernel_size=kernel_size,
      steps=steps,
      lr=lr,
      renorm_every=renorm_every,
      disk_cache=disk_cache,
    )
    new = attention_params.set_qk(new, layer, fit.q, np.swapaxes(fit.k, 1, 2))
  return attention_params.apply_pos_embed(new, pos_embed, grid)
