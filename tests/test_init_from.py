"""config.init_from: the ViT of a fresh run comes from a checkpoint, in every mode with a ViT."""

import functools

import jax
import numpy as np
import pytest

from tests.config_files import load_config
from vitboot_jax import init_from, kernel_sets, optim, sharding
from vitboot_jax.models.build import build_models
from vitboot_jax.state import create_state


def _config(arg):
  return load_config("tiny_config", arg)


def _fresh_state(config):
  models = build_models(config, kernel_sets.for_config(config))
  tx, _ = optim.mode_optimizer(config, models.names, steps_per_epoch=10)
  init = functools.partial(create_state, models, tx, image_shape=(32, 32, 3))
  state = jax.jit(init)(jax.random.key(0))
  shardings = jax.tree.map(lambda _: sharding.replicated(sharding.make_mesh()), state)
  return state, models, tx, shardings


def _flat(tree):
  return {
    "/".join(str(k.key) for k in path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


@pytest.mark.parametrize("mode", ["vit", "joint", "shared"])
@pytest.mark.slow
def test_initialise_replaces_only_the_vit(mode, tmp_path):
  config = _config(f"mode={mode}")
  state, models, tx, shardings = _fresh_state(config)
  source = {k: v + 1.0 for k, v in _flat(state.params["vit"]).items()}
  np.savez(tmp_path / "vit.npz", **{"params/vit/" + k: v for k, v in source.items()})
  config.init_from = str(tmp_path / "vit.npz")
  new = init_from.initialise(state, config, tx, shardings)
  got = _flat(new.params["vit"])
  assert got.keys() == source.keys()
  for key, value in source.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  jax.tree.map(np.testing.assert_array_equal, new.params.get("agent"), state.params.get("agent"))
  if mode == "shared":  # The agent reads the ViT's (imported) weights: its logits change.
    images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype(np.float32)
    agent_logits = jax.jit(
      lambda s: models.apply(
        {"params": s.params, "batch_stats": s.batch_stats}, images, train=False, names=("agent",)
      )[0]["agent"][0]
    )
    assert not np.allclose(agent_logits(state), agent_logits(new))


@pytest.mark.parametrize(
  "arg, init_from_value, message",
  [
    ("mode=agent", "x.npz", "mode 'agent' trains none"),
    ("mode=vit,init=mimetic", "x.npz", "config.model.init='mimetic' would be overwritten"),
  ],
)
@pytest.mark.slow
def test_initialise_refuses_what_it_cannot_do(arg, init_from_value, message):
  config = _config(arg)
  state, models, tx, shardings = _fresh_state(config)
  config.init_from = init_from_value
  with pytest.raises(ValueError, match=message):
    init_from.initialise(state, config, tx, shardings)


@pytest.mark.slow
def test_fine_tune_run_starts_from_a_pre_training_run(tmp_path, monkeypatch):
  """Pre-train, then a run with init_from=that workdir and lr 0: the ViT it trains and
  checkpoints is exactly the pre-trained one (train.py's hook; the modes are tested above)."""
  import tensorflow_datasets as tfds

  from vitboot_jax import checkpoint, train
  from vitboot_jax.data import prepare

  # tfds mock data swaps the filesystem process-wide: save synchronously (see test_train.py).
  monkeypatch.setattr(
    train.checkpoint, "Checkpointer", functools.partial(checkpoint.Checkpointer, async_save=False)
  )
  # mock_data's download_and_prepare is a no-op; the network probe before it would fail offline.
  monkeypatch.setattr(prepare, "_reachable", lambda host: True)
  pre = _config("data=cifar10,mode=vit")
  pre.total_steps = 2
  fine = _config("data=cifar10,mode=vit")
  fine.total_steps = 1
  fine.optim.lr = 0.0
  fine.init_from = str(tmp_path / "pre")
  with tfds.testing.mock_data(num_examples=32):
    train.train_and_evaluate(pre, str(tmp_path / "pre"))
    train.train_and_evaluate(fine, str(tmp_path / "fine"))
  want = _flat(init_from.read_orbax_vit(str(tmp_path / "pre")))
  got = _flat(init_from.read_orbax_vit(str(tmp_path / "fine" / "checkpoints")))
  assert got.keys() == want.keys()
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_orbax_reader_takes_a_workdir_its_checkpoints_or_one_step(tmp_path):
  from vitboot_jax import checkpoint

  vit = {"pos_embed": np.arange(6, dtype=np.float32).reshape(1, 3, 2)}
  with checkpoint.Checkpointer(tmp_path / "run", async_save=False) as ckpt:
    ckpt.save(2, {"params": {"vit": jax.tree.map(lambda x: x - 1, vit)}, "step": 2}, force=True)
    ckpt.save(5, {"params": {"vit": vit}, "step": 5}, force=True)
  with checkpoint.Checkpointer(tmp_path / "agent_run", async_save=False) as ckpt:
    ckpt.save(1, {"params": {"agent": vit}}, force=True)
  (tmp_path / "run" / "checkpoints" / "7").mkdir()  # A save cut short: no commit marker.
  for path in ("run", "run/checkpoints", "run/checkpoints/5"):
    got = init_from.read_orbax_vit(str(tmp_path / path))
    np.testing.assert_array_equal(got["pos_embed"], vit["pos_embed"])
  got = init_from.read_orbax_vit(str(tmp_path / "run/checkpoints/2"))
  np.testing.assert_array_equal(got["pos_embed"], vit["pos_embed"] - 1)
  with pytest.raises(ValueError, match="has no ViT .*mode agent or cnn"):
    init_from.read_vit_params(str(tmp_path / "agent_run"))
