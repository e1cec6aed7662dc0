"""RandAugment in JAX against PIL's own ops with timm's arguments, and the policy's random draws
against timm's distributions (timm/data/auto_augment.py)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from vitboot_jax.data import randaugment as ra
from vitboot_jax.data import randaugment_policy as policy_lib

FILL = (124, 116, 104)  # timm's img_mean for the ImageNet mean.
LEVELS = (9.0, 10.0, 6.25, 3.75, 8.125)  # float32-exact, so timm's float64 sees the same level.
ALL_OPS = tuple(dict.fromkeys(ra.INCREASING_OPS + ra.ORIGINAL_OPS))
COLOUR_OPS = [n for n in ALL_OPS if n not in ra.GEOMETRIC_OPS]


def timm_argument(name, level, sign):
  """timm's `_*_level_to_arg` of `name` restated in float64; `sign` is _randomly_negate's pick."""
  f = level / 10.0
  signed = lambda v: -v if sign < 0 else v
  if name in ("AutoContrast", "Equalize", "Invert"):
    return None
  return {
    "Rotate": lambda: signed(f * 30.0),
    "Posterize": lambda: int(f * 4),
    "PosterizeIncreasing": lambda: 4 - int(f * 4),
    "Solarize": lambda: min(256, int(f * 256)),
    "SolarizeIncreasing": lambda: 256 - min(256, int(f * 256)),
    "SolarizeAdd": lambda: min(128, int(f * 110)),
    "ShearX": lambda: signed(f * 0.3),
    "ShearY": lambda: signed(f * 0.3),
    "TranslateXRel": lambda: signed(f * 0.45),
    "TranslateYRel": lambda: signed(f * 0.45),
  }.get(name, lambda: max(0.1, 1.0 + signed(f * 0.9)) if "Increasing" in name else f * 1.8 + 0.1)()


def pil_op(image, name, argument):
  """timm's op functions on a PIL image, BILINEAR for the geometric ones."""
  if name == "AutoContrast":
    return ImageOps.autocontrast(image)
  if name == "Equalize":
    return ImageOps.equalize(image)
  if name == "Invert":
    return ImageOps.invert(image)
  if name.startswith("Posterize"):  # Pillow >= 9 refuses 0 bits; older PIL gave a black image.
    return image.point([0] * 768) if argument == 0 else ImageOps.posterize(image, argument)
  if name == "SolarizeAdd":
    return image.point([min(255, i + argument) if i < 128 else i for i in range(256)] * 3)
  if name.startswith("Solarize"):
    return ImageOps.solarize(image, argument)
  for prefix, enhance in (
    ("Color", ImageEnhance.Color),
    ("Contrast", ImageEnhance.Contrast),
    ("Brightness", ImageEnhance.Brightness),
    ("Sharpness", ImageEnhance.Sharpness),
  ):
    if name.startswith(prefix):
      return enhance(image).enhance(argument)
  kwargs = {"resample": Image.BILINEAR, "fillcolor": FILL}
  if name == "Rotate":
    return image.rotate(argument, **kwargs)
  w, h = image.size
  matrix = {
    "ShearX": (1, argument, 0, 0, 1, 0),
    "ShearY": (1, 0, 0, argument, 1, 0),
    "TranslateXRel": (1, 0, argument * w, 0, 1, 0),
    "TranslateYRel": (1, 0, 0, 0, 1, argument * h),
  }[name]
  return image.transform(image.size, Image.AFFINE, matrix, **kwargs)


@functools.cache
def jitted_op(name):
  return jax.jit(functools.partial(ra.apply_op, name=name, fill=FILL))


def ours(image, name, level, sign):
  out = jitted_op(name)(jnp.asarray(image, jnp.float32), level=level, sign=sign)
  return np.asarray(out)


def theirs(image, name, level, sign):
  return np.asarray(pil_op(Image.fromarray(image), name, timm_argument(name, level, sign)), float)


