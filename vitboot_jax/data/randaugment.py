"""DeiT's RandAugment (timm's `rand-m9-mstd0.5-inc1`) in pure JAX, for jitted steps on any backend.

The reference is timm/data/auto_augment.py (`rand_augment_transform`, `RandAugment`, `AugmentOp`,
`_RAND_INCREASING_TRANSFORMS`, the `_*_level_to_arg` functions, `_LEVEL_DENOM = 10`) on PIL
images; PIL's ops define each op's arithmetic. Per image: `num_ops` ops are drawn uniformly with
replacement from the 15 below; each is applied with probability `prob`; each application draws
its magnitude from N(magnitude, magnitude_std) clipped to [0, magnitude_max] (uniform on
[0, magnitude] when magnitude_std is infinite, timm's `mstd` > 100), and a signed op negates its
argument with probability 0.5. `level` is that magnitude, `f = level / 10`:

  op                    argument (timm's level function)          range at level 0..10
  AutoContrast          -                                         ImageOps.autocontrast, cutoff 0
  Equalize              -                                         ImageOps.equalize
  Invert                -                                         ImageOps.invert
  Rotate                degrees = +-30 f                          [-30, 30], about the centre
  PosterizeIncreasing   bits kept = 4 - int(4 f)                  4 .. 0 (0: a black image)
  SolarizeIncreasing    threshold = 256 - min(256, int(256 f))    256 .. 0 (invert where >= it)
  SolarizeAdd           add = min(128, int(110 f)), threshold 128  0 .. 110
  ColorIncreasing       factor = max(0.1, 1 +- 0.9 f)             [0.1, 1.9], blend with grey
  ContrastIncreasing    factor as Color                           blend with the grey mean
  BrightnessIncreasing  factor as Color                           blend with black
  SharpnessIncreasing   factor as Color                           blend with PIL's SMOOTH filter
  ShearX                shear = +-0.3 f: (1, s, 0, 0, 1, 0)       [-0.3, 0.3], about the origin
  ShearY                shear = +-0.3 f: (1, 0, 0, s, 1, 0)       [-0.3, 0.3], about the origin
  TranslateXRel         pixels = +-0.45 f x width                 [-0.45, 0.45] of the width
  TranslateYRel         pixels = +-0.45 f x height                [-0.45, 0.45] of the height

With `increasing=False` (timm's `_RAND_TRANSFORMS`) Posterize keeps int(4 f) bits, Solarize's
threshold is min(256, int(256 f)) and the four enhance ops take the unsigned factor 1.8 f + 0.1.

PIL's arithmetic, kept exactly: grey is PIL's RGB->L, (19595 R + 38470 G + 7471 B + 2^15) >> 16
(not the documented 299/587/114 / 1000, which differs on some pixels); Image.blend computes
`a + factor (b - a)` in float32, rounding after the product and after the sum (kept where XLA
would fuse them into one multiply-add), and truncates; Contrast's grey is
int(mean of L + 0.5); SMOOTH is [[1,1,1],[1,5,1],[1,1,1]] / 13 rounded to nearest, the border
pixels kept; Equalize's lut is (step // 2 + count below) // step, clipped to 255, with
step = (pixels - count of the top value) // 255 and the channel unchanged where step is 0;
AutoContrast's lut is int(v * scale + offset) in float64, reproduced by the exact floor plus a
table of the (lo, hi, v) where float64 rounds one level lower. Every op returns integer levels
in [0, 255], as PIL's uint8 images have.

Where we differ from DeiT's pipeline:
  * Geometric ops resample bilinearly (the PIL BILINEAR convention: output pixel centre ->
    input coordinate through the affine matrix, outside [0, size) the fill colour, neighbours
    clamped at the edges, the result truncated); DeiT passes timm its train interpolation,
    bicubic (timm's own default picks bilinear or bicubic at random). Coordinates are float32
    where PIL's are float64, so a value that lands on an integer can come out a level apart.
  * Magnitudes are float32 draws of jax.random (timm: Python's random, float64); from a given
    magnitude the arguments are timm's (the enhance factors rounded to float32, as PIL takes them).
  * PosterizeIncreasing at level 10 keeps 0 bits: a black image, as PIL did when DeiT was
    trained (Pillow >= 9 raises ValueError for 0 bits, so timm on today's Pillow fails there).
  * parse_policy is strict where timm is lax: timm ignores parts with no digit, reads `inc0` as
    on (`bool("0")`), and takes only integer m and mmax; we raise, read inc0 as off, and take
    floats. The `t<name>` (transform set) part is not supported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vitboot_jax.data.randaugment_policy import LEVEL_DENOM, Policy

# timm's _RAND_INCREASING_TRANSFORMS and _RAND_TRANSFORMS, in timm's order.
INCREASING_OPS = (
  "AutoContrast",
  "Equalize",
  "Invert",
  "Rotate",
  "PosterizeIncreasing",
  "SolarizeIncreasing",
  "SolarizeAdd",
  "ColorIncreasing",
  "ContrastIncreasing",
  "BrightnessIncreasing",
  "SharpnessIncreasing",
  "ShearX",
  "ShearY",
  "TranslateXRel",
  "TranslateYRel",
)
ORIGINAL_OPS = (
  "AutoContrast",
  "Equalize",
  "Invert",
  "Rotate",
  "Posterize",
  "Solarize",
  "SolarizeAdd",
  "Color",
  "Contrast",
  "Brightness",
  "Sharpness",
  "ShearX",
  "ShearY",
  "TranslateXRel",
  "TranslateYRel",
)
GEOMETRIC_OPS = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def op_names(policy: Policy) -> tuple[str, ...]:
  """The ops a policy draws from; any object with Policy's fields will do."""
  return INCREASING_OPS if policy.increasing else ORIGINAL_OPS


