"""Tests for losses.py against independent float64 numpy references written with explicit loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitboot_jax.method import losses

# ---------------------------------------------------------------------------------------------
# numpy references (float64, loops and explicit index arithmetic, no shared code with losses.py)


def ref_cross_entropy(logits, labels, weights=None):
  logits = np.asarray(logits, np.float64)
  per_example = []
  for i in range(logits.shape[0]):
    z = logits[i]
    lse = z.max() + math.log(sum(math.exp(v - z.max()) for v in z))
    per_example.append(lse - z[labels[i]])
  per_example = np.array(per_example)
  if weights is None:
    return per_example.mean()
  weights = np.asarray(weights, np.float64)
  return (weights * per_example).sum() / max(weights.sum(), 1.0)


def ref_softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


def ref_kd(student, teacher, t):
  student = np.asarray(student, np.float64)
  teacher = np.asarray(teacher, np.float64)
  total = 0.0
  for i in range(student.shape[0]):
    p_t = ref_softmax(teacher[i] / t)
    p_s = ref_softmax(student[i] / t)
    total += sum(p_t[c] * (math.log(p_t[c]) - math.log(p_s[c])) for c in range(len(p_t)))
  return t * t * total / student.shape[0]


def ref_pool_seq1d(seq, n_out):
  """seq [B, n, D] -> [B, n_out, D]: token j is the mean of tokens j*k .. j*k+k-1."""
  b, n, d = seq.shape
  k = n // n_out
  out = np.zeros((b, n_out, d))
  for j in range(n_out):
    for r in range(k):
      out[:, j] += seq[:, j * k + r]
  return out / k


def ref_pool_2d(seq, h, w, ho, wo):
  """seq [B, h*w, D] on a row-major h x w grid -> [B, ho*wo, D] by block averaging."""
  b, _, d = seq.shape
  fh, fw = h // ho, w // wo
  out = np.zeros((b, ho * wo, d))
  for i in range(ho):
    for j in range(wo):
      for di in range(fh):
        for dj in range(fw):
          out[:, i * wo + j] += seq[:, (i * fh + di) * w + (j * fw + dj)]
  return out / (fh * fw)


def ref_layer_norm(x, eps):
  out = np.empty_like(x)
  for idx in np.ndindex(*x.shape[:-1]):
    v = x[idx]
    mu = v.sum() / len(v)
    var = ((v - mu) ** 2).sum() / len(v)
    out[idx] = (v - mu) / math.sqrt(var + eps)
  return out


def ref_feature_loss(vit_tokens, agent_map, formula, adapt, eps=1e-5):
  vit_tokens = np.asarray(vit_tokens, np.float64)
  agent_map = np.asarray(agent_map, np.float64)
  b, h, w, d = agent_map.shape
  vit = vit_tokens[:, 1:]
  # Row-major flattening written out: token index = row * w + col.
  agent = np.zeros((b, h * w, d))
  for r in range(h):
    for c in range(w):
      agent[:, r * w + c] = agent_map[:, r, c]
  n_v, n_a = vit.shape[1], agent.shape[1]
  side = int(round(math.sqrt(n_v)))
  if adapt == "seq1d":
    if n_v > n_a:
      vit = ref_pool_seq1d(vit, n_a)
    elif n_a > n_v:
      agent = ref_pool_seq1d(agent, n_v)
  else:
    if n_v > n_a:
      vit = ref_pool_2d(vit, side, side, h, w)
    elif n_a > n_v:
      agent = ref_pool_2d(agent, h, w, side, side)
  if formula == "official":
    return ((ref_layer_norm(vit, eps) - ref_layer_norm(agent, eps)) ** 2).mean()
  total = 0.0
  for i in range(b):
    fa, fv = agent[i].ravel(), vit[i].ravel()
    fa = fa / math.sqrt((fa**2).sum())
    fv = fv / math.sqrt((fv**2).sum())
    total += ((fa - fv) ** 2).sum()
  return total / b


# ---------------------------------------------------------------------------------------------


def test_cross_entropy_matches_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 11)).astype(np.float32) * 3
  labels = rng.integers(0, 11, size=6)
  np.testing.assert_allclose(
    losses.cross_entropy(logits, labels), ref_cross_entropy(logits, labels), rtol=1e-5
  )


def test_cross_entropy_weights_mask_padding():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(8, 5)).astype(np.float32)
  labels = rng.integers(0, 5, size=8)
  weights = np.array([1, 1, 0, 1, 0, 0, 1, 1], np.float32)
  got = losses.cross_entropy(logits, labels, weights)
  np.testing.assert_allclose(got, ref_cross_entropy(logits, labels, weights), rtol=1e-5)
  # Equal to the plain mean over the kept examples, and padding rows do not matter at all.
  keep = weights > 0
  np.testing.assert_allclose(got, ref_cross_entropy(logits[keep], labels[keep]), rtol=1e-5)
  # All padding: 0, not NaN.
  assert float(losses.cross_entropy(logits, labels, np.zeros(8, np.float32))) == 0.0


@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_kd_matches_reference(temperature):
  rng = np.random.default_rng(2)
  student = rng.normal(size=(5, 10)).astype(np.float32) * 2
  teacher = rng.normal(size=(5, 10)).astype(np.float32) * 2
  np.testing.assert_allclose(
    losses.kd(student, teacher, temperature),
    ref_kd(student, teacher, temperature),
    rtol=1e-5,
    atol=1e-7,
  )
  # KL of a distribution with itself is zero.
  np.testing.assert_allclose(losses.kd(student, student, temperature), 0.0, atol=1e-6)


def test_kd_teacher_has_no_gradient():
  rng = np.random.default_rng(3)
  student = jnp.asarray(rng.normal(size=(4, 7)), jnp.float32)
  teacher = jnp.asarray(rng.normal(size=(4, 7)), jnp.float32)
  g_s, g_t = jax.grad(losses.kd, argnums=(0, 1))(student, teacher, 4.0)
  assert np.all(np.asarray(g_t) == 0.0)
  assert np.abs(np.asarray(g_s)).max() > 1e-4


# (ViT grid side, agent map h, w): 28x28 -> 14x14 maps, 14x14 -> 7x7, and equal grids.
SHAPES = [(14, 28, 28), (14, 7, 7), (14, 14, 14), (4, 8, 8), (8, 2, 2)]


@pytest.mark.parametrize("formula", ["official", "paper"])
@pytest.mark.parametrize("adapt", ["seq1d", "pool2d"])
@pytest.mark.parametrize("side,h,w", SHAPES)
def test_feature_loss_matches_reference(formula, adapt, side, h, w):
  rng = np.random.default_rng(side * 100 + h)
  b, d = 2, 6
  vit = rng.normal(size=(b, 1 + side * side, d)).astype(np.float32)
  # Offsets and scales differ per channel so LN and normalisation are not no-ops.
  agent = (rng.normal(size=(b, h, w, d)) * rng.uniform(0.5, 3, size=d) + 1.5).astype(np.float32)
  got = losses.feature_loss(vit, agent, formula=formula, adapt=adapt)
  want = ref_feature_loss(vit, agent, formula, adapt)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_seq1d_and_pool2d_differ_on_resampled_layers():
  """The official 1-D pooling is a different function from 2-D pooling when grids differ."""
  rng = np.random.default_rng(4)
  vit = rng.normal(size=(2, 1 + 196, 4)).astype(np.float32)
  agent = rng.normal(size=(2, 28, 28, 4)).astype(np.float32)
  a = losses.feature_loss(vit, agent, adapt="seq1d")
  b = losses.feature_loss(vit, agent, adapt="pool2d")
  assert abs(float(a) - float(b)) > 1e-4
  # On equal grids nothing is pooled, so the adapters agree.
  same = rng.normal(size=(2, 14, 14, 4)).astype(np.float32)
  np.testing.assert_allclose(
    losses.feature_loss(vit, same, adapt="seq1d"), losses.feature_loss(vit, same, adapt="pool2d")
  )


def test_feature_loss_ignores_cls_token():
  rng = np.random.default_rng(5)
  vit = rng.normal(size=(2, 1 + 16, 4)).astype(np.float32)
  agent = rng.normal(size=(2, 4, 4, 4)).astype(np.float32)
  other = vit.copy()
  other[:, 0] = 1e3
  np.testing.assert_array_equal(losses.feature_loss(vit, agent), losses.feature_loss(other, agent))


@pytest.mark.parametrize("formula", ["official", "paper"])
def test_feature_loss_zero_when_features_match(formula):
  rng = np.random.default_rng(6)
  agent = rng.normal(size=(2, 4, 4, 8)).astype(np.float32)
  vit = np.concatenate([np.ones((2, 1, 8), np.float32), agent.reshape(2, 16, 8)], axis=1)
  np.testing.assert_allclose(losses.feature_loss(vit, agent, formula=formula), 0.0, atol=1e-6)


def test_correlation_form_rewards_the_pattern_over_positions_not_the_images_mean():
  rng = np.random.default_rng(8)
  agent = rng.normal(size=(2, 4, 4, 8)).astype(np.float32)
  tokens = agent.reshape(2, 16, 8)
  with_cls = lambda t: jnp.concatenate([jnp.zeros((2, 1, 8), jnp.float32), t], axis=1)
  loss = lambda t: float(losses.feature_loss(with_cls(t), agent, formula="corr"))
  assert loss(tokens) == pytest.approx(0.0, abs=1e-4)
  # Per image and channel, a positive scale and any shift of the ViT's side change nothing.
  scale, shift = rng.uniform(0.5, 3, (2, 1, 8)), rng.normal(size=(2, 1, 8))
  assert loss(tokens * scale + shift) == pytest.approx(0.0, abs=1e-4)
  assert loss(-tokens) == pytest.approx(2.0, abs=1e-4)
  # One token at every position (the image's mean): no reward, and a gradient away from it.
  shared = np.repeat(tokens.mean(1, keepdims=True), 16, axis=1)
  assert loss(shared) == pytest.approx(1.0, abs=1e-6)
  grad = jax.grad(lambda t: losses.feature_loss(with_cls(t), agent, formula="corr"))(
    jnp.asarray(shared + 1e-3 * rng.normal(size=shared.shape).astype(np.float32))
  )
  assert float(jnp.abs(grad).max()) > 1.0
  # The MSE forms instead reward the shared token over tokens unrelated to the target.
  unrelated = rng.normal(size=tokens.shape).astype(np.float32)
  official = lambda t: float(losses.feature_loss(with_cls(t), agent))
  assert official(shared) < official(unrelated)


@pytest.mark.parametrize("formula", ["official", "paper", "corr"])
@pytest.mark.parametrize("adapt", ["seq1d", "pool2d"])
def test_feature_loss_teacher_has_no_gradient(formula, adapt):
  rng = np.random.default_rng(7)
  vit = jnp.asarray(rng.normal(size=(2, 1 + 16, 4)), jnp.float32)
  agent = jnp.asarray(rng.normal(size=(2, 8, 8, 4)), jnp.float32)
  fn = lambda v, a: losses.feature_loss(v, a, formula=formula, adapt=adapt)
  g_v, g_a = jax.grad(fn, argnums=(0, 1))(vit, agent)
  assert np.all(np.asarray(g_a) == 0.0)
  assert np.abs(np.asarray(g_v)[:, 1:]).max() > 1e-5
  # The dropped cls token gets no gradient either.
  assert np.all(np.asarray(g_v)[:, 0] == 0.0)


def test_feature_loss_rejects_non_integer_ratios():
  vit = np.zeros((1, 1 + 196, 4), np.float32)
  with pytest.raises(ValueError, match=r"196.*25|25.*196"):
    losses.feature_loss(vit, np.zeros((1, 5, 5, 4), np.float32), adapt="seq1d")
  with pytest.raises(ValueError, match="14x14"):
    losses.feature_loss(vit, np.zeros((1, 5, 5, 4), np.float32), adapt="pool2d")
  with pytest.raises(ValueError, match="square"):
    losses.feature_loss(
      np.zeros((1, 1 + 12, 4), np.float32), np.zeros((1, 2, 3, 4), np.float32), adapt="pool2d"
    )


def test_feature_losses_sum_over_layers():
  rng = np.random.default_rng(8)
  vits = [rng.normal(size=(2, 1 + 16, 4)).astype(np.float32) for _ in range(3)]
  agents = [rng.normal(size=(2, s, s, 4)).astype(np.float32) for s in (8, 4, 2)]
  total, per_layer = losses.feature_losses(vits, agents, formula="official", adapt="pool2d")
  assert len(per_layer) == 3
  want = [ref_feature_loss(v, a, "official", "pool2d") for v, a in zip(vits, agents)]
  np.testing.assert_allclose(list(per_layer.values()), want, rtol=1e-5)
  np.testing.assert_allclose(total, sum(want), rtol=1e-5)
  with pytest.raises(ValueError, match="paired"):
    losses.feature_losses(vits, agents[:2])


def test_feature_weight_per_epoch_is_piecewise_constant():
  spe, epochs = 7, 5
  fn = jax.jit(lambda s: losses.feature_weight(s, spe, epochs, per="epoch"))
  for step in range(spe * epochs):
    e = step // spe
    np.testing.assert_allclose(fn(jnp.int32(step)), 1 - e / epochs, rtol=1e-6)
  # The last epoch keeps weight 1/E (not 0); training past E clamps to 0.
  np.testing.assert_allclose(fn(jnp.int32(spe * epochs - 1)), 1 / epochs, rtol=1e-6)
  assert float(fn(jnp.int32(spe * (epochs + 3)))) == 0.0
  # Float steps (e.g. from a float counter) agree.
  np.testing.assert_allclose(
    losses.feature_weight(jnp.float32(2 * spe - 1), spe, epochs), 1 - 1 / epochs, rtol=1e-6
  )


def test_feature_weight_per_step_is_continuous():
  spe, epochs = 7, 5
  steps = np.arange(spe * epochs)
  w = np.array([float(losses.feature_weight(jnp.int32(s), spe, epochs, per="step")) for s in steps])
  np.testing.assert_allclose(w, 1 - steps / (spe * epochs), rtol=1e-6, atol=1e-7)
  # Strictly decreasing by the same amount every step (no plateaus).
  np.testing.assert_allclose(np.diff(w), -1 / (spe * epochs), rtol=1e-4)


@pytest.mark.parametrize("name", ["shared_res_h9", "shared_vitstem_h9"])
def test_ce_and_kd_match_official_golden(golden_dir, name):
  """CE and KD against the loss values the authors' PyTorch loss modules produced."""
  d = np.load(golden_dir / f"{name}.npz")
  vit, cnn, labels = d["train/logits_vit"], d["train/logits_cnn"], d["labels"]
  np.testing.assert_allclose(losses.cross_entropy(vit, labels), d["loss/joint.cls_vit"], rtol=1e-5)
  np.testing.assert_allclose(losses.cross_entropy(cnn, labels), d["loss/joint.cls_cnn"], rtol=1e-5)
  np.testing.assert_allclose(losses.kd(vit, cnn, 4.0), d["loss/joint.kd_vit.cnn"], rtol=1e-4)
  np.testing.assert_allclose(losses.kd(cnn, vit, 4.0), d["loss/joint.kd_cnn.vit"], rtol=1e-4)


def test_feature_weight_none_is_constant():
  """Table 4's "No Decay": weight 1 at every step, past the last epoch too, under jit."""
  spe, epochs = 7, 5
  fn = jax.jit(lambda s: losses.feature_weight(s, spe, epochs, per="none"))
  for step in (0, 1, spe, spe * epochs - 1, spe * (epochs + 3)):
    assert float(fn(jnp.int32(step))) == 1.0
  assert float(losses.feature_weight(jnp.float32(3.5), spe, epochs, per="none")) == 1.0
