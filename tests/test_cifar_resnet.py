"""He et al.'s CIFAR ResNets: the paper's parameter counts, shapes, option-A shortcuts, the MACs of
a train step, and the paper's recipe as a config that trains under mode=cnn."""

import json
import math
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import runs
from tests.config_files import load_config
from tests.tiny_steps import batch_of
from vitboot_jax import configlib, kernel_sets, optim, sharding
from vitboot_jax.data import step_preprocess
from vitboot_jax.method import steps
from vitboot_jax.models import build, cifar_resnet, costs
from vitboot_jax.state import create_state

IMAGE = (32, 32, 3)


def abstract_variables(model):
  return jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, *IMAGE))))


@pytest.mark.parametrize(
  "name, expected, paper",
  [("resnet20", 269_722, 0.27e6), ("resnet32", 464_154, 0.46e6), ("resnet56", 853_018, 0.85e6)],
)
def test_parameter_counts_are_the_papers(name, expected, paper):
  params = abstract_variables(cifar_resnet.cifar_resnet(name, 10))["params"]
  assert costs.count_params(params) == expected
  assert round(expected / 1e4) * 1e4 == pytest.approx(paper)  # Table 6: 0.27M, 0.46M, 0.85M.
  # Option A: no shortcut has parameters (a projection would add a 1x1 conv and a BN).
  assert set(params["layer2_0"]) == {"conv1", "bn1", "conv2", "bn2"}


def test_shapes_at_32_px():
  model = cifar_resnet.cifar_resnet("resnet56", 100)
  logits, out = jax.eval_shape(
    lambda v: model.apply(v, jnp.zeros((2, *IMAGE)), train=False), abstract_variables(model)
  )
  assert logits.shape == (2, 100) and logits.dtype == jnp.float32
  assert [f.shape for f in out["features"]] == [(2, 32, 32, 16), (2, 16, 16, 32), (2, 8, 8, 64)]
  assert out["pre_logits"].shape == (2, 64)


def test_option_a_shortcut_subsamples_and_pads_with_zeros():
  block = cifar_resnet.BasicBlock(width=32, stride=2)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 8, 16)), jnp.float32)
  variables = block.init(jax.random.key(0), x, train=False)
  # With the residual branch silenced (BN scale 0), the block is relu(shortcut).
  silent = jax.tree_util.tree_map_with_path(
    lambda p, v: jnp.zeros_like(v) if p[-1].key == "scale" else v, variables
  )
  out = block.apply(silent, x, train=False)
  want = np.zeros((2, 4, 4, 32), np.float32)
  want[..., 8:24] = np.maximum(np.asarray(x)[:, ::2, ::2], 0)
  np.testing.assert_allclose(out, want, atol=1e-6)


def test_init_is_kaiming_normal_fan_out():
  model = cifar_resnet.cifar_resnet("resnet20", 10)
  params = jax.jit(lambda k: model.init(k, jnp.zeros((1, *IMAGE)))["params"])(jax.random.key(0))
  kernel = np.asarray(params["layer3_1"]["conv2"]["kernel"])  # 3x3, 64 -> 64.
  assert abs(kernel.std() / math.sqrt(2 / (9 * 64)) - 1) < 0.03
  assert np.all(np.asarray(params["layer3_1"]["bn2"]["scale"]) == 1)


def test_forward_and_train_step_macs():
  model = cifar_resnet.cifar_resnet("resnet20", 10)
  forward = costs.macs_per_image(lambda v, x: model.apply(v, x), IMAGE, abstract_variables(model))
  assert forward == 40_551_040  # The usual 41M of ResNet-20 at 32 px.
  from vitboot_jax.tools.perf import benchmark

  config = load_config("cifar_resnet", "model=resnet20")
  step = benchmark.step_macs_per_image(config, sharding.make_mesh())
  # Forward, the weights' and the inputs' gradients (the first conv's input gradient is skipped).
  assert 2.8 * forward < step <= 3 * forward


