"""Structured attention initialisations applied after the standard ViT init.

Two data-free schemes that give a ViT's attention a useful shape before training
(docs/reference/related_methods.md §B, §C, §D.2-D.4):

* Mimetic (Trockman & Kolter 2023): per head W_q W_k^T ~ a1 Z1 + b1 I (attend to self) and per
  layer W_v W_o ~ a2 Z2 - b2 I, both factorised by SVD.
* Impulse (Zheng, Li & Lucey, "structured init" v2): per head, Q/K are pre-fitted so that
  softmax attention over the positional pseudo-input LN(P) reproduces the convolution matrix of
  a random k x k one-hot ("impulse") filter, i.e. a spatial shift.

Both are pure functions over the ViT's own parameter tree (`params["vit"]` of the model set):
`block_{l}/attn/qkv/kernel` [D, 3D] with columns [Q | K | V], head-major inside each third, and
`block_{l}/attn/out/kernel` [D, D] with head-major rows. The model's logits are
(x W_q)(x W_k)^T / sqrt(d_k) over the pre-norm LN1 output, so W_q W_k^T is exactly the bilinear
form the methods target.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import pathlib
import threading
import warnings
import zipfile
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from vitboot_jax import files
from vitboot_jax.models import choices
from vitboot_jax.models import vit as vit_lib

Params = Mapping[str, Any]

SCHEMES = choices.ATTENTION_INITS

_HIGHEST = jax.lax.Precision.HIGHEST
# Bump when the fit changes, so stale on-disk caches are never reused.
_CACHE_VERSION = 1


# ----------------------------------------------------------------------------------------------
# Parameter-tree helpers.


def _num_layers(vit_params: Params) -> int:
  layers = [int(k.split("_", 1)[1]) for k in vit_params if k.startswith("block_")]
  if sorted(layers) != list(range(len(layers))) or not layers:
    raise ValueError(f"expected ViT params with block_0..block_L-1, got keys {sorted(vit_params)}")
  return len(layers)


def _head_dim(dim: int, num_heads: int) -> int:
  if num_heads <= 0 or dim % num_heads:
    raise ValueError(f"embed dim {dim} is not divisible by num_heads={num_heads}")
  return dim // num_heads


def _grid_hw(grid: int | tuple[int, int]) -> tuple[int, int]:
  gh, gw = (grid, grid) if isinstance(grid, int) else tuple(grid)
  if gh <= 0 or gw <= 0:
    raise ValueError(f"grid must be positive, got {grid}")
  return int(gh), int(gw)


def _with(tree: Params, path: tuple[str, ...], value: Any) -> dict[str, Any]:
  """A shallow copy of `tree` with `tree[path] = value`; untouched leaves are shared, not copied."""
  new = dict(tree)
  if len(path) == 1:
    new[path[0]] = value
  else:
    new[path[0]] = _with(tree[path[0]], path[1:], value)
  return new


def _host(leaf: jax.Array) -> np.ndarray:
  """A writable host copy; the initialisers edit numpy arrays to avoid per-shape XLA compiles."""
  return np.array(leaf)


def _heads_to_columns(w: np.ndarray) -> np.ndarray:
  """[H, D, r] per-head factors -> [D, H*r] kernel columns, head-major (column h*r + j)."""
  return np.transpose(w, (1, 0, 2)).reshape(w.shape[1], -1)


def _set_qk(vit_params: Params, layer: int, wq: np.ndarray, wk: np.ndarray) -> dict[str, Any]:
  """Writes per-head W_q, W_k [H, D, r] into the fused kernel and zeroes the Q/K biases."""
  qkv = vit_params[f"block_{layer}"]["attn"]["qkv"]
  kernel = _host(qkv["kernel"])
  d = kernel.shape[0]
  kernel[:, :d] = _heads_to_columns(wq)
  kernel[:, d : 2 * d] = _heads_to_columns(wk)
  new_qkv = dict(qkv, kernel=jnp.asarray(kernel))
  if "bias" in qkv:
    bias = _host(qkv["bias"])
    bias[: 2 * d] = 0
    new_qkv["bias"] = jnp.asarray(bias)
  return _with(vit_params, (f"block_{layer}", "attn", "qkv"), new_qkv)


def _sincos_pos_embed(vit_params: Params, gh: int, gw: int) -> dict[str, Any]:
  """Writes the fixed 2-D sin-cos PE into the patch rows of pos_embed (cls row untouched)."""
  pos = vit_params["pos_embed"]
  n = gh * gw
  if pos.shape[1] not in (n, n + 1):
    raise ValueError(f"pos_embed has {pos.shape[1]} tokens; grid {gh}x{gw} needs {n} (+1 cls)")
  new = _host(pos)
  new[0, pos.shape[1] - n :] = sincos2d(gh, gw, pos.shape[-1])
  return _with(vit_params, ("pos_embed",), jnp.asarray(new))


def _apply_pos_embed(vit_params: Params, pos_embed: str, grid) -> Params:
  if pos_embed == "keep":
    return vit_params
  if pos_embed == "sincos":
    if grid is None:
      raise ValueError("pos_embed='sincos' needs the token grid")
    return _sincos_pos_embed(vit_params, *_grid_hw(grid))
  raise ValueError(f"pos_embed={pos_embed!r} is unknown; choose 'keep' or 'sincos'")


# ----------------------------------------------------------------------------------------------
# Mimetic initialisation (§B, §D.2).


class MimeticLayer(NamedTuple):
  """One layer's mimetic factors (float32, host) and the targets they approximate."""

  wq: np.ndarray  # [H, D, r]
  wk: np.ndarray  # [H, D, r]; wq[h] @ wk[h].T = best rank-r approximation of a1[h]
  wv: np.ndarray  # [D, D]
  wo: np.ndarray  # [D, D]; wv @ wo = a2 exactly
  a1: np.ndarray  # [H, D, D] = alpha1 * Z1 + beta1 * I
  a2: np.ndarray  # [D, D] = alpha2 * Z2 - beta2 * I


