r"""The curvature of a model's cross-entropy at a run's checkpoints, plain and as Adam sees it.

  python -m vitboot_jax.tools.study.hessian --workdir=workdirs/quickstart --steps=200,390
  python -m vitboot_jax.tools.study.hessian --workdir=RUN --model=agent --images=512 --iterations=40

For each checkpoint step: the largest and the smallest eigenvalue of the Hessian of the model's
mean cross-entropy over --images evaluation images drawn uniformly (seeded; evaluation
preprocessing, train=False), by Lanczos with full reorthogonalisation on Hessian-vector products
(forward over reverse mode, the plain XLA kernels); and the same for Adam's preconditioned Hessian
D^1/2 H D^1/2, where D = lr / (sqrt(v) + eps) comes from the step's own optimizer state (v
bias-corrected; lr of the update that reached the step, the train/lr logged there). Adam with
momentum b1 is stable along a direction while that curvature stays below (2 + 2 b1) / (1 - b1), 38
at b1 = 0.9 ("limit" in the output). The mechanism study (docs/results.md) asks with it why a
model's steps cancel. One line per step, then one JSON list. Reads only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from jax.flatten_util import ravel_pytree

from vitboot_jax import configlib, optim, sharding
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.base import cli, errors, files, library_logs
from vitboot_jax.checkpoint import checkpointer
from vitboot_jax.run import metrics
from vitboot_jax.tools import visualize
from vitboot_jax.tools.study import adam_state


def lanczos_extremes(
  matvec: Callable[[np.ndarray], np.ndarray], size: int, iterations: int, seed: int = 0
) -> tuple[float, float]:
  """(smallest, largest) eigenvalue of the symmetric operator `matvec` on R^size, from the
  tridiagonal matrix of `iterations` Lanczos steps (float64, fully reorthogonalised)."""
  rng = np.random.default_rng(seed)
  q = rng.standard_normal(size)
  basis = [q / np.linalg.norm(q)]
  alphas, betas = [], []
  for i in range(min(iterations, size)):
    w = np.asarray(matvec(basis[-1]), np.float64)
    alphas.append(float(w @ basis[-1]))
    for b in basis:  # Full reorthogonalisation: the few vectors are cheap next to a product.
      w -= (w @ b) * b
    beta = float(np.linalg.norm(w))
    if i + 1 == min(iterations, size) or beta < 1e-10 * max(1.0, abs(alphas[-1])):
      break
    betas.append(beta)
    basis.append(w / beta)
  tridiagonal = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
  eigenvalues = np.linalg.eigvalsh(tridiagonal)
  return float(eigenvalues[0]), float(eigenvalues[-1])


def _steps_per_epoch(root, workdir: str) -> int:
  """The run's steps per epoch, from its metrics.jsonl (each record has its step and epoch): the
  learning rate at a step depends on it, and the data need not be opened to know it."""
  for record in files.read_jsonl(root / metrics.METRICS_FILE):
    if record.get("epoch", 0) > 0 and record.get("step", 0) > 0:
      return round(record["step"] / record["epoch"])
  raise errors.UsageError(f"--workdir={workdir} has no {metrics.METRICS_FILE} with a logged step")


def _adam_nu(opt_state: Any, model: str) -> tuple[Any, int]:
  """The model's raw second moment (its own parameters only) and Adam's count."""
  chain = (
    opt_state.inner_states[model].inner_state if hasattr(opt_state, "inner_states") else opt_state
  )
  found = [
    s
    for s in jax.tree.leaves(chain, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
    if isinstance(s, optax.ScaleByAdamState)
  ]
  if not found:
    raise errors.UsageError(f"the optimizer state has no Adam state for {model!r}")
  return found[0].nu[model], int(found[0].count)


def curvature(
  workdir: str, steps: Sequence[int | str] | None, model: str, images: int, iterations: int
):
  """The rows of `workdir`'s checkpoints (every complete one, or `steps`)."""
  root, config, _, steps = adam_state.adam_checkpoints(workdir, steps)
  config = visualize.inspection_config(config)
  config.kernels = "xla"  # Forward-over-reverse needs plain ops (the CPU set's are custom VJPs).
  configlib.validate(config)
  per_epoch = _steps_per_epoch(root, workdir)
  trainer = trainer_lib.build(config, sharding.make_mesh(), steps_per_epoch=per_epoch)
  if model not in trainer.models.names:
    raise errors.UsageError(f"--model={model}: the run trains {list(trainer.models.names)}")
  x, y = (jnp.asarray(a) for a in visualize.sample_images(config, images))
  schedule = optim.lr_schedule(config.optim, per_epoch, config.num_epochs)
  rows = []
  with checkpointer.Checkpointer(root, keep=None, async_save=False, read_only=True) as ckpt:
    for step in steps:
      state = ckpt.restore(trainer.abstract_state, step)
      row = _extremes(
        trainer.models,
        state,
        model,
        x,
        y,
        float(schedule(max(step - 1, 0))),
        config.optim,
        iterations,
      )
      rows.append({"workdir": workdir, "step": int(step), **row, "images": images})
  return rows


