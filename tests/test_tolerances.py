"""The float32 tolerances of tests/tolerances.py: wide enough for two summation orders, narrow
enough that a realistic bug (a dropped term, a wrong scale) fails them."""

import math

import numpy as np
import pytest

from tests import tolerances


def _orders(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
  """One float32 dot product summed in two orders: sequentially, and pairwise by numpy."""
  products = (a * b).astype(np.float32)
  sequential = np.float32(0)
  for p in products:  # Left to right, rounding to float32 at every addition.
    sequential = np.float32(sequential + p)
  return float(sequential), float(np.sum(products, dtype=np.float32))


@pytest.mark.parametrize("n", [1_000, 20_000])
def test_cosine_bound_covers_summation_order_and_catches_a_dropped_term(n):
  rng = np.random.default_rng(n)
  a = rng.normal(size=n).astype(np.float32)
  b = (rng.normal(size=n) + 0.01 * a).astype(np.float32)  # Nearly orthogonal: cosine ~ 0.01.
  norms = float(np.linalg.norm(a.astype(np.float64)) * np.linalg.norm(b.astype(np.float64)))
  first, second = _orders(a, b)
  exact = float(a.astype(np.float64) @ b.astype(np.float64))
  bound = tolerances.cosine_atol(n)
  for value in (first, second):
    assert abs(value - exact) / norms <= tolerances.dot_rounding(n) <= bound
  # A dropped term: b without the component a contributes to it.
  dropped = float(a.astype(np.float64) @ (b - 0.01 * a).astype(np.float64)) / norms
  assert abs(dropped - exact / norms) > 10 * bound


def test_scale_tolerance_covers_cancelled_entries_and_catches_a_wrong_entry():
  rng = np.random.default_rng(0)
  # A gradient-like sum over 4096 examples: entries of consistent sign, and one that cancels to
  # ~0, which only the scale of its terms (that of the other entries) bounds.
  terms = (1.0 + rng.normal(size=(4096, 64))).astype(np.float32)
  terms[:, 0] -= terms[:, 0].mean()
  pairwise = np.ascontiguousarray(terms.T).sum(axis=1, dtype=np.float32)
  sequential = np.zeros(64, np.float32)
  for row in terms:
    sequential = (sequential + row).astype(np.float32)
  tolerances.assert_close_to_scale(sequential, pairwise, tolerances.STEP_RTOL)
  with pytest.raises(AssertionError):  # What a bare rtol does with the cancelled entry.
    np.testing.assert_allclose(sequential[:1], pairwise[:1], rtol=tolerances.STEP_RTOL)
  wrong = pairwise.copy()
  wrong[3] += 1e-3 * np.abs(pairwise).max()
  with pytest.raises(AssertionError):
    tolerances.assert_close_to_scale(wrong, pairwise, tolerances.STEP_RTOL)
  with pytest.raises(AssertionError):
    tolerances.assert_trees_close_to_scale({"w": wrong}, {"w": pairwise}, tolerances.STEP_RTOL)


def _kl(teacher: np.ndarray, student: np.ndarray, temperature: float, dtype) -> float:
  def log_softmax(z):
    z = (z / temperature).astype(dtype)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))

  lt, ls = log_softmax(teacher), log_softmax(student)
  return float(temperature**2 * (np.exp(lt) * (lt - ls)).sum(-1).mean())


def test_kl_bound_covers_float32_and_catches_a_missing_temperature_factor():
  rng = np.random.default_rng(1)
  teacher = rng.normal(size=(8, 10)).astype(np.float32)
  student = teacher + 0.2 * rng.normal(size=(8, 10)).astype(np.float32)  # KL ~ 0: agreeing.
  exact = _kl(teacher, student, 4.0, np.float64)
  bound = tolerances.kl_atol(4.0, 10)
  assert abs(_kl(teacher, student, 4.0, np.float32) - exact) <= bound
  assert abs(exact / 4.0**2 - exact) > bound  # T^2 forgotten.
  assert bound == pytest.approx(tolerances.STEP_RTOL * 16 * math.log(10))
