r"""What Adam's moments say about each model's step, at every checkpoint of a run.

  python -m vitboot_jax.tools.study.adam_state --workdir=workdirs/quickstart
  python -m vitboot_jax.tools.study.adam_state --workdir=RUN_A --workdir=RUN_B --steps=200

Adam divides each coordinate's first moment by the root of its second, a running mean of the
squared gradient with a memory of about 1 / (1 - b2) steps (1000 at the recipes' b2 = 0.999).
A loss term that was large for a while keeps a model's steps small for that long after it is
gone: the mechanism study (docs/results.md) reads it here. For each checkpoint and model, from
the bias-corrected moments m and v of the model's parameters (its loss parameters included):
  grad_rms      sqrt(mean v): the gradient scale Adam divides by;
  step_per_lr   mean |m| / (sqrt(v) + eps): the mean update of a parameter per unit learning rate
                (weight decay aside); step_per_lr_median its median;
  param_norm    the global norm of the model's parameters.
Gradients of pure zero-mean noise give step_per_lr = sqrt((1 - b1) / (1 + b1)) * sqrt(2 / pi), 0.18
at b1 = 0.9: above it successive gradients agree; below it they cancel (the parameters oscillate)
or rare large ones dominate v.
One line per checkpoint and model, then one JSON list of the same. Reads only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import app, flags
from etils import epath

from vitboot_jax.base import cli, errors, library_logs
from vitboot_jax.checkpoint import reader
from vitboot_jax.optim import owner
from vitboot_jax.run import workdir_rules

_ADAM_STATE_KEYS = frozenset({"count", "mu", "nu"})


def adam_states(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict]]:
  """Every Adam state {count, mu, nu} in an optimizer-state tree of dicts and lists, with its
  path."""
  if isinstance(tree, dict) and _ADAM_STATE_KEYS <= tree.keys():
    return [(path, tree)]
  items = (
    tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
  )
  return [found for key, sub in items for found in adam_states(sub, (*path, str(key)))]


def _arrays_only(tree: Any) -> Any:
  """`tree` with None for every leaf that is not an array (a masked chain stores the other chains'
  parameters as None), so that only arrays are read."""
  if isinstance(tree, dict):
    return {k: _arrays_only(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_arrays_only(v) for v in tree]
  return tree if hasattr(tree, "shape") else None


def _leaves(tree: Any) -> list[np.ndarray]:
  """Every array of a tree of dicts and lists as flat float64 (None, a masked leaf, has none)."""
  return [np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(tree)]


def moment_stats(mu: Any, nu: Any, count: int, b1: float, b2: float, eps: float) -> dict:
  """grad_rms and step_per_lr (mean, median) of one model's raw Adam moments at `count`."""
  m = np.concatenate(_leaves(mu)) / (1.0 - b1**count)
  v = np.concatenate(_leaves(nu)) / (1.0 - b2**count)
  step = np.abs(m) / (np.sqrt(v) + eps)
  return {
    "grad_rms": float(np.sqrt(v.mean())),
    "step_per_lr": float(step.mean()),
    "step_per_lr_median": float(np.median(step)),
    "params": int(m.size),
  }


def read_step(step_dir: epath.Path, b1: float, b2: float, eps: float) -> list[dict]:
  """The rows of one checkpoint step: one per model and Adam state."""
  stored = reader.stored_tree(step_dir)
  wanted = {part: _arrays_only(stored[part]) for part in ("opt_state", "params")}
  values = reader.read_on_host(step_dir, wanted)
  rows = []
  for path, state in adam_states(values["opt_state"]):
    # Under multi_transform (joint mode) each model's chain sits at inner_states/<model>.
    label = path[path.index("inner_states") + 1] if "inner_states" in path else None
    count = int(state["count"])
    models = {owner(k) for k in state["mu"] if _leaves(state["mu"][k])}
    for model in sorted(m for m in models if label in (None, m)):
      mu, nu = ({k: v for k, v in state[p].items() if owner(k) == model} for p in ("mu", "nu"))
      row = {"step": int(step_dir.name), "model": model, "count": count}
      row |= moment_stats(mu, nu, count, b1, b2, eps)
      params = [v for k, v in values["params"].items() if owner(k) == model]
      row["param_norm"] = float(np.sqrt(sum(np.sum(np.square(x)) for x in _leaves(params))))
      rows.append(row)
  return rows


def adam_checkpoints(
  workdir: str, steps: Sequence[int | str] | None = None
) -> tuple[epath.Path, Any, epath.Path, list[int]]:
  """(absolute workdir, its config, its checkpoint directory, the steps to read: `steps` or every
  complete one, oldest first) of a run trained with Adam; anything else is one UsageError line."""
  root, steps = reader.steps_to_read(workdir, steps)
  config = workdir_rules.read_config(root)
  if config.optim.name != "adamw":
    raise errors.UsageError(
      f"--workdir={workdir} trained with optim.name={config.optim.name!r}: this tool reads "
      "Adam's state"
    )
  return root, config, root / workdir_rules.CHECKPOINT_SUBDIR, steps


def read_workdir(workdir: str, steps: Sequence[int | str] | None = None) -> list[dict]:
  """The rows of every complete checkpoint of `workdir` (or of `steps`), oldest first."""
  _, config, directory, steps = adam_checkpoints(workdir, steps)
  o = config.optim
  rows = []
  for step in steps:
    for row in read_step(directory / str(step), o.b1, o.b2, o.eps):
      rows.append({"workdir": workdir, **row})
  return rows


_WORKDIRS = None
_STEPS = None


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  global _WORKDIRS, _STEPS
  _WORKDIRS = flags.DEFINE_multi_string("workdir", None, "A run's workdir (repeat to compare).")
  _STEPS = flags.DEFINE_list(
    "steps", None, "Checkpoint steps to read, numbers or last (the newest); default: every one."
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIRS.value:
    cli.fail("give --workdir=RUN (a training run's workdir)")
  library_logs.libraries()  # Reading a checkpoint logs orbax INFO lines.
  rows = []
  try:
    for workdir in _WORKDIRS.value:
      rows += read_workdir(workdir, _STEPS.value)
  except errors.UsageError as error:
    cli.fail(str(error))
  for r in rows:
    print(
      f"{r['workdir']}  step {r['step']:6d}  {r['model']:6s}  grad_rms {r['grad_rms']:.4g}  "
      f"step_per_lr {r['step_per_lr']:.4f} (median {r['step_per_lr_median']:.4f})  "
      f"param_norm {r['param_norm']:.2f}"
    )
  print(json.dumps(rows))


if __name__ == "__main__":
  define_flags()
  app.run(main)
