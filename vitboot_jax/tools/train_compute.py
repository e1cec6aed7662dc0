r"""A run's training compute in FLOPs, from the train step it ran (its workdir's config.json).

  python -m vitboot_jax.tools.train_compute WORKDIR [WORKDIR ...]

2 x the matmul and convolution MACs of the traced train step (models/costs.count_macs, the xla
kernels, so the count does not depend on the machine) per image, times the images trained on
(final.json's step x the batch). The step holds forward and backward where a model trains and
the forward only where it is frozen (a finished teacher), the hint and the recipe's ops
included; elementwise work is not counted (a FLOP table's convention). Evaluations are not
training compute. One JSON line per workdir: {"workdir", "macs_per_image", "steps", "batch",
"train_flops"}.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import ml_collections
from etils import epath

from vitboot_jax.base import errors
from vitboot_jax.run import workdir_rules


@functools.cache
def _macs_per_image(config_json: str) -> int:
  import jax  # Only here: the sweep tables read finished runs without starting JAX otherwise.

  from vitboot_jax import configlib, sharding
  from vitboot_jax import trainer as trainer_lib
  from vitboot_jax.models import costs
  from vitboot_jax.tools.perf import benchmark

  config = ml_collections.ConfigDict(json.loads(config_json))
  config.data.pipeline = "tfdata"  # The step alone, whatever fed it.
  config.agent_init_from = config.init_from = ""  # Shapes only: no weights are read.
  configlib.validate(config)
  mesh = sharding.make_mesh()
  trainer = trainer_lib.build(config, mesh, benchmark._STEPS_PER_EPOCH)
  state = jax.eval_shape(trainer.fresh_state)
  batch = benchmark.synthetic_batch(config, config.batch_size, mesh)
  step = benchmark._xla_train_step(config, trainer)
  return costs.count_macs(step, state, batch) // config.batch_size


def run_compute(workdir: epath.PathLike) -> dict[str, Any] | None:
  """The training compute of a finished run (None without its config.json and final.json)."""
  workdir = epath.Path(workdir)
  try:
    final = json.loads((workdir / "final.json").read_text())
    config = workdir_rules.read_config(workdir).to_dict()  # Fields added since: their defaults.
  except (FileNotFoundError, json.JSONDecodeError, errors.WorkdirError):
    return None
  macs = _macs_per_image(json.dumps(config, sort_keys=True))
  steps, batch = int(final["step"]), int(config["batch_size"])
  return {
    "workdir": str(workdir),
    "macs_per_image": macs,
    "steps": steps,
    "batch": batch,
    "train_flops": 2 * macs * steps * batch,
  }


def main(argv: list[str]) -> int:
  if not argv:
    print(__doc__.splitlines()[2].strip(), file=sys.stderr)
    return 2
  for workdir in argv:
    row = run_compute(workdir)
    if row is None:
      print(f"{workdir}: no config.json and final.json (an unfinished run?)", file=sys.stderr)
      return 1
    print(json.dumps(row), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