def test_the_config_is_the_papers_recipe_and_validates():
  config = load_config("cifar_resnet", "model=resnet56")
  configlib.validate(config)
  assert (config.mode, config.cnn.name, config.image_size, config.batch_size) == (
    "cnn",
    "resnet56",
    32,
    128,
  )
  assert config.data.train_fraction == 0.1 and config.data.augment == "cifar"
  o = config.optim
  assert (o.name, o.lr, o.momentum, o.weight_decay, o.schedule) == (
    "sgd",
    0.1,
    0.9,
    1e-4,
    "multistep",
  )
  assert tuple(o.milestones) == (0.5, 0.75) and o.gamma == 0.1
  configlib.validate(load_config("tiny_cifar_resnet"))
  with pytest.raises(ValueError, match="model='resnet50' is unknown"):
    load_config("cifar_resnet", "model=resnet50")


def test_one_train_step_under_mode_cnn():
  config = load_config("tiny_cifar_resnet")
  models = build.build_models(config, kernel_sets.for_config(config))
  assert models.names == ("cnn",) and isinstance(models.modules["cnn"], cifar_resnet.CifarResNet)
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=4)
  step = steps.make_train_step(
    config, models, tx, schedule, 4, step_preprocess.make_prepare(config)
  )
  state = jax.jit(lambda r: create_state(models, tx, r, IMAGE))(jax.random.key(0))
  new, metrics = jax.jit(step)(state, batch_of(n=16))
  assert np.isfinite(float(metrics["train/ce_cnn"]))
  assert float(metrics["train/lr"]) == pytest.approx(0.1)
  moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), new.params, state.params)
  assert all(jax.tree.leaves(moved))
  stats = jax.tree.map(lambda a, b: bool(np.any(a != b)), new.batch_stats, state.batch_stats)
  assert all(jax.tree.leaves(stats))


@pytest.mark.slow
def test_trains_end_to_end_on_the_image_folder(tmp_path, image_folder):
  from vitboot_jax import train

  config = load_config("tiny_cifar_resnet")
  config.data.dir = str(image_folder)
  config.total_steps = 3
  final = train.train_and_evaluate(config, str(tmp_path / "resnet20"))
  assert final["step"] == 3 and final["mode"] == "cnn" and 0.0 <= final["top1_cnn"] <= 1.0


@pytest.mark.slow
def test_stopped_by_sigterm_it_resumes_to_the_uninterrupted_result(tmp_path, image_folder):
  """A CNN run keeps state a ViT's does not (BN running statistics, SGD momentum, a step-wise
  learning rate): stopped by SIGTERM mid-epoch (the teacher stage of tools.teach) and run again,
  it ends where the same run ends uninterrupted, every step's loss the same."""
  config = str(runs.REPO / "tests" / "tiny_cifar_resnet.py")
  epochs = "--config.num_epochs=2"  # 20 steps, checkpoints every 4.
  reference, workdir = tmp_path / "reference", tmp_path / "stopped"
  runs.run(reference, image_folder, epochs, config=config)
  watched = runs.WatchedRun(
    workdir, image_folder, runs.after_step(7), signal.SIGTERM, (epochs,), config=config
  )
  assert watched.wait() == 128 + signal.SIGTERM, "".join(watched.log)[-3000:]
  stopped = [line for line in watched.log if "Stopped by SIGTERM after step" in line]
  step = int(stopped[0].split("after step ")[1].split(":")[0])
  assert 7 <= step < 20 and not (workdir / "final.json").exists()
  proc = runs.run(workdir, image_folder, epochs, config=config)
  assert f"Resuming from the checkpoint of step {step}" in proc.stderr
  want, got = (json.loads((d / "final.json").read_text()) for d in (reference, workdir))
  assert got["resumed_from_step"] == step and got["step"] == want["step"] == 20
  for key in ("top1_cnn", "top5_cnn", "ce_cnn", "count"):
    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
  losses = [
    {r["step"]: r["train/loss_cnn"] for r in runs.metrics(d) if "train/loss_cnn" in r}
    for d in (reference, workdir)
  ]
  assert list(losses[1]) == list(range(1, 21))  # Every step once, in order.
  assert losses[1] == pytest.approx(losses[0], rel=1e-5)
