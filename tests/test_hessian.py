"""tools/study/hessian: the extreme eigenvalues of a model's loss Hessian at a run's
checkpoints, plain and preconditioned as Adam steps."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from vitboot_jax.base import errors
from vitboot_jax.checkpoint import checkpointer, step_dirs
from vitboot_jax.tools.study import hessian


def test_lanczos_finds_both_ends_of_a_known_spectrum():
  rng = np.random.default_rng(1)
  spectrum = np.concatenate([[-5.0], np.linspace(-2.0, 8.0, 298), [12.0]])
  basis, _ = np.linalg.qr(rng.standard_normal((300, 300)))
  matrix = basis @ np.diag(spectrum) @ basis.T
  low, high = hessian.lanczos_extremes(lambda v: matrix @ v, 300, iterations=40)
  np.testing.assert_allclose([low, high], [-5.0, 12.0], rtol=1e-6)
  # A small operator is solved exactly once the iterations reach its size.
  small = np.diag([3.0, -1.0, 0.5])
  assert hessian.lanczos_extremes(lambda v: small @ v, 3, iterations=10) == pytest.approx((-1, 3))


@pytest.mark.slow
def test_a_runs_checkpoint_gives_bounds_the_loss_surface_respects(uninterrupted):
  last = step_dirs.complete_steps(uninterrupted / "checkpoints")[-1]
  (row,) = hessian.curvature(str(uninterrupted), [last], "vit", images=40, iterations=12)
  assert row["step"] == last and row["model"] == "vit" and row["limit"] == pytest.approx(38.0)
  logged = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
  lr = next(r["train/lr"] for r in logged if r.get("step") == last and "train/lr" in r)
  np.testing.assert_allclose(row["lr"], lr, rtol=1e-6)  # The run's own schedule at that step.
  assert row["hessian_min"] <= row["hessian_max"] and row["adam_min"] <= row["adam_max"]

  # Curvatures along random directions, from finite differences of the gradient (independent of
  # the tool's forward-over-reverse products), lie inside the Lanczos bounds.
  from vitboot_jax import sharding
  from vitboot_jax import trainer as trainer_lib
  from vitboot_jax.run import workdir_rules
  from vitboot_jax.tools import visualize

  config = visualize.inspection_config(workdir_rules.read_config(uninterrupted))
  config.kernels = "xla"
  config.data.cache = False
  trainer = trainer_lib.build(config, sharding.make_mesh(), steps_per_epoch=10)
  with checkpointer.Checkpointer(uninterrupted, keep=None, async_save=False, read_only=True) as c:
    state = c.restore(trainer.abstract_state, last)
  x, y = visualize.sample_images(config, 40)
  flat, unravel = ravel_pytree(state.params["vit"])

  def loss(p):
    variables = {"params": {**state.params, "vit": unravel(p)}, "batch_stats": state.batch_stats}
    logits = trainer.models.apply(variables, x, train=False, names=("vit",))[0]["vit"][0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  grad = jax.jit(jax.grad(lambda p: loss(p).astype(jnp.float32)))
  rng = np.random.default_rng(0)
  for _ in range(3):
    v = rng.standard_normal(flat.size).astype(np.float32)
    v /= np.linalg.norm(v)
    eps = 1e-2
    hv = (np.asarray(grad(flat + eps * v)) - np.asarray(grad(flat - eps * v))) / (2 * eps)
    curvature = float(v @ hv)
    slack = 1e-3 * max(abs(row["hessian_min"]), abs(row["hessian_max"]))
    assert row["hessian_min"] - slack <= curvature <= row["hessian_max"] + slack

  with pytest.raises(errors.UsageError, match="--model=cnn"):
    hessian.curvature(str(uninterrupted), [last], "cnn", images=4, iterations=2)


def test_steps_per_epoch_reads_past_a_torn_last_line(tmp_path, caplog):
  (tmp_path / "metrics.jsonl").write_text('{"step": 4, "epoch": 0.4}\n{"step": 8, "ep')
  with caplog.at_level("WARNING"):
    assert hessian._steps_per_epoch(tmp_path, str(tmp_path)) == 10
  assert "unfinished last line" in caplog.text
  (tmp_path / "metrics.jsonl").write_text('{"step": 8, "ep')
  with pytest.raises(errors.UsageError, match="has no metrics.jsonl with a logged step"):
    hessian._steps_per_epoch(tmp_path, str(tmp_path))
