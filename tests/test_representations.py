"""tools/study/representations: how diverse a run's ViT tokens are, layer by layer."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import keystr, tree_flatten_with_path

from tests import runs, without_tensorflow
from vitboot_jax.base import errors
from vitboot_jax.checkpoint import step_dirs
from vitboot_jax.method import losses
from vitboot_jax.tools.study import representations


def test_effective_rank_counts_the_directions_the_rows_spread_in():
  rng = np.random.default_rng(0)
  assert representations.effective_rank(rng.standard_normal((20000, 8))) == pytest.approx(8, 0.02)
  line = np.outer(rng.standard_normal(500), rng.standard_normal(8)) + 3.0
  assert representations.effective_rank(line) == pytest.approx(1.0)
  assert representations.effective_rank(np.ones((5, 8))) == 0.0
  scaled = rng.standard_normal((20000, 2)) * [1.0, 0.5]  # Eigenvalues 1 and 1/4: 1.25^2 / 1.0625.
  assert representations.effective_rank(scaled) == pytest.approx(1.25**2 / 1.0625, rel=0.03)


def test_token_measures_tell_alike_positions_from_independent_ones():
  rng = np.random.default_rng(1)
  per_image = rng.standard_normal((64, 1, 16))
  alike = representations.token_stats(np.repeat(per_image, 10, axis=1))
  assert alike["token_cosine"] == pytest.approx(1.0)
  assert alike["token_spread"] == pytest.approx(0.0, abs=1e-12)
  independent = representations.token_stats(rng.standard_normal((64, 10, 16)))
  assert abs(independent["token_cosine"]) < 0.02
  assert independent["token_spread"] == pytest.approx(0.9, abs=0.03)  # (N - 1) / N of it.
  assert independent["token_rank"] == pytest.approx(16, rel=0.1)


def test_attention_entropy_runs_from_zero_to_uniform():
  features = np.random.default_rng(2).standard_normal((4, 5, 8))
  uniform = representations.layer_stats(features, np.full((4, 3, 5, 5), 0.2))
  assert uniform["entropy"] == pytest.approx(np.log(5)) == uniform["entropy_uniform"]
  one_hot = representations.layer_stats(features, np.broadcast_to(np.eye(5), (4, 3, 5, 5)))
  assert one_hot["entropy"] == pytest.approx(0.0, abs=1e-9)
  assert one_hot["cls_rank"] > 1.0  # Four class tokens of random features spread.


@pytest.mark.parametrize("adapt", ["seq1d", "pool2d"])
def test_feature_loss_floor_is_the_best_token_shared_by_an_image(adapt):
  rng = np.random.default_rng(4)
  agent = jnp.asarray(rng.standard_normal((3, 8, 8, 12)) + rng.standard_normal((3, 1, 1, 12)))
  floor = representations.feature_loss_floor(agent, 16, adapt=adapt)
  # The floor's token: the LayerNorm of the image's mean LayerNorm'd target, at every position.
  pooled = losses.adapt_tokens(jnp.zeros((3, 16, 12)), agent.reshape(3, 64, 12), (8, 8), adapt)[1]
  best = losses.layer_norm(losses.layer_norm(pooled, 1e-5).mean(1, keepdims=True), 1e-5)
  shared = lambda token: jnp.concatenate([jnp.zeros((3, 1, 12)), jnp.repeat(token, 16, 1)], 1)
  np.testing.assert_allclose(
    losses.feature_loss(shared(best), agent, adapt=adapt), floor, rtol=1e-5
  )
  for _ in range(5):  # Any other shared token does worse.
    other = best + 0.3 * jnp.asarray(rng.standard_normal((3, 1, 12)))
    assert losses.feature_loss(shared(other), agent, adapt=adapt) > floor
  assert 0.0 < float(floor) < 2.0
  constant = jnp.broadcast_to(agent[:, :1, :1], agent.shape)  # Nothing varies between positions.
  assert float(representations.feature_loss_floor(constant, 16, adapt=adapt)) < 1e-6


@pytest.mark.slow
def test_a_runs_checkpoints_give_a_row_per_step_for_every_block(uninterrupted, tmp_path):
  steps = step_dirs.complete_steps(uninterrupted / "checkpoints")
  rows = representations.read_workdir(str(uninterrupted), None, images=40)
  assert [r["step"] for r in rows] == steps
  for row in rows:
    assert len(row["layers"]) == 2 and len(row["agent_layers"]) == 2  # Tiny: 2 blocks, shared.
    assert 0.0 <= row["top1"] <= 1.0
    for layer in row["layers"]:
      assert 0.0 < layer["token_rank"] <= 36 and 0.0 <= layer["token_spread"] <= 1.0
      assert 0.0 < layer["entropy"] <= layer["entropy_uniform"] + 1e-9
    assert len(row["hint"]) == 2 and all(0.0 <= h["floor"] <= 2.0 for h in row["hint"])
  again = representations.read_workdir(str(uninterrupted), steps[-1:], images=40)
  assert again[0] == rows[-1]  # The same seeded sample, the same checkpoint.
  with pytest.raises(errors.UsageError, match="no complete checkpoint"):
    representations.read_workdir(str(tmp_path), None, images=40)


def test_the_tools_that_read_a_run_import_without_tensorflow():
  # An accelerator host has jax but no TensorFlow: the rung's representations step ran there.
  code = (
    "from vitboot_jax.tools.study import hessian, representations\n"
    "print('tensorflow' in sys.modules)\n"
  )
  proc = without_tensorflow.run(code, env=runs.env(1), timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["False"]


@pytest.mark.slow
def test_a_device_pipeline_run_is_read_without_tensorflow_and_alike(uninterrupted, tmp_path):
  # The same run as if trained with the dataset on the devices: its test images are read as its
  # training read them (no TensorFlow), and they are the images tf.data gives.
  run = tmp_path / "device_run"
  shutil.copytree(uninterrupted, run)
  config = json.loads((run / "config.json").read_text())
  assert config["data"]["pipeline"] == "tfdata"
  config["data"]["pipeline"] = "device"
  (run / "config.json").write_text(json.dumps(config))
  args = [f"--workdir={run}", "--steps=last", "--images=40"]
  proc = without_tensorflow.run_module(
    "vitboot_jax.tools.study.representations", args, env=runs.env(8), timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  (row,) = json.loads(proc.stdout.splitlines()[-1])
  (want,) = representations.read_workdir(str(uninterrupted), ["last"], images=40)
  assert row.pop("workdir") == str(run) and want.pop("workdir") == str(uninterrupted)
  got, expected = ({keystr(k): v for k, v in tree_flatten_with_path(r)[0]} for r in (row, want))
  assert got.keys() == expected.keys() and got == pytest.approx(expected, rel=1e-5, abs=1e-6)
