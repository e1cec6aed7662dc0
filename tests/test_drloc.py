"""Tests for drloc.py against independent float64 numpy references written with explicit loops."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vitboot_jax.method import drloc
from vitboot_jax.models import drloc_head

# ---------------------------------------------------------------------------------------------
# numpy references (float64, loops, no shared code with drloc.py)


def ref_targets(p1, p2, k, use_abs, normalize):
  p1, p2 = np.asarray(p1), np.asarray(p2)
  out = np.zeros(p1.shape, np.float64)
  for b in range(p1.shape[0]):
    for s in range(p1.shape[1]):
      for a in range(2):
        delta = int(p1[b, s, a]) - int(p2[b, s, a])
        if normalize == "paper":
          out[b, s, a] = (abs(delta) if use_abs else delta) / k
        elif use_abs:
          out[b, s, a] = abs(delta) / ((k - 1) if normalize == "code" else 1)
        else:
          out[b, s, a] = (delta + k - 1) / (2 * (k - 1) if normalize == "code" else 1)
  return out


def ref_gather(grid, pos):
  grid = np.asarray(grid, np.float64)
  b_, m = pos.shape[:2]
  out = np.zeros((b_, m, grid.shape[-1]))
  for b in range(b_):
    for s in range(m):
      out[b, s] = grid[b, int(pos[b, s, 0]), int(pos[b, s, 1])]
  return out


def ref_mlp(params, x):
  """f in float64: relu(fc1) -> relu(fc2) -> out (l1) or fc3 -> (out_u, out_v) (ce/reg)."""
  dense = lambda name, y: (
    y @ np.asarray(params[name]["kernel"], np.float64)
    + np.asarray(params[name]["bias"], np.float64)
  )
  h = np.maximum(dense("fc1", x), 0.0)
  h = np.maximum(dense("fc2", h), 0.0)
  if "out" in params:
    return dense("out", h)
  h = dense("fc3", h)
  return np.stack([dense("out_u", h), dense("out_v", h)], axis=-2)


def ref_log_softmax(z):
  z = z - z.max()
  return z - math.log(sum(math.exp(v) for v in z))


def ref_loss(variant, params, grid, p1, p2, use_abs=True, normalize="none", alpha=1e-3):
  p1, p2 = np.asarray(p1), np.asarray(p2)
  k = grid.shape[1]
  x = np.concatenate([ref_gather(grid, p1), ref_gather(grid, p2)], axis=-1)
  pred = ref_mlp(params, x)
  b_, m = p1.shape[:2]
  total, count = 0.0, 0
  for b in range(b_):
    for s in range(m):
      for a in range(2):
        delta = int(p1[b, s, a]) - int(p2[b, s, a])
        if variant == "l1":
          t = ref_targets(p1[b : b + 1, s : s + 1], p2[b : b + 1, s : s + 1], k, use_abs, normalize)
          total += abs(t[0, 0, a] - pred[b, s, a])
          continue
        c = abs(delta) if use_abs else delta + k - 1
        z = pred[b, s, a]
        if variant == "ce":
          total += -ref_log_softmax(z)[c]
        else:
          p = np.exp(ref_log_softmax(z))
          mu = sum(p[i] * i for i in range(len(z)))
          var = sum(p[i] * (i - mu) ** 2 for i in range(len(z))) + 1e-8
          total += (c - mu) ** 2 / var + alpha * math.log(var)
      count += 1
  # l1: mean over B*m*2; ce/reg: mean over B*m per axis, summed over the two axes.
  return total / (2 * count) if variant == "l1" else total / count


def ref_pool(grid):
  """3x3 / stride 2 / pad 1 average, padding excluded from the count."""
  grid = np.asarray(grid, np.float64)
  b_, h, w, d = grid.shape
  oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
  out = np.zeros((b_, oh, ow, d))
  for b in range(b_):
    for i in range(oh):
      for j in range(ow):
        cells = [
          grid[b, r, c]
          for r in range(2 * i - 1, 2 * i + 2)
          for c in range(2 * j - 1, 2 * j + 2)
          if 0 <= r < h and 0 <= c < w
        ]
        out[b, i, j] = sum(cells) / len(cells)
  return out


def _normal(seed, shape):
  # numpy, not jax.random: eager jax ops each compile, which is most of this module's run time.
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _jit_loss(head, **kwargs):
  """A jitted drloc_loss, compiled once per (head, options) across the module: keeps it fast."""
  return _jit_loss_cached(head, tuple(sorted(kwargs.items())))


@functools.cache
def _jit_loss_cached(head, kwargs):
  return jax.jit(lambda p, g, r: drloc.drloc_loss(head, p, g, r, **dict(kwargs)))


def _head_and_params(variant, k, d, use_abs=True, hidden=32, seed=0):
  head = drloc_head.make_head(variant, k, use_abs=use_abs, hidden=hidden)
  return head, drloc_head.init_head(head, jax.random.key(seed), d)


# ---------------------------------------------------------------------------------------------
# Grid extraction


def test_tokens_to_grid_drops_cls_row_major():
  b, k, d = 2, 5, 3
  tokens = np.random.default_rng(0).normal(size=(b, 1 + k * k, d)).astype(np.float32)
  grid = np.asarray(drloc_head.tokens_to_grid(jnp.asarray(tokens)))
  assert grid.shape == (b, k, k, d)
  for bb in range(b):
    for t in range(k * k):
      np.testing.assert_array_equal(grid[bb, t // k, t % k], tokens[bb, t + 1])
  # The cls token is nowhere in the grid.
  for bb in range(b):
    assert not np.any(np.all(grid[bb] == tokens[bb, 0], axis=-1))
  no_cls = drloc_head.tokens_to_grid(jnp.asarray(tokens[:, 1:]), has_cls=False)
  np.testing.assert_array_equal(np.asarray(no_cls), grid)
  rect = drloc_head.tokens_to_grid(jnp.zeros((1, 1 + 12, 2)), grid_hw=(3, 4))
  assert rect.shape == (1, 3, 4, 2)
  with pytest.raises(ValueError, match="square"):
    drloc_head.tokens_to_grid(jnp.zeros((1, 1 + 12, 2)))


def test_pool_grid_matches_reference():
  rng = np.random.default_rng(1)
  g14 = rng.normal(size=(2, 14, 14, 3)).astype(np.float32)
  out = np.asarray(drloc_head.pool_grid(jnp.asarray(g14)))
  assert out.shape == (2, 7, 7, 3)
  np.testing.assert_allclose(out, ref_pool(g14), rtol=1e-5, atol=1e-6)
  # Interior cell = plain 3x3 mean; corner = mean of the 4 valid cells (count_include_pad=False).
  np.testing.assert_allclose(out[0, 3, 3], g14[0, 5:8, 5:8].mean((0, 1)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out[0, 0, 0], g14[0, 0:2, 0:2].mean((0, 1)), rtol=1e-5, atol=1e-6)
  # auto: 8 unchanged, 16 -> 8, 28 -> 14 -> 7; always halves once; none is identity.
  g8 = jnp.asarray(rng.normal(size=(1, 8, 8, 2)), jnp.float32)
  np.testing.assert_array_equal(np.asarray(drloc_head.pool_grid(g8)), np.asarray(g8))
  assert drloc_head.pool_grid(jnp.zeros((1, 16, 16, 2))).shape == (1, 8, 8, 2)
  assert drloc_head.pool_grid(jnp.zeros((1, 28, 28, 2))).shape == (1, 7, 7, 2)
  assert drloc_head.pool_grid(g8, "always").shape == (1, 4, 4, 2)
  np.testing.assert_allclose(
    np.asarray(drloc_head.pool_grid(g8, "always")), ref_pool(g8), rtol=1e-5, atol=1e-6
  )
  assert drloc_head.pool_grid(jnp.zeros((1, 14, 14, 2)), "none").shape == (1, 14, 14, 2)


# ---------------------------------------------------------------------------------------------
# Sampling, gather, targets


def test_sample_pairs_bounds_determinism_uniformity():
  b, m, k = 4, 64, 7
  key = jax.random.key(3)
  p1, p2 = drloc.sample_pairs(key, b, k, m)
  assert p1.shape == p2.shape == (b, m, 2) and p1.dtype == jnp.int32
  for p in (p1, p2):
    assert int(p.min()) >= 0 and int(p.max()) < k
  q1, q2 = drloc.sample_pairs(key, b, k, m)
  np.testing.assert_array_equal(np.asarray(p1), np.asarray(q1))
  np.testing.assert_array_equal(np.asarray(p2), np.asarray(q2))
  r1, _ = drloc.sample_pairs(jax.random.key(4), b, k, m)
  assert not np.array_equal(np.asarray(p1), np.asarray(r1))
  assert not np.array_equal(np.asarray(p1), np.asarray(p2))  # Two independent draws.
  # Uniform over the k*k cells (100k draws, within 4 sigma); coincident pairs at rate 1/k^2.
  n_img, m_big = 1000, 100
  p1, p2 = drloc.sample_pairs(jax.random.key(5), n_img, k, m_big)
  n = n_img * m_big
  for p in (np.asarray(p1), np.asarray(p2)):
    counts = np.bincount((p[..., 0] * k + p[..., 1]).ravel(), minlength=k * k)
    mean, sigma = n / k**2, math.sqrt(n * (1 / k**2) * (1 - 1 / k**2))
    assert np.all(np.abs(counts - mean) < 4 * sigma), (counts.min(), counts.max(), mean)
  same = np.mean(np.all(np.asarray(p1) == np.asarray(p2), axis=-1))
  assert abs(same - 1 / k**2) < 4 * math.sqrt((1 / k**2) / n)


def test_gather_row_major_matches_coordinates():
  b, k = 3, 6
  grid = np.zeros((b, k, k, 3), np.float32)
  for bb in range(b):
    for i in range(k):
      for j in range(k):
        grid[bb, i, j] = (bb, i, j)
  p, _ = drloc.sample_pairs(jax.random.key(6), b, k, 20)
  got = np.asarray(drloc.gather(jnp.asarray(grid), p))
  np.testing.assert_array_equal(got, ref_gather(grid, np.asarray(p)))
  np.testing.assert_array_equal(got[..., 1:], np.asarray(p))
  np.testing.assert_array_equal(got[..., 0], np.broadcast_to(np.arange(b)[:, None], (b, 20)))


@pytest.mark.parametrize("use_abs", [True, False])
@pytest.mark.parametrize("normalize", ["none", "code", "paper"])
def test_targets_match_reference(use_abs, normalize):
  k = 7
  p1, p2 = drloc.sample_pairs(jax.random.key(7), 3, k, 50)
  got = np.asarray(drloc.targets(p1, p2, k, use_abs=use_abs, normalize=normalize))
  want = ref_targets(p1, p2, k, use_abs, normalize)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  lo, hi = {
    ("none", True): (0, k - 1),
    ("none", False): (0, 2 * k - 2),
    ("code", True): (0, 1),
    ("code", False): (0, 1),
    ("paper", True): (0, 1),
    ("paper", False): (-1, 1),
  }[(normalize, use_abs)]
  assert got.min() >= lo and got.max() <= hi


def test_targets_hand_case():
  # Delta = p1 - p2 (the code's pxs - pys; the paper's (i - p, j - h)).
  p1 = jnp.array([[[0, 6]]], jnp.int32)
  p2 = jnp.array([[[6, 0]]], jnp.int32)
  t = lambda **kw: np.asarray(drloc.targets(p1, p2, 7, **kw))[0, 0].tolist()
  assert t() == [6.0, 6.0]
  assert t(use_abs=False) == [0.0, 12.0]
  np.testing.assert_allclose(t(normalize="paper"), [6 / 7, 6 / 7], rtol=1e-6)
  np.testing.assert_allclose(t(use_abs=False, normalize="paper"), [-6 / 7, 6 / 7], rtol=1e-6)
  np.testing.assert_allclose(t(normalize="code"), [1.0, 1.0])
  np.testing.assert_allclose(t(use_abs=False, normalize="code"), [0.0, 1.0])
  assert np.asarray(drloc.class_targets(p1, p2, 7))[0, 0].tolist() == [6, 6]
  assert np.asarray(drloc.class_targets(p1, p2, 7, use_abs=False))[0, 0].tolist() == [0, 12]
  assert drloc_head.num_offset_classes(7) == 7 and drloc_head.num_offset_classes(7, False) == 13


# ---------------------------------------------------------------------------------------------
# Head and losses


def test_head_shapes():
  d, k = 16, 7
  e = jax.ShapeDtypeStruct((2, 5, d), jnp.float32)
  shapes = lambda head: jax.eval_shape(head.init, jax.random.key(0), e, e)["params"]
  head = drloc_head.make_head("l1")
  params = shapes(head)
  assert jax.eval_shape(head.apply, {"params": params}, e, e).shape == (2, 5, 2)
  assert params["fc1"]["kernel"].shape == (2 * d, 512)
  assert params["fc2"]["kernel"].shape == (512, 512)
  assert params["out"]["kernel"].shape == (512, 2)
  head = drloc_head.make_head("ce", k, use_abs=False)
  params = shapes(head)
  assert jax.eval_shape(head.apply, {"params": params}, e, e).shape == (2, 5, 2, 13)
  assert set(params) == {"fc1", "fc2", "fc3", "out_u", "out_v"}
  assert params["out_u"]["kernel"].shape == (512, 13)


_REF_CASE = dict(b=2, k=7, d=8, m=16)


@pytest.mark.slow
def test_l1_loss_matches_reference():
  b, k, d, m = (_REF_CASE[n] for n in "bkdm")
  grid = _normal(8, (b, k, k, d))
  head, params = _head_and_params("l1", k, d)
  rng = jax.random.key(9)
  options = [(True, "none"), (False, "none"), (True, "paper"), (False, "paper"), (False, "code")]
  # One compiled function for all target options keeps the module fast.
  losses = jax.jit(
    lambda p, g, r: [
      drloc.drloc_loss(head, p, g, r, num_pairs=m, use_abs=a, normalize=n) for a, n in options
    ]
  )(params, grid, rng)
  p1, p2 = drloc.sample_pairs(rng, b, k, m)  # The same draw drloc_loss makes from rng.
  for (use_abs, normalize), got in zip(options, losses):
    want = ref_loss("l1", params, np.asarray(grid), p1, p2, use_abs, normalize)
    assert np.isfinite(float(got)) and float(got) >= 0
    np.testing.assert_allclose(float(got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["ce", "reg"])
@pytest.mark.parametrize("use_abs", [True, False])
def test_class_loss_matches_reference(variant, use_abs):
  b, k, d, m = (_REF_CASE[n] for n in "bkdm")
  grid = _normal(8, (b, k, k, d))
  head, params = _head_and_params(variant, k, d, use_abs=use_abs)
  rng = jax.random.key(9)
  got = float(_jit_loss(head, num_pairs=m, use_abs=use_abs)(params, grid, rng))
  p1, p2 = drloc.sample_pairs(rng, b, k, m)
  want = ref_loss(variant, params, np.asarray(grid), p1, p2, use_abs)
  assert np.isfinite(got)
  if variant == "ce":
    assert got >= 0  # "reg" may go negative through alpha * log(var).
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_l1_abs_invariant_to_swapping_pairs_targets():
  p1, p2 = drloc.sample_pairs(jax.random.key(10), 2, 7, 30)
  np.testing.assert_array_equal(
    np.asarray(drloc.targets(p1, p2, 7)), np.asarray(drloc.targets(p2, p1, 7))
  )


def _exact_offset_head(k, hidden=8, use_abs=True):
  """Hand-built f on embeddings e_ij = (i, j): outputs exactly |Delta| or Delta + (k-1)."""
  head = drloc_head.DrLocHead(variant="l1", hidden=hidden)
  w1 = np.zeros((4, hidden), np.float32)  # Input [i, j, p, h].
  b1 = np.zeros(hidden, np.float32)
  w3 = np.zeros((hidden, 2), np.float32)
  if use_abs:  # |x| = relu(x) + relu(-x), per axis.
    for axis in range(2):
      w1[axis, 2 * axis], w1[2 + axis, 2 * axis] = 1, -1
      w1[axis, 2 * axis + 1], w1[2 + axis, 2 * axis + 1] = -1, 1
      w3[2 * axis, axis] = w3[2 * axis + 1, axis] = 1
  else:  # Delta + (k-1) >= 0, so one ReLU unit per axis passes it unchanged.
    for axis in range(2):
      w1[axis, axis], w1[2 + axis, axis], b1[axis] = 1, -1, k - 1
      w3[axis, axis] = 1
  params = {
    "fc1": {"kernel": w1, "bias": b1},
    "fc2": {"kernel": np.eye(hidden, dtype=np.float32), "bias": np.zeros(hidden, np.float32)},
    "out": {"kernel": w3, "bias": np.zeros(2, np.float32)},
  }
  return head, jax.tree.map(jnp.asarray, params)


@pytest.mark.parametrize("use_abs", [True, False])
def test_loss_zero_when_head_predicts_targets(use_abs):
  b, k = 3, 7
  grid = np.zeros((b, k, k, 2), np.float32)
  for i in range(k):
    for j in range(k):
      grid[:, i, j] = (i, j)
  head, params = _exact_offset_head(k, use_abs=use_abs)
  loss_fn = _jit_loss(head, use_abs=use_abs)
  assert float(loss_fn(params, jnp.asarray(grid), jax.random.key(11))) == 0.0
  # A rescaled grid (offsets are translation invariant, not scale invariant) gives loss > 0.
  assert float(loss_fn(params, 1.5 * jnp.asarray(grid), jax.random.key(11))) > 0.0


def test_ce_uniform_logits_is_two_log_c():
  k, d = 7, 8
  for use_abs in (True, False):
    head, params = _head_and_params("ce", k, d, use_abs=use_abs)
    params = dict(params)
    for name in ("out_u", "out_v"):
      params[name] = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), params[name])
    grid = _normal(12, (2, k, k, d))
    loss = _jit_loss(head, use_abs=use_abs)(params, grid, jax.random.key(13))
    c = drloc_head.num_offset_classes(k, use_abs)
    np.testing.assert_allclose(float(loss), 2 * math.log(c), rtol=1e-6)


def test_class_count_mismatch_raises():
  head, params = _head_and_params("ce", 7, 8)
  with pytest.raises(ValueError, match="classes"):
    drloc.drloc_loss(head, params, jnp.zeros((1, 8, 8, 8)), jax.random.key(0))


def test_gradient_only_at_sampled_positions_and_never_cls():
  b, k, d, m = 2, 7, 8, 5
  head, params = _head_and_params("l1", k, d)
  tokens = _normal(14, (b, 1 + k * k, d))
  rng = jax.random.key(15)
  loss = lambda t: drloc.drloc_loss(head, params, drloc_head.tokens_to_grid(t), rng, num_pairs=m)
  g = np.asarray(jax.jit(jax.grad(loss))(tokens))
  assert np.all(g[:, 0] == 0)
  p1, p2 = drloc.sample_pairs(rng, b, k, m)
  mask = np.zeros((b, k * k), bool)
  for p in (np.asarray(p1), np.asarray(p2)):
    for bb in range(b):
      for s in range(m):
        mask[bb, p[bb, s, 0] * k + p[bb, s, 1]] = True
  nonzero = np.any(g[:, 1:] != 0, axis=-1)
  np.testing.assert_array_equal(nonzero, mask)


def test_defaults():
  assert drloc.DEFAULT_LAMBDA["vit"] == 0.01 and drloc.DEFAULT_NUM_PAIRS == 64


# ---------------------------------------------------------------------------------------------
# Learnability: training only f and the token grid drives the loss down.


@pytest.mark.slow
def test_loss_falls_when_training_head_and_tokens():
  b, k_tokens, d, steps = 2, 14, 32, 100
  head = drloc_head.make_head("l1")  # Default: 512 hidden units, |Delta| targets, m = 64.
  key_tok, key_head, key_pairs = jax.random.split(jax.random.key(17), 3)
  params = {
    "tokens": jax.random.normal(key_tok, (b, 1 + k_tokens * k_tokens, d)),
    "head": drloc_head.init_head(head, key_head, d),
  }

  def loss_fn(p, rng):
    grid = drloc_head.pool_grid(drloc_head.tokens_to_grid(p["tokens"]))  # 14x14 -> 7x7.
    return drloc.drloc_loss(head, p["head"], grid, rng)

  opt = optax.adam(3e-3)

  @jax.jit
  def step(p, opt_state, i):
    loss, grads = jax.value_and_grad(loss_fn)(p, jax.random.fold_in(key_pairs, i))
    updates, opt_state = opt.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state, loss

  @jax.jit
  def eval_loss(p):
    # A fixed, larger draw, so the comparison is not pair-sampling noise.
    grid = drloc_head.pool_grid(drloc_head.tokens_to_grid(p["tokens"]))
    return drloc.drloc_loss(head, p["head"], grid, jax.random.key(99), num_pairs=1024)

  opt_state = opt.init(params)
  initial = float(eval_loss(params))
  losses = []
  for i in range(steps):
    params, opt_state, loss = step(params, opt_state, i)
    losses.append(float(loss))
  final = float(eval_loss(params))
  print(
    f"drloc train: eval initial {initial:.4f} final {final:.4f}; step losses "
    f"{losses[0]:.4f} -> {losses[-1]:.4f}"
  )
  assert np.all(np.isfinite(losses))
  assert final < 0.5 * initial, (initial, final)
