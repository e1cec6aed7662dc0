"""Walking jaxprs: every equation a function runs, inside nested jaxprs (jit, custom
derivative rules, loops) too."""

from collections.abc import Iterator

import jax.extend.core


def equations(jaxpr) -> Iterator:
  """Every equation of `jaxpr` (a Jaxpr or ClosedJaxpr) and of the jaxprs in its params."""
  for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from equations(sub)
