"""The "Can the agent help?" study's switches: DeiT's hard distillation from the agent
(distill=hard; off it is the official recipe exactly, on a distillation token whose head learns
the agent's argmax) and a frozen teacher predicting in evaluation mode (teacher_eval=1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.config_files import flat, load_config
from tests.tiny_steps import batch_of
from vitboot_jax import configlib, evaluate, kernel_sets, optim
from vitboot_jax.base.errors import ConfigError
from vitboot_jax.data import step_preprocess
from vitboot_jax.method import losses, steps
from vitboot_jax.models import pretrained
from vitboot_jax.models.build import build_models, build_vit
from vitboot_jax.state import create_state
from vitboot_jax.tools.sweep import runs as sweep_runs
from vitboot_jax.tools.sweep import tables as sweep_tables

HARD = "mode=joint,distill=hard,feature=0,kd=0,frozen=1"


def _setup(arg):
  config = load_config("tiny_config", arg)
  models = build_models(config, kernel_sets.for_config(config))
  tx, schedule = optim.mode_optimizer(config, models.names, steps_per_epoch=4)
  state = create_state(models, tx, jax.random.key(0), (32, 32, 3))
  step = steps.make_train_step(
    config, models, tx, schedule, 4, step_preprocess.make_prepare(config)
  )
  return config, models, state, step


def test_the_switch_sets_deits_token_and_weights_and_nothing_else():
  official = flat(load_config("quickstart", "mode=joint").to_dict())
  assert flat(load_config("quickstart", "mode=joint,distill=none").to_dict()) == official
  hard = flat(load_config("quickstart", "mode=joint,distill=hard").to_dict())
  changed = {k: hard[k] for k in official if official[k] != hard[k]}
  assert changed == {"model.distill_token": True, "loss.ce_vit": 0.5, "loss.distill_vit": 0.5}
  assert not official["model.distill_token"] and official["loss.distill_vit"] == 0.0


@pytest.mark.parametrize(
  "arg, updates, message",
  [
    ("mode=vit,distill=hard", {}, "needs the agent as its teacher .*mode 'vit'"),
    ("mode=shared,distill=hard", {}, "mode 'shared' has none"),
    ("mode=joint,distill=hard,init=mimetic", {}, "model.init='mimetic'"),
    ("mode=joint,distill=hard", {"init_from": "deit.npz"}, "config.init_from='deit.npz'"),
    ("mode=joint", {"model.distill_token": True}, "token and its loss go together"),
    ("mode=joint", {"loss.distill_vit": 0.5}, "token and its loss go together"),
  ],
)
def test_what_it_cannot_do_fails_in_one_line(arg, updates, message):
  config = load_config("quickstart", arg)
  for key, value in updates.items():
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  with pytest.raises(ConfigError, match=message) as error:
    configlib.validate(config)
  assert "\n" not in str(error.value)
  with pytest.raises(ValueError, match="distill='soft' is unknown"):
    load_config("quickstart", "mode=joint,distill=soft")


def _vit_and_params(distill):
  config = load_config("tiny_config", "mode=joint,distill=hard" if distill else "mode=joint")
  model = build_vit(config)
  images = jnp.asarray(np.random.default_rng(0).normal(size=(3, 32, 32, 3)), jnp.float32)
  return model, model.init(jax.random.key(0), images)["params"], images


def test_the_token_has_its_own_head_and_the_features_keep_the_plain_layout():
  plain_model, plain, images = _vit_and_params(False)
  model, params, _ = _vit_and_params(True)
  assert set(params) - set(plain) == {"dist", "head_dist"}
  assert params["pos_embed"].shape[1] == plain["pos_embed"].shape[1] + 1
  train_logits, out = model.apply({"params": params}, images, train=True)
  plain_logits, plain_out = plain_model.apply({"params": plain}, images, train=True)
  assert [f.shape for f in out["features"]] == [f.shape for f in plain_out["features"]]
  assert "dist_logits" not in plain_out and train_logits.shape == plain_logits.shape
  # Evaluation: the mean of the two heads (dropout is 0, so the train pass is the same network).
  eval_logits, eval_out = model.apply({"params": params}, images, train=False)
  np.testing.assert_allclose(eval_logits, (train_logits + out["dist_logits"]) / 2, rtol=1e-6)
  np.testing.assert_allclose(eval_out["cls_logits"], train_logits, rtol=1e-6)
  assert not np.allclose(out["dist_logits"], train_logits)  # Two heads, two predictions.


def test_the_loss_is_deits_half_ce_half_ce_on_the_agents_argmax():
  config, models, state, _ = _setup(HARD)
  batch = batch_of(n=16)
  variables = {"params": state.params, "batch_stats": state.batch_stats}
  outputs, _ = models.apply(variables, batch["image"], train=True, rng=jax.random.key(1))
  loss, terms = steps.model_loss(config, "vit", outputs, batch["label"], jnp.float32(1.0))
  logits, extras = outputs["vit"]
  teacher = np.argmax(np.asarray(outputs["agent"][0]), -1)
  logp = jax.nn.log_softmax(extras["dist_logits"])
  want = -np.mean(np.take_along_axis(np.asarray(logp), teacher[:, None], -1))
  np.testing.assert_allclose(terms["distill_vit"], want, rtol=1e-5)
  np.testing.assert_allclose(loss, 0.5 * terms["ce_vit"] + 0.5 * want, rtol=1e-5)
  assert "kd_vit" not in terms and "feature" not in terms
  # The class head learns the labels only, the distillation head the teacher only.
  grad = jax.grad(
    lambda own: steps.model_loss(
      config, "vit", {**outputs, "vit": own}, batch["label"], jnp.float32(1.0)
    )[0]
  )(outputs["vit"])
  no_labels = jax.grad(
    lambda own: steps.model_loss(
      config, "vit", {**outputs, "vit": own}, jnp.zeros_like(batch["label"]), jnp.float32(1.0)
    )[0]
  )(outputs["vit"])
  np.testing.assert_array_equal(grad[1]["dist_logits"], no_labels[1]["dist_logits"])
  assert not np.array_equal(grad[0], no_labels[0])


def test_training_steps_move_the_vit_and_leave_the_frozen_teacher():
  _, _, state, step = _setup(HARD)
  step = jax.jit(step)
  new, metrics = step(state, batch_of(n=16))
  jax.tree.map(np.testing.assert_array_equal, new.params["agent"], state.params["agent"])
  moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), new.params["vit"], state.params["vit"])
  assert moved["dist"] and moved["head_dist"]["kernel"] and moved["head"]["kernel"]
  assert np.isfinite(float(metrics["train/distill_vit"]))
  # Evaluation reports the two heads' mean and the class head alone.
  models = _setup(HARD)[1]
  sums = jax.jit(evaluate.make_eval_step(models))(
    new.params, new.batch_stats, {**batch_of(n=16), "mask": jnp.ones(16)}
  )
  assert set(sums) == {"count", "vit", "vit_cls", "agent"}
  assert 0.0 <= float(metrics["train/top1_dist_vit"]) <= 1.0


def test_a_distilled_vit_is_not_read_into_a_plain_one_by_mistake():
  _, plain, _ = _vit_and_params(False)
  _, distilled, _ = _vit_and_params(True)
  with pytest.raises(ValueError, match="has a distillation token"):
    pretrained.fit_vit_params(distilled, plain, log=print)


def test_the_helps_table_runs_deit_from_the_finished_agent():
  table = sweep_tables.TABLES["helps"]
  row = next(r for r in table.rows if r.name == "deit_hard")
  s = sweep_runs.settings(table, root="/runs", seeds=[1])
  command = sweep_runs.command(table, s, row, 1)
  assert "--config.agent_init_from=/runs/agent_seed1" in command
  config_arg = next(a for a in command if a.startswith("--config=")).split(":", 1)[1]
  config = load_config("quickstart", config_arg)
  configlib.validate(config)
  assert config.model.distill_token and config.agent_frozen
  assert config.loss.kd_vit == 0 and config.loss.feature_vit == 0


def test_a_frozen_teacher_in_evaluation_mode_predicts_as_at_inference():
  with pytest.raises(ConfigError, match="set config.agent_frozen"):
    configlib.validate(load_config("quickstart", "mode=joint,teacher_eval=1"))
  official = flat(load_config("quickstart", "mode=joint,frozen=1").to_dict())
  variant = flat(load_config("quickstart", "mode=joint,frozen=1,teacher_eval=1").to_dict())
  assert {k for k in official if official[k] != variant[k]} == {"agent_frozen_eval"}
  batch = batch_of(n=16)
  stats = {}
  for arg in ("mode=joint,frozen=1", "mode=joint,frozen=1,teacher_eval=1"):
    config, models, state, step = _setup(arg)
    new, metrics = jax.jit(step)(state, batch)
    stats[arg] = new.batch_stats["agent"], state.batch_stats["agent"]
    if "teacher_eval" in arg:  # Its KD target: the agent's inference logits.
      agent = models.apply(
        {"params": state.params, "batch_stats": state.batch_stats},
        _prepared(config, batch["image"]),
        train=False,
        names=("agent",),
      )[0]["agent"][0]
      vit = models.apply(
        {"params": state.params, "batch_stats": state.batch_stats},
        _prepared(config, batch["image"]),
        train=True,
        rng=jax.random.fold_in(jax.random.wrap_key_data(state.rng), 0),
        names=("vit",),
      )[0]["vit"][0]
      want = losses.kd(vit, agent, config.loss.temperature)
      np.testing.assert_allclose(metrics["train/kd_vit"], want, rtol=1e-5)
  moved, start = stats["mode=joint,frozen=1"]
  assert any(jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), moved, start)))
  kept, start = stats["mode=joint,frozen=1,teacher_eval=1"]
  jax.tree.map(np.testing.assert_array_equal, kept, start)


def _prepared(config, images):
  return step_preprocess.make_prepare(config)(images)