def _extremes(models, state, model: str, x, y, lr: float, o, iterations: int) -> dict:
  """The extreme eigenvalues of one state's Hessian, plain and Adam-preconditioned."""
  flat, unravel = ravel_pytree(state.params[model])

  def loss(p):
    variables = {"params": {**state.params, model: p}, "batch_stats": state.batch_stats}
    logits = models.apply(variables, x, train=False, names=(model,))[0][model][0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def hvp(v):
    return ravel_pytree(jax.jvp(jax.grad(loss), (unravel(flat),), (unravel(v),))[1])[0]

  product = lambda v: np.asarray(hvp(jnp.asarray(v, flat.dtype)), np.float64)
  nu, count = _adam_nu(state.opt_state, model)
  v_hat = np.asarray(ravel_pytree(nu)[0], np.float64) / (1.0 - o.b2**count)
  d_half = np.sqrt(lr / (np.sqrt(v_hat) + o.eps))
  plain = lanczos_extremes(product, flat.size, iterations)
  adam = lanczos_extremes(lambda v: d_half * product(d_half * v), flat.size, iterations)
  return {
    "model": model,
    "lr": lr,
    "loss": float(loss(unravel(flat))),
    "hessian_min": plain[0],
    "hessian_max": plain[1],
    "adam_min": adam[0],
    "adam_max": adam[1],
    "limit": (2 + 2 * o.b1) / (1 - o.b1),
    "iterations": iterations,
  }


_WORKDIR = _STEPS = _MODEL = _IMAGES = _ITERATIONS = None


def define_flags() -> None:
  """Defines this tool's flags; called only when it runs as a program, so several tools can be
  imported into one process (tests) without their flag names colliding."""
  global _WORKDIR, _STEPS, _MODEL, _IMAGES, _ITERATIONS
  _WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir.")
  _STEPS = flags.DEFINE_list(
    "steps", None, "Checkpoint steps to read, numbers or last (the newest); default: every one."
  )
  _MODEL = flags.DEFINE_string("model", "vit", "Whose cross-entropy: vit or agent.")
  _IMAGES = flags.DEFINE_integer("images", 256, "How many evaluation images the loss averages.")
  _ITERATIONS = flags.DEFINE_integer("iterations", 30, "Lanczos steps (Hessian products) per end.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    cli.fail("give --workdir=RUN (a training run's workdir)")
  library_logs.libraries()  # Restoring a checkpoint logs orbax INFO lines.
  try:
    rows = curvature(_WORKDIR.value, _STEPS.value, _MODEL.value, _IMAGES.value, _ITERATIONS.value)
  except errors.UsageError as error:
    cli.fail(str(error))
  for r in rows:
    print(
      f"{r['workdir']}  step {r['step']:6d}  {r['model']}  loss {r['loss']:.3f}  "
      f"hessian [{r['hessian_min']:.3g}, {r['hessian_max']:.3g}]  "
      f"adam-preconditioned [{r['adam_min']:.3g}, {r['adam_max']:.3g}] (limit {r['limit']:.0f})"
    )
  print(json.dumps(rows))


if __name__ == "__main__":
  define_flags()
  app.run(main)