@functools.partial(jax.jit, static_argnames=("dim", "num_heads", "dist"))
def _mimetic_noise(rng: jax.Array, *, dim: int, num_heads: int, dist: str):
  """Z1 [H, D, D] and Z2 [D, D] with variance 1/dim: U(+-sqrt(3/d)) (Zheng's code) or N(0, 1/d)."""
  rng_qk, rng_vo = jax.random.split(rng)
  if dist == "normal":
    draw = lambda key, shape: jax.random.normal(key, shape, jnp.float32) / math.sqrt(dim)
  else:
    bound = math.sqrt(3.0 / dim)
    draw = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -bound, bound)
  return draw(rng_qk, (num_heads, dim, dim)), draw(rng_vo, (dim, dim))


def mimetic_layer_weights(
  rng: jax.Array,
  dim: int,
  num_heads: int,
  *,
  alpha1: float = 0.7,
  beta1: float = 0.7,
  alpha2: float = 0.4,
  beta2: float = 0.4,
  dist: str = "uniform",
) -> MimeticLayer:
  """Mimetic factors for one layer; an independent Z1 per head, one full-rank Z2 per layer.

  The SVDs run in float32 numpy on the host (milliseconds at d=192, §D.2): this is a one-off
  init, and XLA's SVD takes seconds to compile per shape.
  """
  r = _head_dim(dim, num_heads)
  if dist not in ("uniform", "normal"):
    raise ValueError(f"mimetic dist={dist!r} is unknown; choose 'uniform' or 'normal'")
  z1, z2 = (np.asarray(z) for z in _mimetic_noise(rng, dim=dim, num_heads=num_heads, dist=dist))
  eye = np.eye(dim, dtype=np.float32)
  a1 = (alpha1 * z1 + beta1 * eye).astype(np.float32)
  u, s, vt = np.linalg.svd(a1)  # Batched over heads; singular values descending.
  root = np.sqrt(s[:, None, :r])
  wq = u[:, :, :r] * root
  wk = np.swapaxes(vt[:, :r, :], 1, 2) * root
  a2 = (alpha2 * z2 - beta2 * eye).astype(np.float32)
  u2, s2, vt2 = np.linalg.svd(a2)
  root2 = np.sqrt(s2)
  return MimeticLayer(wq, wk, u2 * root2[None, :], root2[:, None] * vt2, a1, a2)


def mimetic_init(
  vit_params: Params,
  rng: jax.Array,
  *,
  num_heads: int,
  alpha1: float = 0.7,
  beta1: float = 0.7,
  alpha2: float = 0.4,
  beta2: float = 0.4,
  dist: str = "uniform",
  pos_embed: str = "keep",
  grid: int | tuple[int, int] | None = None,
) -> dict[str, Any]:
  """Mimetic init of every block's Q/K/V/out; other params are returned unchanged.

  Layer l uses `mimetic_layer_weights(jax.random.fold_in(rng, l), ...)`. The qkv and out biases
  are zeroed (our choice, §B.2). `pos_embed="sincos"` additionally writes the fixed 2-D sin-cos
  PE into the patch rows, which is what gives mimetic attention its locality (PP^T, §B.2);
  with the default learned trunc-normal(0.02) PE the init gives almost pure self-attention.
  """
  new = dict(vit_params)
  dim = vit_params["block_0"]["attn"]["qkv"]["kernel"].shape[0]
  for layer in range(_num_layers(vit_params)):
    w = mimetic_layer_weights(
      jax.random.fold_in(rng, layer),
      dim,
      num_heads,
      alpha1=alpha1,
      beta1=beta1,
      alpha2=alpha2,
      beta2=beta2,
      dist=dist,
    )
    new = _set_qk(new, layer, w.wq, w.wk)
    attn = new[f"block_{layer}"]["attn"]
    qkv, out = dict(attn["qkv"]), dict(attn["out"])
    kernel = _host(qkv["kernel"])
    kernel[:, 2 * dim :] = w.wv
    qkv["kernel"] = jnp.asarray(kernel)
    out["kernel"] = jnp.asarray(w.wo, dtype=out["kernel"].dtype)
    for p in (qkv, out):
      if "bias" in p:
        p["bias"] = jnp.zeros_like(p["bias"])
    new = _with(new, (f"block_{layer}", "attn"), dict(attn, qkv=qkv, out=out))
  return _apply_pos_embed(new, pos_embed, grid)