class Choices(NamedTuple):
  """The random draws of one image: one entry per op slot, [num_ops] each."""

  op: jax.Array  # int32 index into op_names(policy)
  applied: jax.Array  # bool
  magnitude: jax.Array  # float32 in [0, magnitude_max]
  sign: jax.Array  # float32 +1 or -1, used by the signed ops


def sample_choices(key: jax.Array, policy: Policy) -> Choices:
  """The op, apply coin, magnitude and sign of each of the policy's op slots."""
  k_op, k_applied, k_magnitude, k_sign = jax.random.split(key, 4)
  shape = (policy.num_ops,)
  op = jax.random.randint(k_op, shape, 0, len(op_names(policy)), jnp.int32)
  applied = jax.random.uniform(k_applied, shape) < policy.prob
  if policy.magnitude_std > 100:  # timm's parser turns mstd > 100 into inf: uniform sampling.
    magnitude = jax.random.uniform(k_magnitude, shape, maxval=policy.magnitude)
  elif policy.magnitude_std > 0:
    magnitude = policy.magnitude + policy.magnitude_std * jax.random.normal(k_magnitude, shape)
  else:
    magnitude = jnp.full(shape, policy.magnitude, jnp.float32)
  magnitude = jnp.clip(magnitude, 0.0, policy.magnitude_max)
  sign = jnp.where(jax.random.bernoulli(k_sign, 0.5, shape), -1.0, 1.0)
  return Choices(op, applied, magnitude.astype(jnp.float32), sign)


def _divide(numerator: jax.Array, denominator: float) -> jax.Array:
  """numerator / denominator correctly rounded: XLA rewrites a division by a constant as a
  multiplication by its reciprocal, which is an ulp off and so moves PIL's truncations."""
  return numerator / jax.lax.optimization_barrier(jnp.float32(denominator))


def op_argument(name: str, level: jax.Array, sign: jax.Array) -> jax.Array:
  """The argument timm's level function gives PIL's op (0 for the ops that take none).

  Exact products, then one division: integer levels give timm's values exactly, and the enhance
  factors are timm's float64 factors rounded to float32, as PIL takes them.
  """
  level = jnp.asarray(level, jnp.float32)
  sign = jnp.asarray(sign, jnp.float32)
  floor = lambda v: jnp.floor(v).astype(jnp.int32)  # int() of a non-negative value.
  if name in ("AutoContrast", "Equalize", "Invert"):
    return jnp.zeros((), jnp.float32)
  if name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
    scale = {"Rotate": 30, "ShearX": 3, "ShearY": 3, "TranslateXRel": 45, "TranslateYRel": 45}
    denominator = {"Rotate": 1, "ShearX": 10, "ShearY": 10}.get(name, 100) * LEVEL_DENOM
    return sign * _divide(level * scale[name], denominator)
  if name in ("Posterize", "PosterizeIncreasing"):
    bits = floor(_divide(level * 4, LEVEL_DENOM))
    return bits if name == "Posterize" else 4 - bits
  if name in ("Solarize", "SolarizeIncreasing"):
    threshold = jnp.minimum(256, floor(_divide(level * 256, LEVEL_DENOM)))
    return threshold if name == "Solarize" else 256 - threshold
  if name == "SolarizeAdd":
    return jnp.minimum(128, floor(_divide(level * 110, LEVEL_DENOM)))
  if name in ("Color", "Contrast", "Brightness", "Sharpness"):
    return _divide(level * 18 + LEVEL_DENOM, 10 * LEVEL_DENOM)
  if name in (
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
  ):
    return jnp.maximum(0.1, _divide(10 * LEVEL_DENOM + sign * level * 9, 10 * LEVEL_DENOM))
  raise ValueError(f"unknown op {name!r}; expected one of {INCREASING_OPS + ORIGINAL_OPS}")