@pytest.fixture(scope="module")
def images():
  rng = np.random.default_rng(0)
  peaked = np.full((17, 23, 3), 250, np.uint8)  # Equalize's lut passes 255 here: PIL clips it.
  peaked.reshape(-1, 3)[:300] = (np.arange(300) % 200)[:, None]
  flat = rng.integers(0, 256, (17, 23, 3)).astype(np.uint8)
  flat[..., 1] = 77  # One value: AutoContrast and Equalize leave the channel alone.
  return [
    rng.integers(0, 256, (32, 32, 3)).astype(np.uint8),
    rng.integers(40, 200, (17, 23, 3)).astype(np.uint8),
    (rng.integers(0, 256, (24, 20, 3)) // 3 + 30).astype(np.uint8),
    peaked,
    flat,
  ]


@pytest.mark.parametrize("name", COLOUR_OPS)
def test_colour_ops_equal_pil(images, name):
  for image in images:
    for level in LEVELS:
      for sign in (1.0, -1.0):
        got, want = ours(image, name, level, sign), theirs(image, name, level, sign)
        assert got.dtype == np.float32 and got.shape == image.shape
        np.testing.assert_array_equal(got, want, err_msg=f"{name} level {level} sign {sign}")


@pytest.mark.parametrize("name", ["Color", "ContrastIncreasing", "SharpnessIncreasing"])
def test_blends_equal_pil_in_the_optimised_build(images, name):
  """XLA's default backend optimisations (off in the suite, see conftest) fuse a multiply and an
  add into one rounding; PIL rounds twice, and the blends keep to that in both builds."""
  from jax._src.lib import xla_client

  defaults = xla_client.CompileOptions().executable_build_options.debug_options
  users = {"xla_backend_optimization_level": defaults.xla_backend_optimization_level}
  assert users["xla_backend_optimization_level"] > 0  # Otherwise this is the suite's build.
  for image in images[:3]:
    x = jnp.asarray(image, jnp.float32)
    build = jitted_op(name).lower(x, level=9.0, sign=1.0).compile(users)
    for level in (9.0, 6.25):
      for sign in (1.0, -1.0):
        got = np.asarray(build(x, level=jnp.float32(level), sign=jnp.float32(sign)))
        np.testing.assert_array_equal(got, theirs(image, name, level, sign), f"{name} {level}")


def test_auto_contrast_keeps_pils_float64_rounding():
  """Every value of [lo, hi] in a channel, so the whole lut shows, for (lo, hi) pairs where
  PIL's float64 lut is a level below the exact one and pairs where it is not."""
  lower = ra._autocontrast_lower()
  pairs = sorted({(int(k) >> 16, (int(k) >> 8) & 255) for k in lower[::997]})[:12]
  pairs += [(0, 255), (3, 250), (100, 101), (37, 200)]
  for lo, hi in pairs:
    values = np.resize(np.arange(lo, hi + 1), 256).reshape(16, 16)
    image = np.stack([values, values[::-1], np.full_like(values, lo)], -1).astype(np.uint8)
    np.testing.assert_array_equal(
      ours(image, "AutoContrast", 0.0, 1.0), theirs(image, "AutoContrast", 0.0, 1.0), f"{lo, hi}"
    )


@pytest.mark.parametrize("name", ra.GEOMETRIC_OPS)
def test_geometric_ops_match_pil_bilinear(images, name):
  """PIL computes coordinates in float64, we in float32: where a bilinear value lands on an
  integer the truncation can go either way, so values agree to one level, and the fill edge
  to a pixel."""
  for image in images[:3]:
    for level in LEVELS:
      for sign in (1.0, -1.0):
        diff = np.abs(ours(image, name, level, sign) - theirs(image, name, level, sign))
        context = f"{name} level {level} sign {sign} {image.shape}"
        assert (diff > 1).mean() <= 0.01, context
        assert (diff > 0).mean() <= 0.15, context


def test_whole_pixel_translations_and_a_half_turn_are_pils():
  """Little or no interpolation: a sharp check of the direction, origin and fill conventions."""
  image = np.random.default_rng(1).integers(0, 256, (40, 20, 3)).astype(np.uint8)
  for name in ("TranslateXRel", "TranslateYRel"):  # 0.45 x 20 = 9 and 0.45 x 40 = 18 pixels.
    for sign in (1.0, -1.0):
      np.testing.assert_array_equal(ours(image, name, 10.0, sign), theirs(image, name, 10.0, sign))
  want = np.asarray(Image.fromarray(image).rotate(180.0, Image.BILINEAR, fillcolor=FILL), float)
  got = np.asarray(
    ra.affine(
      jnp.asarray(image, jnp.float32),
      ra.affine_matrix("Rotate", 180.0, 40, 20),
      jnp.asarray(FILL, jnp.float32),
    )
  )
  np.testing.assert_allclose(got, want, atol=1)  # cos(pi) is -1 only to float32.


@pytest.mark.parametrize("name", ra.INCREASING_OPS + ("Posterize", "Solarize", "Color"))
def test_op_arguments_are_timms(name):
  argument = jax.jit(ra.op_argument, static_argnums=0)
  for level in LEVELS + (0.0, 2.5, 7.5, 0.5):
    for sign in (1.0, -1.0):
      want = timm_argument(name, level, sign)
      got = argument(name, level, sign)
      if want is None:
        continue
      if isinstance(want, int):
        assert got.dtype == jnp.int32 and int(got) == want, (level, sign)
      else:
        assert float(got) == float(np.float32(want)), (level, sign)


@functools.cache
def augment():
  return jax.jit(jax.vmap(functools.partial(ra.randaugment, policy=policy_lib.Policy(), fill=FILL)))


def test_policy_is_deterministic_and_keeps_uint8_levels():
  images = np.random.default_rng(2).integers(0, 256, (16, 24, 24, 3)).astype(np.float32)
  keys = jax.random.split(jax.random.key(0), 16)
  first, again = augment()(images, keys), augment()(images, keys)
  other = augment()(images, jax.random.split(jax.random.key(1), 16))
  np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
  assert first.shape == images.shape and first.dtype == jnp.float32
  out = np.asarray(first)
  assert out.min() >= 0 and out.max() <= 255 and np.array_equal(out, np.round(out))
  changed = np.any(np.asarray(other) != out, axis=(1, 2, 3))
  assert changed.mean() > 0.5  # Some images draw no op (a quarter) in both, or the same ops.
  assert np.any(out != images, axis=(1, 2, 3)).mean() > 0.5


def test_policy_applies_its_drawn_ops_in_order():
  """jit(vmap(randaugment)) is apply_op, op after op, of what sample_choices drew (one warp
  branch stands in for the five geometric ops: this checks the mapping)."""
  policy = policy_lib.Policy()
  images = np.random.default_rng(3).integers(0, 256, (48, 16, 16, 3)).astype(np.float32)
  keys = jax.random.split(jax.random.key(7), len(images))
  got = np.asarray(augment()(images, keys))
  seen = set()
  for image, key, out in zip(images, keys, got):
    choices = ra.sample_choices(key, policy)
    want = image.astype(np.uint8)
    for op, applied, level, sign in zip(*(np.asarray(c) for c in choices)):
      if applied:
        name = ra.op_names(policy)[op]
        seen.add(name)
        want = ours(want, name, float(level), float(sign)).astype(np.uint8)
    diff = np.abs(out - want)  # Geometric ops: one level where two programs round differently.
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01
  assert len(seen) >= 12


def test_magnitudes_are_timms_clipped_normal():
  n = 20000
  keys = jax.random.split(jax.random.key(0), n)
  draws = jax.jit(jax.vmap(functools.partial(ra.sample_choices, policy=policy_lib.Policy())))(keys)
  m = np.asarray(draws.magnitude).ravel()
  assert m.min() >= 0.0 and m.max() == 10.0
  # min(N(9, 0.5), 10): the clip is at 2 standard deviations.
  phi = math.exp(-2.0) / math.sqrt(2 * math.pi)
  tail = 0.5 * math.erfc(2 / math.sqrt(2))
  mean_z = -phi + 2 * tail
  var_z = (1 - tail) - 2 * phi + 4 * tail - mean_z**2
  se = 0.5 / math.sqrt(m.size)
  assert abs(m.mean() - (9 + 0.5 * mean_z)) < 4 * se
  assert abs(m.std() - 0.5 * math.sqrt(var_z)) < 4 * se / math.sqrt(2) * 1.5
  assert abs((m == 10.0).mean() - tail) < 4 * math.sqrt(tail / m.size)
  fixed = ra.sample_choices(jax.random.key(0), policy_lib.Policy(magnitude_std=0.0, num_ops=50))
  np.testing.assert_array_equal(np.asarray(fixed.magnitude), 9.0)
  uniform = ra.sample_choices(jax.random.key(0), policy_lib.parse_policy("rand-m8-mstd101-n5000"))
  u = np.asarray(uniform.magnitude)
  assert u.min() >= 0 and u.max() <= 8 and abs(u.mean() - 4) < 4 * 8 / math.sqrt(12 * u.size)
  also = ra.sample_choices(
    jax.random.key(0), policy_lib.Policy(num_ops=200, magnitude=8.0, magnitude_std=101.0)
  )
  assert np.asarray(also.magnitude).max() <= 8  # > 100 is uniform however it was parsed.


def test_ops_are_drawn_uniformly_and_applied_half_the_time():
  n = 20000
  keys = jax.random.split(jax.random.key(1), n)
  draws = jax.jit(jax.vmap(functools.partial(ra.sample_choices, policy=policy_lib.Policy())))(keys)
  ops = np.asarray(draws.op).ravel()
  assert ops.size == 2 * n
  freq = np.bincount(ops, minlength=15) / ops.size
  assert freq.size == 15
  se = math.sqrt((1 / 15) * (14 / 15) / ops.size)
  np.testing.assert_array_less(np.abs(freq - 1 / 15), 4 * se)
  se_half = math.sqrt(0.25 / ops.size)
  assert abs(np.asarray(draws.applied).mean() - 0.5) < 4 * se_half
  assert abs((np.asarray(draws.sign) < 0).mean() - 0.5) < 4 * se_half
  assert set(np.unique(np.asarray(draws.sign))) == {-1.0, 1.0}
  # The two slots are drawn independently: both apply a quarter of the time.
  both = np.asarray(draws.applied).all(axis=1).mean()
  assert abs(both - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n)


def test_parse_policy():
  assert policy_lib.parse_policy(policy_lib.DEIT_POLICY) == policy_lib.Policy()
  assert policy_lib.parse_policy("rand-m9-n3-mstd0.5") == policy_lib.Policy(
    num_ops=3, increasing=False
  )
  assert policy_lib.parse_policy("rand") == policy_lib.Policy(
    magnitude=10.0, magnitude_std=0.0, increasing=False
  )
  assert policy_lib.parse_policy("rand-m7.5-mmax12-inc1-p0.8") == policy_lib.Policy(
    magnitude=7.5, magnitude_std=0.0, magnitude_max=12.0, prob=0.8
  )
  assert policy_lib.parse_policy("rand-mstd101").magnitude_std == math.inf
  assert ra.op_names(policy_lib.Policy(increasing=False)) == ra.ORIGINAL_OPS


@pytest.mark.parametrize(
  "spec, part",
  [
    ("rand-m9-foo1", "'foo1'"),
    ("auto-m9", "'rand'"),
    ("rand-mx", "'mx'"),
    ("rand-n0", "'n0'"),
    ("rand-m9-m8", "'m8'"),
    ("rand-inc2", "'inc2'"),
    ("rand-p1.5", "'p1.5'"),
    ("rand--m9", "''"),
    ("rand-n2.5", "'n2.5'"),
  ],
)
def test_parse_policy_rejects_in_one_line(spec, part):
  with pytest.raises(ValueError) as raised:
    policy_lib.parse_policy(spec)
  message = str(raised.value)
  assert "\n" not in message and part in message and policy_lib.DEIT_POLICY in message


def test_randaugment_rejects_other_shapes():
  with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
    ra.randaugment(jnp.zeros((8, 8, 4)), jax.random.key(0), policy_lib.Policy(), FILL)
