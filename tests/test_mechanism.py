"""The mechanism study's switches (configs/common.py): each off is the official recipe exactly, each
on changes only what it says; the ViT's CE and feature gradient shares are measured."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from tests.config_files import load_config
from tests.tiny_steps import batch_of, gradients, run, setup
from vitboot_jax import configlib, init_from, kernel_sets, optim, sharding
from vitboot_jax.base.errors import ConfigError
from vitboot_jax.checkpoint import checkpointer
from vitboot_jax.method import hint_variants, losses, steps
from vitboot_jax.models.build import build_models
from vitboot_jax.models.choices import hinted_layers
from vitboot_jax.state import create_state
from vitboot_jax.tools.sweep import report as sweep_report
from vitboot_jax.tools.sweep import runs as sweep_runs
from vitboot_jax.tools.sweep import tables as sweep_tables

# Each variant switch, an "on" value and the config fields it may change.
VARIANTS = {
  "form": ("paper", {"loss.feature_loss"}),
  "layers": ("2", {"loss.feature_layers"}),
  "projector": ("linear", {"loss.feature_projector"}),
  "balance": ("1", {"loss.feature_balance"}),
  "until": ("0.3", {"loss.feature_until"}),
  "gate": ("0.35", {"loss.feature_gate"}),
  "teacher": ("workdirs/agent", {"agent_init_from"}),
  "frozen": ("1", {"agent_frozen"}),
}
OFF = {
  "form": "official",
  "layers": "0",
  "projector": "none",
  "balance": "0",
  "until": "1",
  "gate": "0",
  "teacher": "",
  "frozen": "0",
}


def _leaves(config):
  out = {}

  def walk(node, prefix):
    for key, value in node.items():
      if isinstance(value, dict):
        walk(value, f"{prefix}{key}.")
      else:
        out[f"{prefix}{key}"] = value

  walk(config.to_dict(), "")
  return out


def test_every_variant_is_a_switch():
  assert set(VARIANTS) <= set(common.SWITCHES)


@pytest.mark.parametrize("name", ["quickstart", "cifar10_tokens16", "vits_cifar100"])
@pytest.mark.parametrize("mode", ["joint", "shared"])
def test_switches_off_are_the_official_recipe(name, mode):
  official = _leaves(load_config(name, f"mode={mode}"))
  explicit = ",".join(f"{k}={v}" for k, v in OFF.items())
  assert _leaves(load_config(name, f"mode={mode},{explicit}")) == official
  base = _leaves(configlib.base_config())
  for field in set().union(*(fields for _, fields in VARIANTS.values())):
    assert official[field] == base[field], field


@pytest.mark.parametrize("switch", sorted(VARIANTS))
def test_each_switch_changes_only_its_field(switch):
  value, fields = VARIANTS[switch]
  official = _leaves(load_config("quickstart", "mode=joint"))
  variant = _leaves(load_config("quickstart", f"mode=joint,{switch}={value}"))
  changed = {k for k in official if official[k] != variant[k]}
  assert changed == fields
  configlib.validate(load_config("quickstart", f"mode=joint,{switch}={value}"))


@pytest.mark.parametrize(
  "arg, message",
  [
    ("mode=joint,until=0", r"feature_until=0.0 must be in \(0, 1\]"),
    ("mode=joint,until=1.5", r"feature_until=1.5 must be in \(0, 1\]"),
    ("mode=joint,gate=1", r"feature_gate=1.0 must be in \[0, 1\)"),
    ("mode=joint,layers=7", r"feature_layers=7 must be an integer in \[0, 6\]"),
    ("mode=joint,projector=mlp", r"feature_projector='mlp' is unknown"),
    ("mode=joint,balance=-1", r"feature_balance=-1.0 must be >= 0"),
    ("mode=joint,form=cosine", r"feature_loss='cosine' is unknown"),
    ("mode=vit,until=0.5", r"mode 'vit' .* has no feature term"),
    ("mode=joint,feature=0,layers=2", r"feature_vit=0.0 has no feature term"),
    ("mode=vit,form=paper", r"mode 'vit' .* has no feature term"),
    ("mode=agent,form=corr", r"mode 'agent' .* has no feature term"),
    ("mode=joint,feature=0,form=corr", r"feature_vit=0.0 has no feature term"),
    ("mode=shared,feature=0,form=paper", r"feature_vit=0.0 has no feature term"),
    ("mode=shared,teacher=x", r"joint-mode variants"),
    ("mode=agent,frozen=1", r"joint-mode variants"),
  ],
)
def test_bad_values_fail_in_one_line(arg, message):
  with pytest.raises(ConfigError, match=message) as error:
    configlib.validate(load_config("quickstart", arg))
  assert "\n" not in str(error.value)


@pytest.mark.slow
def test_measuring_the_shares_leaves_the_step_unchanged():
  # Measured on every step (log_every_steps=1), on logged steps only (3) or not at all (the
  # default): the same states.
  every, h_every = run("joint", n=3, log_every_steps=1, log_hint_shares=True)
  rare, h_rare = run("joint", n=3, log_every_steps=3, log_hint_shares=True)
  off, h_off = run("joint", n=3, log_every_steps=1)
  jax.tree.map(np.testing.assert_array_equal, every.params, rare.params)
  jax.tree.map(np.testing.assert_array_equal, every.params, off.params)
  assert not any("train/hint_grad_ratio" in m for m in h_off)
  assert [m["train/hint_grad_ratio"] > 0 for m in h_every] == [True, True, True]
  assert [m["train/hint_grad_ratio"] > 0 for m in h_rare] == [False, False, True]
  assert h_rare[2]["train/hint_grad_ratio"] == h_every[2]["train/hint_grad_ratio"]


@pytest.mark.slow
def test_the_shares_are_the_gradients_of_each_term_alone():
  config, models, _, state, _ = setup("joint", log_hint_shares=True)
  variants = hint_variants.for_config(config, total_steps=4)
  measured = functools.partial(variants.vit_gradient, log_hint=True)
  batch = batch_of()
  _, _, terms = jax.jit(
    lambda v: steps.model_gradients(
      config, models, v, batch, jax.random.key(3), jnp.float32(0.5), measured
    )
  )({"params": state.params, "batch_stats": state.batch_stats})
  ce_only, *_ = setup("joint", **{"loss.kd_vit": 0.0, "loss.feature_vit": 0.0})
  grads, _ = gradients(ce_only, models, state, batch, 0.5)[:2]
  np.testing.assert_allclose(terms["grad_norm_ce_share_vit"], optax_norm(grads["vit"]), rtol=1e-5)
  feature_only, *_ = setup("joint", **{"loss.ce_vit": 0.0, "loss.kd_vit": 0.0})
  grads, _ = gradients(feature_only, models, state, batch, 0.5)[:2]
  np.testing.assert_allclose(
    terms["grad_norm_feature_share_vit"], optax_norm(grads["vit"]), rtol=1e-5
  )
  np.testing.assert_allclose(
    terms["hint_grad_ratio"],
    terms["grad_norm_feature_share_vit"] / terms["grad_norm_ce_share_vit"],
    rtol=1e-6,
  )


def test_the_shares_diagnostic_is_compiled_into_the_step_only_when_asked():
  # Off (the default), the step holds no conditional and no second pullback of the ViT.
  batch = batch_of()
  lowered = {}
  for on in (False, True):
    _, _, _, state, step = setup("joint", log_hint_shares=on)
    lowered[on] = jax.jit(step).lower(state, batch).as_text()
  assert "stablehlo.case" not in lowered[False] and "stablehlo.case" in lowered[True]
  dots = {on: text.count("stablehlo.dot_general") for on, text in lowered.items()}
  assert dots[True] > dots[False]


def optax_norm(tree):
  return float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree))))


def test_until_turns_the_hint_off_after_its_fraction():
  # 10 steps, until=0.3: on for steps 0-2.
  on = [float(hint_variants.hint_on(jnp.int32(t), 10, 0.3)) for t in range(10)]
  assert on == [1.0] * 3 + [0.0] * 7
  assert all(float(hint_variants.hint_on(jnp.int32(t), 10, 1.0)) == 1.0 for t in range(10))


def test_layers_keeps_the_last_pairs_and_projectors_map_the_vit_tokens():
  rng = np.random.default_rng(0)
  vits = [jnp.asarray(rng.normal(size=(2, 17, 8)), jnp.float32) for _ in range(3)]
  agents = [jnp.asarray(rng.normal(size=(2, 4, 4, 8)), jnp.float32) for _ in range(3)]
  total, per_layer = losses.feature_losses(vits, agents)
  last, last_per_layer = losses.feature_losses(vits, agents, last=2)
  assert list(last_per_layer) == [1, 2]
  assert float(last) == pytest.approx(float(per_layer[1] + per_layer[2]), rel=1e-6)
  identity = {f"layer_{i}": {"kernel": jnp.eye(8), "bias": jnp.zeros(8)} for i in hinted_layers(3)}
  same, _ = losses.feature_losses(vits, agents, projectors=identity)
  assert float(same) == pytest.approx(float(total), rel=1e-6)
  scaled = {k: {"kernel": 2 * v["kernel"], "bias": v["bias"] + 1} for k, v in identity.items()}
  moved, moved_per_layer = losses.feature_losses(vits, agents, projectors=scaled)
  want = losses.feature_loss(2 * vits[0] + 1, agents[0])
  assert float(moved_per_layer[0]) == pytest.approx(float(want), rel=1e-6)


@pytest.mark.slow
def test_projector_starts_at_the_identity_and_learns():
  official, h_official = run("joint", n=3, log_every_steps=3)
  variant, h_variant = run("joint", n=2, **{"loss.feature_projector": "linear"})
  assert h_variant[0]["train/loss_vit"] == pytest.approx(h_official[0]["train/loss_vit"], 1e-6)
  kernel = np.asarray(variant.params["hint_vit"]["layer_1"]["kernel"])
  assert kernel.shape == (36, 36) and not np.allclose(kernel, np.eye(36))
  assert set(variant.params) == set(official.params) | {"hint_vit"}


@pytest.mark.slow
def test_balance_caps_the_hint_share():
  _, variant = run("joint", n=2, **{"loss.feature_balance": 0.1})
  for m in variant:
    assert m["train/feature_balance_scale"] < 1
    capped = m["train/feature_balance_scale"] * m["train/grad_norm_feature_share_vit"]
    assert capped == pytest.approx(0.1 * m["train/grad_norm_ce_share_vit"], rel=1e-5)
  # The shares sum to the official gradient: a cap never reached gives its update (to rounding).
  config, models, _, state, _ = setup("joint")
  loose, *_ = setup("joint", **{"loss.feature_balance": 1e6})
  batch = batch_of()
  want, _ = gradients(config, models, state, batch)[:2]
  got, _ = gradients(loose, models, state, batch)[:2]
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7), got, want)


def test_gate_opens_once_the_running_top1_reaches_the_threshold_and_stays_open():
  gate = {k: jnp.zeros((), jnp.float32) for k in ("top1_ema", "steps", "open")}
  opened = []
  for top1 in (0.2, 0.5, 0.5, 0.0, 0.0):
    gate = hint_variants.update_gate(gate, jnp.float32(top1), 0.3)
    opened.append(float(gate["open"]))
  # Running (bias-corrected) means 0.2, 0.35..., then it stays open whatever the batches do.
  assert opened == [0.0, 1.0, 1.0, 1.0, 1.0]
  assert float(gate["top1_ema"]) > 0 and float(gate["steps"]) == 5


@pytest.mark.slow
def test_gate_keeps_the_hint_off_until_it_opens():
  state, history = run("joint", n=4, **{"loss.feature_gate": 1e-6})
  _, official = run("joint", n=3, log_every_steps=3)
  # Closed at the start; open from the step after the first whose running top-1 is above 0.
  is_open = 0.0
  for step, m in enumerate(history):
    want = official[min(step, 2)]["train/feature_weight"] * is_open
    assert m["train/feature_weight"] == want, step
    is_open = max(is_open, float(m["train/feature_gate_top1"] >= 1e-6))
  assert float(state.batch_stats[hint_variants.GATE]["open"]) == is_open
  config, models, tx, _, step = setup("joint", **{"loss.feature_gate": 0.5})
  bare = create_state(models, tx, jax.random.key(0), (32, 32, 3))  # No gate statistics.
  with pytest.raises(ValueError, match="no gate statistics"):
    jax.jit(step)(bare, batch_of())


@pytest.mark.slow
def test_frozen_agent_is_never_updated():
  config, models, _, start, _ = setup("joint")
  frozen, history = run("joint", n=2, agent_frozen=True, log_every_steps=1000)
  jax.tree.map(np.testing.assert_array_equal, frozen.params["agent"], start.params["agent"])
  assert all(m["train/grad_norm_agent"] == 0 for m in history)
  assert not np.array_equal(
    frozen.params["vit"]["head"]["kernel"], start.params["vit"]["head"]["kernel"]
  )


def test_a_frozen_agent_costs_no_backward():
  # Its chain never updates it, so the step leaves out its pullback: fewer convolutions.
  batch, convolutions = batch_of(), {}
  for frozen in (False, True):
    _, _, _, state, step = setup("joint", agent_frozen=frozen)
    text = jax.jit(step).lower(state, batch).as_text()
    convolutions[frozen] = text.count("stablehlo.convolution")
  assert convolutions[True] < convolutions[False]


@pytest.mark.slow
def test_teacher_starts_the_agent_from_a_run_of_ours(tmp_path, monkeypatch):
  # An agent-alone state saved as a run's checkpoint, read by a joint run.
  agent_cfg = load_config("tiny_config", "mode=agent")
  models = build_models(agent_cfg, kernel_sets.for_config(agent_cfg))
  tx, _ = optim.mode_optimizer(agent_cfg, models.names, steps_per_epoch=10)
  saved = jax.jit(functools.partial(create_state, models, tx, image_shape=(32, 32, 3)))(
    jax.random.key(7)
  )
  saved = saved.replace(
    batch_stats=jax.tree.map(lambda x: x + 0.5, saved.batch_stats), step=jnp.int32(3)
  )
  ckpt = checkpointer.Checkpointer(tmp_path / "agent_run", keep=1, save_every_steps=1)
  ckpt.save(3, saved, force=True)
  ckpt.close()

  config = load_config("tiny_config", "mode=joint")
  models = build_models(config, kernel_sets.for_config(config))
  tx, _ = optim.mode_optimizer(config, models.names, steps_per_epoch=10)
  state = jax.jit(functools.partial(create_state, models, tx, image_shape=(32, 32, 3)))(
    jax.random.key(0)
  )
  shardings = jax.tree.map(lambda _: sharding.replicated(sharding.make_mesh()), state)
  monkeypatch.chdir(tmp_path)  # A relative path is the cwd's.
  config.agent_init_from = "agent_run"
  new = init_from.initialise_agent(state, config, tx, shardings)
  jax.tree.map(np.testing.assert_array_equal, new.params["agent"], saved.params["agent"])
  jax.tree.map(np.testing.assert_array_equal, new.batch_stats["agent"], saved.batch_stats["agent"])
  jax.tree.map(np.testing.assert_array_equal, new.params["vit"], state.params["vit"])

  other = load_config("tiny_config", "mode=joint")
  other.model.embed_dim = 18
  models = build_models(other, kernel_sets.for_config(other))
  tx, _ = optim.mode_optimizer(other, models.names, steps_per_epoch=10)
  state = jax.jit(functools.partial(create_state, models, tx, image_shape=(32, 32, 3)))(
    jax.random.key(0)
  )
  other.agent_init_from = "agent_run"
  with pytest.raises(ValueError, match="agent_init_from=agent_run: the stored params"):
    init_from.initialise_agent(state, other, tx, shardings)


def test_mechanism_table_names_each_rows_explanation():
  table = sweep_tables.TABLES["mechanism"]
  assert table.epochs == 5 and table.seeds == (0, 1)
  explanations = {r.note.split(":")[0] for r in table.rows}
  assert explanations == {
    "reference",
    "1 teacher",
    "2 timing",
    "3 form",
    "3 strength",
    "4 geometry",
    "5 optimizer",
    "1 teacher + 2 timing",
    "1 teacher + 3 form",
  }
  names = [r.name for r in table.rows]
  # The teacher rows read the agent-alone run of their seed, so it trains before them.
  assert names.index("agent") < min(i for i, n in enumerate(names) if "teacher" in n)
  s = sweep_runs.settings(table, root="/runs", seeds=[1])
  row = next(r for r in table.rows if r.name == "joint_teacher_frozen")
  command = sweep_runs.command(table, s, row, 1)
  assert "--config.agent_init_from=/runs/agent_seed1" in command
  assert any(a.startswith("--config=configs/quickstart.py:mode=joint,frozen=1") for a in command)


def test_the_report_gives_the_hint_ratio_per_epoch(tmp_path):
  table = sweep_tables.TABLES["mechanism"]
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0])
  joint = next(r for r in table.rows if r.name == "joint")
  wd = tmp_path / "joint_seed0"
  wd.mkdir()
  records = [
    {"step": 20, "epoch": 0.5, "train/hint_grad_ratio": 6.0},
    {"step": 40, "epoch": 1.0, "train/hint_grad_ratio": 4.0},
    {"step": 40, "epoch": 1.0, "eval/top1_vit": 0.2},
    {"step": 60, "epoch": 1.5, "train/hint_grad_ratio": 1.0},
  ]
  (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (wd / "final.json").write_text(json.dumps({"epochs": 5, "top1_vit": 0.3, "top1_agent": 0.4}))
  assert sweep_report.epoch_means(wd, sweep_report.RATIO) == [5.0, 1.0]
  report = sweep_report.build_report(table, s)
  entry = next(r for r in report["rows"] if r["name"] == joint.name)
  assert entry["hint_grad_ratio"] == {0: [5.0, 1.0]}
  assert entry["hint_grad_ratio_applied"] == {}
  markdown = sweep_report.table_markdown(report)
  assert "| joint | 0 | 5 | 1 |" in markdown and "before the cap" not in markdown


def test_the_report_gives_a_capped_rows_hint_ratio_before_the_cap_and_applied(tmp_path):
  table = sweep_tables.TABLES["mechanism"]
  s = sweep_runs.settings(table, root=str(tmp_path), seeds=[0])
  wd = tmp_path / "joint_balance1_seed0"
  wd.mkdir()
  scale = "train/feature_balance_scale"
  records = [
    {"step": 20, "epoch": 0.5, "train/hint_grad_ratio": 8.0, scale: 0.125},
    {"step": 40, "epoch": 1.0, "train/hint_grad_ratio": 4.0, scale: 0.25},
    {"step": 60, "epoch": 1.5, "train/hint_grad_ratio": 0.5, scale: 1.0},
  ]
  (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (wd / "final.json").write_text(json.dumps({"epochs": 5, "top1_vit": 0.3, "top1_agent": 0.4}))
  report = sweep_report.build_report(table, s)
  entry = next(r for r in report["rows"] if r["name"] == "joint_balance1")
  assert entry["hint_grad_ratio"] == {0: [6.0, 0.5]}
  assert entry["hint_grad_ratio_applied"] == {0: [1.0, 0.5]}  # The cap of 1, where it bound.
  markdown = sweep_report.table_markdown(report)
  assert "| joint_balance1, before the cap | 0 | 6 | 0.5 |" in markdown
  assert "| joint_balance1, applied | 0 | 1 | 0.5 |" in markdown