# ----------------------------------------------------------------------------------------------
# Impulse initialisation (§C, §D.3).


def sincos2d(gh: int, gw: int, dim: int, temperature: float = 1e4) -> np.ndarray:
  """Fixed 2-D sin-cos PE [gh*gw, dim], row-major, layout [sin_y | sin_x | cos_y | cos_x] (§C.3)."""
  if dim % 4:
    raise ValueError(f"the 2-D sin-cos embedding needs dim % 4 == 0, got {dim}")
  quarter = dim // 4
  bands = 1.0 / temperature ** (np.arange(quarter, dtype=np.float64) / quarter)
  ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
  ang_y = ys.reshape(-1, 1) * bands[None]
  ang_x = xs.reshape(-1, 1) * bands[None]
  p = np.concatenate([np.sin(ang_y), np.sin(ang_x), np.cos(ang_y), np.cos(ang_x)], axis=1)
  return p.astype(np.float32)


def layer_norm(x: jax.Array, eps: float = 1e-5) -> jax.Array:
  """Affine-free LayerNorm over the last axis: what LN1 computes at init (scale 1, bias 0)."""
  x = jnp.asarray(x, jnp.float32)
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps)


def pseudo_input(gh: int, gw: int, dim: int, eps: float = 1e-5) -> jax.Array:
  """The impulse fit's data-free input X~ = LN(P) [N, dim] (§C.3, pseudo_input='P')."""
  return layer_norm(sincos2d(gh, gw, dim), eps)


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
  gh, gw = _grid_hw(grid)
  _head_dim(dim, num_heads)
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
  gh, gw = _grid_hw(grid)
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
  for layer in range(_num_layers(vit_params)):
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
    new = _set_qk(new, layer, fit.q, np.swapaxes(fit.k, 1, 2))
  return _apply_pos_embed(new, pos_embed, grid)


# ----------------------------------------------------------------------------------------------
# Dispatch and inspection.


def apply_init(
  scheme: str,
  vit_params: Params,
  rng: jax.Array,
  *,
  num_heads: int,
  grid: int | tuple[int, int],
  **kwargs: Any,
) -> dict[str, Any]:
  """Applies one of `SCHEMES` to freshly initialised ViT params; kwargs go to the scheme."""
  if scheme == "mimetic":
    return mimetic_init(vit_params, rng, num_heads=num_heads, grid=grid, **kwargs)
  if scheme in ("impulse3", "impulse5"):
    ks = int(scheme[len("impulse") :])
    return impulse_init(vit_params, rng, num_heads=num_heads, grid=grid, kernel_size=ks, **kwargs)
  raise ValueError(
    f"config.model.init={scheme!r} is not an attention init; choose one of "
    + ", ".join(repr(s) for s in SCHEMES)
  )


def attention_maps(
  vit_params: Params,
  x_tokens: jax.Array,
  num_heads: int,
  layer: int,
  *,
  apply_ln: bool = True,
  ln_eps: float = 1e-5,
) -> jax.Array:
  """Softmax attention of block `layer` on block inputs `x_tokens` [B, T, D] or [T, D].

  Runs the ViT's own modules: LN1 (with the block's scale/bias) unless `apply_ln=False` (inputs
  already normalised), then `vit.Attention` (softmax). Returns [B, H, T, T] (or [H, T, T]).
  """
  block = vit_params[f"block_{layer}"]
  x = jnp.asarray(x_tokens, jnp.float32)
  _head_dim(x.shape[-1], num_heads)
  unbatched = x.ndim == 2
  probs = _block_attention(
    dict(block["ln1"]) if apply_ln else None,
    {"qkv": dict(block["attn"]["qkv"]), "out": dict(block["attn"]["out"])},
    x[None] if unbatched else x,
    num_heads=num_heads,
    ln_eps=ln_eps,
  )
  return probs[0] if unbatched else probs


@functools.partial(jax.jit, static_argnames=("num_heads", "ln_eps"))
def _block_attention(ln, attn, x, *, num_heads, ln_eps):
  """The ViT's own LN1 and Attention modules over the block's parameters."""
  if ln is not None:
    x = nn.LayerNorm(epsilon=ln_eps).apply({"params": ln}, x)
  return vit_lib.attention_of(vit_lib.Attention(num_heads=num_heads), {"params": attn}, x)[1]
