"""tools/study/adam_state: each model's Adam moments read from a run's checkpoints, as the optimizer
holds them."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import tiny_steps
from vitboot_jax import optim
from vitboot_jax.base import errors
from vitboot_jax.checkpoint import checkpointer, reader
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools.study import adam_state


def test_one_adam_step_moves_each_parameter_by_one_learning_rate():
  # After one step from zero moments, bias correction gives m = g and v = g^2.
  g = {"vit": {"w": jnp.asarray([[-3.0, 0.5], [2.0, 1e-3]])}}
  _, state = optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8).update(
    g, optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8).init(g)
  )
  stats = adam_state.moment_stats(state.mu, state.nu, int(state.count), 0.9, 0.999, 1e-8)
  np.testing.assert_allclose(stats["grad_rms"], np.sqrt(np.mean(np.square(g["vit"]["w"]))), 1e-6)
  np.testing.assert_allclose(stats["step_per_lr"], 1.0, atol=1e-5)
  assert stats["params"] == 4


def test_pure_noise_gradients_step_at_the_documented_floor():
  # The docstring's reference value: an EMA of i.i.d. normal gradients over their RMS.
  tx = optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8)
  keys = jax.random.split(jax.random.key(0), 3000)

  def step(state, key):
    _, state = tx.update({"w": jax.random.normal(key, (4000,))}, state)
    return state, None

  state, _ = jax.lax.scan(step, tx.init({"w": jnp.zeros(4000)}), keys)
  stats = adam_state.moment_stats(state.mu, state.nu, int(state.count), 0.9, 0.999, 1e-8)
  np.testing.assert_allclose(stats["step_per_lr"], np.sqrt(0.1 / 1.9 * 2 / np.pi), rtol=0.05)
  np.testing.assert_allclose(stats["grad_rms"], 1.0, rtol=0.05)


def _expected(state, model):
  """The model's raw moments straight from the live optimizer state."""
  chain = state.opt_state.inner_states[model].inner_state
  adam = [
    s
    for s in jax.tree.leaves(chain, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
    if isinstance(s, optax.ScaleByAdamState)
  ][0]
  mine = lambda tree: {k: v for k, v in tree.items() if optim.owner(k) == model}
  return mine(adam.mu), mine(adam.nu), int(adam.count)


@pytest.mark.slow
def test_reads_each_models_moments_from_a_runs_checkpoints(tmp_path, monkeypatch):
  state, _ = tiny_steps.run("joint", n=2, log_every_steps=1000)
  run = tmp_path / "run"
  ckpt = checkpointer.Checkpointer(run, keep=2, save_every_steps=1)
  ckpt.save(2, state, force=True)
  ckpt.close()
  (run / workdir_rules.CONFIG_FILE).write_text(
    json.dumps({"optim": {"name": "adamw", "b1": 0.9, "b2": 0.999, "eps": 1e-8}})
  )
  monkeypatch.chdir(tmp_path)  # A relative workdir, as users type it.
  rows = adam_state.read_workdir("run")
  assert [(r["step"], r["model"], r["count"]) for r in rows] == [(2, "agent", 2), (2, "vit", 2)]
  for row in rows:
    expected = adam_state.moment_stats(*_expected(state, row["model"]), 0.9, 0.999, 1e-8)
    for key, value in expected.items():
      np.testing.assert_allclose(row[key], value, rtol=1e-6, err_msg=f"{row['model']} {key}")
  for row in rows:
    mine = [v for k, v in state.params.items() if optim.owner(k) == row["model"]]
    norm = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(mine)))
    np.testing.assert_allclose(row["param_norm"], norm, rtol=1e-6)
  assert rows[1]["params"] == sum(x.size for x in jax.tree.leaves(state.params["vit"]))
  # The library's readers take a relative step directory too (not reported as damage).
  assert "opt_state" in reader.stored_tree("run/checkpoints/2")

  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / workdir_rules.CONFIG_FILE).write_text(
    (run / workdir_rules.CONFIG_FILE).read_text()
  )
  with pytest.raises(errors.UsageError, match="has no complete checkpoint"):
    adam_state.read_workdir("empty")
  with pytest.raises(errors.UsageError, match=r"no checkpoint of step\(s\) \[5\]"):
    adam_state.read_workdir("run", steps=[5])
  (run / workdir_rules.CONFIG_FILE).write_text(json.dumps({"optim": {"name": "sgd"}}))
  with pytest.raises(errors.UsageError, match="this tool reads Adam's state"):
    adam_state.read_workdir("run")
