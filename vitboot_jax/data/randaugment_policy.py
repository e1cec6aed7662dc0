"""RandAugment's policy string (timm's form, e.g. DeiT's "rand-m9-mstd0.5-inc1") as data.

Free of JAX, so configlib checks a policy before anything heavy loads; data/randaugment.py
applies it.
"""

from __future__ import annotations

import dataclasses
import math
import re

DEIT_POLICY = "rand-m9-mstd0.5-inc1"  # DeiT (Touvron et al. 2021), its main.py's --aa default.
LEVEL_DENOM = 10.0  # timm's _LEVEL_DENOM: magnitude 10 is an op's full strength.


@dataclasses.dataclass(frozen=True)
class Policy:
  """A RandAugment policy; the defaults are DeiT's `rand-m9-mstd0.5-inc1`."""

  num_ops: int = 2  # n
  magnitude: float = 9.0  # m
  magnitude_std: float = 0.5  # mstd: gaussian noise on m per application (> 100: uniform)
  magnitude_max: float = LEVEL_DENOM  # timm's default upper bound of a sampled magnitude
  increasing: bool = True  # inc1: the *Increasing variants of the ops
  prob: float = 0.5  # each chosen op is applied with this probability


_SPEC_FORM = (
  "expected 'rand' then '-'-separated m<float>, n<int>, mstd<float>, inc<0|1>, mmax<float>, "
  f"p<float>, e.g. {DEIT_POLICY!r}"
)
_SPEC_PART = re.compile(r"(mstd|mmax|inc|m|n|p)(.*)")  # Longest keys first: m is mstd's prefix.


def parse_policy(spec: str) -> Policy:
  """timm's RandAugment string, e.g. 'rand-m9-mstd0.5-inc1', with timm's defaults for what it omits
  (m 10, n 2, mstd 0, inc 0, mmax 10, p 0.5): so 'rand-m9' is not Policy(), whose defaults are
  DeiT's."""
  parts = spec.split("-")
  if parts[0] != "rand":
    raise ValueError(f"RandAugment policy {spec!r} does not start with 'rand'; {_SPEC_FORM}")
  values: dict[str, float | int | bool] = {}
  for part in parts[1:]:
    match = _SPEC_PART.fullmatch(part)
    if match is None:
      raise ValueError(f"RandAugment policy {spec!r}: unknown part {part!r}; {_SPEC_FORM}")
    key, text = match.groups()
    try:
      value = int(text) if key in ("n", "inc") else float(text)
    except ValueError:
      raise ValueError(
        f"RandAugment policy {spec!r}: bad number in {part!r}; {_SPEC_FORM}"
      ) from None
    bad = {
      "m": value < 0 or not math.isfinite(value),
      "n": value < 1,
      "mstd": value < 0 or math.isnan(value),
      "inc": value not in (0, 1),
      "mmax": value <= 0 or not math.isfinite(value),
      "p": not 0 <= value <= 1,
    }[key]
    if bad or key in values:
      why = "repeated" if key in values else "out of range"
      raise ValueError(f"RandAugment policy {spec!r}: {part!r} is {why}; {_SPEC_FORM}")
    values[key] = value
  return Policy(
    num_ops=int(values.get("n", 2)),
    magnitude=float(values.get("m", LEVEL_DENOM)),
    # timm samples uniformly on [0, m] for mstd > 100.
    magnitude_std=math.inf if values.get("mstd", 0.0) > 100 else float(values.get("mstd", 0.0)),
    magnitude_max=float(values.get("mmax", LEVEL_DENOM)),
    increasing=bool(values.get("inc", 0)),
    prob=float(values.get("p", 0.5)),
  )