# ---------------------------------------------------------------------------------------------
# The ops on one float32 [H, W, 3] image of integer levels, each as PIL computes it.


def _grey(image: jax.Array) -> jax.Array:
  """PIL's RGB -> L, int32 [H, W]."""
  rgb = image.astype(jnp.int32)
  return (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16


def _blend(degenerate: jax.Array, image: jax.Array, factor: jax.Array) -> jax.Array:
  """Image.blend(degenerate, image, factor): `degenerate + factor x difference` rounded to float32
  after the product and after the sum, then truncated and clipped."""
  degenerate = degenerate.astype(jnp.float32)
  factor = jnp.asarray(factor, jnp.float32)
  difference = image - degenerate  # An integer in [-255, 255], exact.
  # The factor's top 12 significant bits and the rest: each times the difference is exact, so
  # their sum rounds once, as PIL's product does, where a plain product would be fused with the
  # sum into one multiply-add (XLA on CPU and GPU) that skips the product's rounding.
  bits = jax.lax.bitcast_convert_type(factor, jnp.int32)
  high = jax.lax.bitcast_convert_type(bits & ~0xFFF, jnp.float32)
  mixed = degenerate + (high * difference + (factor - high) * difference)
  return jnp.clip(jnp.floor(mixed), 0.0, 255.0)


def _flat_levels(image: jax.Array) -> jax.Array:
  """int32 [H, W, 3] indices into a flat [3 x 256] table, channel by channel."""
  return image.astype(jnp.int32) + 256 * jnp.arange(3, dtype=jnp.int32)


def _lut(image: jax.Array, lut: jax.Array) -> jax.Array:
  """Maps each channel through its own row of the [3, 256] int32 table."""
  # Written out by a scatter: XLA would otherwise fuse the table's computation into the gather
  # and redo it for every pixel.
  flat = (
    jnp.zeros(lut.size, lut.dtype)
    .at[jnp.arange(lut.size)]
    .set(lut.reshape(-1), indices_are_sorted=True, unique_indices=True)
  )
  return jnp.take(flat, _flat_levels(image), mode="clip").astype(jnp.float32)


@functools.cache
def _autocontrast_lower() -> np.ndarray:
  """Sorted keys lo << 16 | hi << 8 | v where PIL's float64 lut is one below the exact floor."""
  v = np.arange(256)
  keys = []
  for lo in range(255):
    hi = np.arange(lo + 1, 256)[:, None]
    scale = 255.0 / (hi - lo)
    pil = v * scale + (-lo) * scale  # Python's int(ix * scale + offset), elementwise.
    lower = np.floor(pil) < ((v - lo) * 255) // (hi - lo)
    lower &= (v >= lo) & (v <= hi)  # Outside [lo, hi] both clip to 0 or 255.
    h, x = np.nonzero(lower)
    keys.append((lo << 16) | ((h + lo + 1) << 8) | x)
  return np.concatenate(keys).astype(np.int32)  # Ascending: lo, then hi, then v.


def auto_contrast(image: jax.Array) -> jax.Array:
  lo = image.min(axis=(0, 1)).astype(jnp.int32)[:, None]
  hi = image.max(axis=(0, 1)).astype(jnp.int32)[:, None]
  v = jnp.arange(256, dtype=jnp.int32)[None, :]
  lut = jnp.clip(((v - lo) * 255) // jnp.maximum(hi - lo, 1), 0, 255)
  table = jnp.asarray(_autocontrast_lower())
  keys = (lo << 16) | (hi << 8) | v
  found = table[jnp.minimum(jnp.searchsorted(table, keys), table.size - 1)] == keys
  return _lut(image, jnp.where(hi > lo, lut - found, v))


def equalize(image: jax.Array) -> jax.Array:
  pixels = image.shape[0] * image.shape[1]
  # A scatter-add histogram costs O(pixels); a [pixels, 256] one-hot would cost 256 times that.
  counts = jnp.zeros(3 * 256, jnp.int32).at[_flat_levels(image)].add(1, mode="drop")
  counts = counts.reshape(3, 256)
  below = jnp.cumsum(counts, axis=1) - counts
  top_level = image.max(axis=(0, 1)).astype(jnp.int32)[:, None]
  step = (pixels - jnp.take_along_axis(counts, top_level, axis=1)) // 255
  lut = jnp.minimum((step // 2 + below) // jnp.maximum(step, 1), 255)
  return _lut(image, jnp.where(step > 0, lut, jnp.arange(256, dtype=jnp.int32)[None, :]))


def invert(image: jax.Array) -> jax.Array:
  return 255.0 - image


def posterize(image: jax.Array, bits: jax.Array) -> jax.Array:
  """Keeps the top `bits` bits; 0 bits (or fewer) gives 0."""
  quantum = jnp.exp2(8.0 - jnp.clip(bits, 0, 8).astype(jnp.float32))
  return jnp.floor(image / quantum) * quantum


def solarize(image: jax.Array, threshold: jax.Array) -> jax.Array:
  return jnp.where(image >= threshold, 255.0 - image, image)


def solarize_add(image: jax.Array, add: jax.Array, threshold: int = 128) -> jax.Array:
  return jnp.where(image < threshold, jnp.minimum(image + add, 255.0), image)


def color(image: jax.Array, factor: jax.Array) -> jax.Array:
  return _blend(_grey(image)[..., None], image, factor)


def contrast(image: jax.Array, factor: jax.Array) -> jax.Array:
  grey = _grey(image)
  total, count = grey.sum(), grey.size  # Integer sums: a float32 sum is inexact past 2^24.
  mean = (2 * total + count) // (2 * count)  # int(total / count + 0.5)
  return _blend(mean, image, factor)


def brightness(image: jax.Array, factor: jax.Array) -> jax.Array:
  return _blend(jnp.zeros((), jnp.float32), image, factor)


def sharpness(image: jax.Array, factor: jax.Array) -> jax.Array:
  h, w = image.shape[:2]
  window = (  # Exact: integers below 2^24.
    sum(image[dy : h - 2 + dy, dx : w - 2 + dx] for dy in range(3) for dx in range(3))
    + 4 * image[1:-1, 1:-1]
  )
  # window / 13 is never within 1/26 of a half, so float32 rounding cannot move its rounding.
  smooth = jnp.pad(jnp.floor(window / 13 + 0.5), ((1, 1), (1, 1), (0, 0)))
  # A mask, not .at[1:-1, 1:-1].set: under vmap that becomes a scatter, ten times slower.
  border = jnp.pad(
    jnp.zeros((h - 2, w - 2, 1), bool), ((1, 1), (1, 1), (0, 0)), constant_values=True
  )
  return _blend(jnp.where(border, image, smooth), image, factor)


def affine_matrix(name: str, argument: jax.Array, height: int, width: int) -> jax.Array:
  """The (a, b, c, d, e, f) of timm's PIL call: input (x, y) = (a x + b y + c, d x + e y + f)."""
  zero, one = jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
  argument = jnp.asarray(argument, jnp.float32)
  if name == "Rotate":  # Image.rotate(degrees): counter-clockwise about (width / 2, height / 2).
    angle = -jnp.deg2rad(argument)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    cx, cy = width / 2, height / 2
    return jnp.stack([cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy])
  if name == "ShearX":
    return jnp.stack([one, argument, zero, zero, one, zero])
  if name == "ShearY":
    return jnp.stack([one, zero, zero, argument, one, zero])
  if name == "TranslateXRel":
    return jnp.stack([one, zero, argument * width, zero, one, zero])
  if name == "TranslateYRel":
    return jnp.stack([one, zero, zero, zero, one, argument * height])
  raise ValueError(f"{name!r} is not a geometric op; expected one of {GEOMETRIC_OPS}")


def affine(image: jax.Array, matrix: jax.Array, fill: jax.Array) -> jax.Array:
  """PIL's Image.transform(AFFINE, BILINEAR, fillcolor=fill) of one image.

  The bilinear of jax.scipy.ndimage.map_coordinates (order=1, mode="nearest") on pixel centres,
  written out to gather whole RGB pixels and to keep PIL's order of the interpolation's terms.
  """
  h, w = image.shape[:2]
  y, x = jnp.meshgrid(
    jnp.arange(h, dtype=jnp.float32) + 0.5, jnp.arange(w, dtype=jnp.float32) + 0.5, indexing="ij"
  )
  a, b, c, d, e, f = (matrix[i] for i in range(6))
  x_in, y_in = a * x + b * y + c, d * x + e * y + f
  inside = (x_in >= 0) & (x_in < w) & (y_in >= 0) & (y_in < h)
  x_in, y_in = x_in - 0.5, y_in - 0.5
  x0, y0 = jnp.floor(x_in), jnp.floor(y_in)
  dx, dy = (x_in - x0)[..., None], (y_in - y0)[..., None]
  x0, y0 = x0.astype(jnp.int32), y0.astype(jnp.int32)
  xs = (jnp.clip(x0, 0, w - 1), jnp.clip(x0 + 1, 0, w - 1))
  ys = (jnp.clip(y0, 0, h - 1), jnp.clip(y0 + 1, 0, h - 1))
  flat = image.reshape(h * w, 3)
  rows = []
  for yi in ys:
    left, right = flat[yi * w + xs[0]], flat[yi * w + xs[1]]
    rows.append(left + (right - left) * dx)
  value = rows[0] + (rows[1] - rows[0]) * dy
  return jnp.where(inside[..., None], jnp.floor(value), fill)


_COLOUR_OPS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
  "AutoContrast": lambda image, _: auto_contrast(image),
  "Equalize": lambda image, _: equalize(image),
  "Invert": lambda image, _: invert(image),
  "Posterize": posterize,
  "PosterizeIncreasing": posterize,
  "Solarize": solarize,
  "SolarizeIncreasing": solarize,
  "SolarizeAdd": solarize_add,
  "Color": color,
  "ColorIncreasing": color,
  "Contrast": contrast,
  "ContrastIncreasing": contrast,
  "Brightness": brightness,
  "BrightnessIncreasing": brightness,
  "Sharpness": sharpness,
  "SharpnessIncreasing": sharpness,
}


def apply_op(
  image: jax.Array, name: str, level: jax.Array, sign: jax.Array, fill: tuple[float, float, float]
) -> jax.Array:
  """Op `name` (one of INCREASING_OPS or ORIGINAL_OPS) at magnitude `level` with `sign` (+-1)."""
  argument = op_argument(name, level, sign)
  if name in GEOMETRIC_OPS:
    matrix = affine_matrix(name, argument, *image.shape[:2])
    return affine(image, matrix, jnp.asarray(fill, jnp.float32))
  return _COLOUR_OPS[name](image, argument)


def randaugment(
  image: jax.Array,
  key: jax.Array,
  policy: Policy,
  fill: tuple[float, float, float],
) -> jax.Array:
  """One float32 [H, W, 3] image of integer levels in [0, 255] -> the same, augmented.

  `fill`: the colour (integers 0-255) of the pixels a geometric op brings in (timm: img_mean,
  the dataset mean x 255 rounded). vmap it over a batch with one key per image, policy and fill
  bound (functools.partial); jit it the same way.
  """
  if image.ndim != 3 or image.shape[-1] != 3 or min(image.shape[:2]) < 3:
    raise ValueError(f"randaugment takes one [H, W, 3] image with H, W >= 3, not {image.shape}")
  names = op_names(policy)
  colour = [n for n in names if n not in GEOMETRIC_OPS]
  geometric = [n for n in names if n in GEOMETRIC_OPS]
  # One warp serves all five geometric ops: vmap runs every branch of a switch for every image.
  branch_of = jnp.asarray([colour.index(n) if n in colour else len(colour) for n in names])
  geometric_of = jnp.asarray([geometric.index(n) if n in geometric else 0 for n in names])
  fill_colour = jnp.asarray(fill, jnp.float32)
  h, w = image.shape[:2]

  def warp(image, op, level, sign):
    matrices = jnp.stack([affine_matrix(n, op_argument(n, level, sign), h, w) for n in geometric])
    return affine(image, matrices[geometric_of[op]], fill_colour)

  branches = [
    functools.partial(lambda n, image, op, level, sign: apply_op(image, n, level, sign, fill), n)
    for n in colour
  ] + [warp]

  def layer(image, choice):
    op, applied, level, sign = choice
    out = jax.lax.switch(branch_of[op], branches, image, op, level, sign)
    return jnp.where(applied, out, image), None

  image = jnp.asarray(image, jnp.float32)
  image, _ = jax.lax.scan(layer, image, tuple(sample_choices(key, policy)))
  return image
