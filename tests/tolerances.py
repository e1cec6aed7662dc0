"""Tolerances for comparing two float32 computations of one quantity, derived from its scale.

Two builds of one computation (optimisation levels, kernel sets, device counts, chunking, host
CPUs with other vector widths) sum the same terms in other orders. Each float32 addition rounds
by at most EPS relative to its result, so what two orders can disagree on is bounded by the
*summands'* magnitude, not by the result's: a near-zero cosine of two large gradient trees, or a
near-zero entry of a gradient whose other entries are large, carries the rounding of its large
terms. A bare `rtol` on such a value (or an `atol` picked below that scale) fails on some hosts
and passes on others. The bounds here follow that arithmetic and stay far below what a real bug
(a dropped loss term, a wrong scale, a missing projection) changes; tests/test_tolerances.py
holds every bound to both sides.
"""

from __future__ import annotations

import math

import jax
import numpy as np

EPS = float(np.finfo(np.float32).eps)  # 2**-23: one float32 rounding, relative.

# Relative agreement of two builds of a whole train step's losses and gradients. A tiny ViT +
# agent step is ~10^2 dependent float32 operations deep (matmuls, LayerNorms, softmaxes, their
# backward), each adding a few EPS of relative error that two builds round differently:
# 10^2 * EPS ~ 1e-5.
STEP_RTOL = 1e-5


def dot_rounding(n: int) -> float:
  """Relative bound (to sum |a_i b_i|) on how two summation orders of an n-term float32 dot
  product can differ: the probabilistic bound sqrt(n) * EPS of Higham & Mary (2019) with a
  factor 4 of headroom; the worst case n * EPS is never approached by blocked or pairwise sums."""
  return 4.0 * math.sqrt(max(n, 1)) * EPS


def kl_atol(temperature: float, num_classes: int, rtol: float = STEP_RTOL) -> float:
  """Absolute bound on how two builds' distillation loss T^2 KL(p_t || p_s) can differ.

  The KL is a difference of two cross-entropies of size ~log(C) each, scaled by T^2: near zero
  (two models that still agree), the rounding of those terms is all there is.
  """
  return rtol * temperature**2 * math.log(num_classes)


def cosine_atol(n: int, rtol: float = STEP_RTOL) -> float:
  """Absolute bound on how two builds' cosine of two n-entry vectors can differ.

  The cosine's gradient with respect to a has norm <= 1/||a||, so vectors agreeing to a
  relative norm error `rtol` each move the cosine by at most rtol per vector (2 * rtol for
  both); the dot product's own rounding adds dot_rounding(n) relative to sum |a_i b_i| <=
  ||a|| ||b||, i.e. dot_rounding(n) in cosine units. Near zero, this is the whole tolerance.
  """
  return 2.0 * rtol + dot_rounding(n)


def assert_close_to_scale(actual, desired, rtol: float, err_msg: str = "", floor: float = 0.0):
  """Elementwise |actual - desired| <= rtol * |desired| + max(floor, rtol * max |desired|).

  For arrays whose entries are sums over terms of the array's own magnitude (gradients, BatchNorm
  means, activations): an entry near zero carries the rounding of the large terms it cancelled,
  which the max term bounds. A wrong entry of the array's usual size still fails.
  """
  desired = np.asarray(desired, np.float64)
  actual = np.asarray(actual, np.float64)
  scale = float(np.max(np.abs(desired))) if desired.size else 0.0
  atol = max(floor, rtol * scale)
  np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, err_msg=err_msg)


def assert_trees_close_to_scale(actual, desired, rtol: float, err_msg: str = "", floor=0.0):
  """assert_close_to_scale on every leaf of two pytrees of the same structure."""
  paths = jax.tree_util.tree_flatten_with_path(desired)[0]
  got = jax.tree.leaves(actual)
  assert len(got) == len(paths), f"{err_msg}: {len(got)} leaves vs {len(paths)}"
  for (path, want), leaf in zip(paths, got):
    where = f"{err_msg} {jax.tree_util.keystr(path)}"
    assert_close_to_scale(leaf, want, rtol, err_msg=where, floor=floor)
