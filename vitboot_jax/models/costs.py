"""Parameter and multiply-accumulate (MAC) counts, measured on the traced computation.

MACs count the matmuls and convolutions of the jaxpr (elementwise ops are not MACs). The
per-image figure is MACs(batch 2) - MACs(batch 1), so work that does not scale with the batch
(e.g. assembling the shared agent's CONV taps from W_V and W_O) is left out, as in a FLOP table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex_core
import numpy as np


def _eqn_macs(eqn) -> int:
  name = eqn.primitive.name
  if name == "dot_general":
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs_shape = eqn.invars[0].aval.shape
    contracted = int(np.prod([lhs_shape[d] for d in lhs_contract], dtype=np.int64))
    return int(np.prod(eqn.outvars[0].aval.shape, dtype=np.int64)) * contracted
  if name == "conv_general_dilated":
    rhs_shape = eqn.invars[1].aval.shape
    out_features = rhs_shape[eqn.params["dimension_numbers"].rhs_spec[0]]
    per_output = int(np.prod(rhs_shape, dtype=np.int64)) // out_features
    # A dilated input (the input gradient of a strided convolution) is mostly inserted zeros:
    # only one window position in prod(lhs_dilation) meets a real input.
    dilation = int(np.prod(eqn.params.get("lhs_dilation") or (1,), dtype=np.int64))
    return int(np.prod(eqn.outvars[0].aval.shape, dtype=np.int64)) * per_output // dilation
  return 0


def _jaxpr_macs(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    total += _eqn_macs(eqn)
    for sub in jex_core.jaxprs_in_params(eqn.params):
      total += _jaxpr_macs(sub)
  return total


def count_macs(fn: Callable[..., Any], *args: Any) -> int:
  """MACs of one call of `fn(*args)` (args may be ShapeDtypeStructs)."""
  return _jaxpr_macs(jax.make_jaxpr(fn)(*args).jaxpr)


def macs_per_image(fn: Callable[..., Any], image_shape: tuple[int, ...], *args: Any) -> int:
  """Per-image MACs of `fn(*args, images)` for NHWC images of `image_shape` (without batch)."""
  one = count_macs(fn, *args, jax.ShapeDtypeStruct((1, *image_shape), np.float32))
  two = count_macs(fn, *args, jax.ShapeDtypeStruct((2, *image_shape), np.float32))
  return two - one


def count_params(tree: Any, mask: Any | None = None) -> int:
  """Number of entries in `tree`; with a 0/1 `mask` tree (broadcastable), only masked ones."""
  if mask is None:
    return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree.leaves(tree)))
  counts = jax.tree.map(lambda x, m: int(np.broadcast_to(np.asarray(m), x.shape).sum()), tree, mask)
  return int(sum(jax.tree.leaves(counts)))
