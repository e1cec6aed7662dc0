"""Every paper row of the table runner resolves to the recipe in tests/paper_recipes.py."""

import pathlib

import pytest

from tests import config_files, paper_recipes
from vitboot_jax import configlib
from vitboot_jax.tools.sweep import tables as sweep_tables

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_config(row_config: str):
  """get_config(arg) of a runner row's "configs/<file>.py:<args>" (of REPO: tests may edit)."""
  return config_files.load_config(str(REPO / row_config))


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100", "imagenet"])
@pytest.mark.parametrize("size", ["vits", "vitb"])
def test_joint_agent_has_the_standalone_agent_dropout(size, dataset):
  """The official joint configs load cnn/agent-*.yaml: MLP dropout 0.1, no residual dropout."""
  joint = load_config(f"configs/{size}_{dataset}.py:mode=joint")
  agent = load_config(f"configs/{size}_{dataset}.py:mode=agent")
  got = (joint.agent.mlp_dropout, joint.agent.residual_dropout)
  assert got == (0.1, 0.0), f"{size} {dataset} joint agent (mlp, residual) dropout: {got}"
  assert (agent.agent.mlp_dropout, agent.agent.residual_dropout) == got


# ---------------------------------------------------------------------------------------------
# Every runner row against tests/paper_recipes.py.

MISSING = object()

# Fields a row of each mode must pin (the ones that change its result).
RUN_FIELDS = (
  "mode",
  "num_epochs",
  "total_steps",
  "batch_size",
  "image_size",
  "compute_dtype",
  "sam.rho",
  *("optim.name", "optim.lr", "optim.weight_decay", "optim.decay_all", "optim.momentum"),
  *("optim.schedule", "optim.warmup_epochs", "optim.clip_norm"),
  *("data.name", "data.num_classes", "data.train_split", "data.eval_split"),
  *("data.train_fraction", "data.augment", "data.normalisation", "data.cache"),
  *("data.shuffle_buffer", "normalisation.mean", "normalisation.std"),
)
ADAMW_FIELDS = ("optim.b1", "optim.b2", "optim.eps")
SHAPE_FIELDS = ("model.patch_size", "model.embed_dim", "model.depth", "model.num_heads")
SHAPE_FIELDS += ("model.mlp_dim",)
VIT_FIELDS = (*SHAPE_FIELDS, "model.dropout", "model.ln_eps", "model.init", "model.attention")
VIT_FIELDS += ("drloc.weight",)
AGENT_FIELDS = (*SHAPE_FIELDS, "agent.stem", "agent.stem_channels", "agent.pre_norm")
AGENT_FIELDS += ("agent.downsample_after", "agent.taps", "agent.mlp_dropout")
AGENT_FIELDS += ("agent.residual_dropout", "agent.bn_momentum", "agent.bn_eps", "agent.init")
MUTUAL_FIELDS = ("loss.ce_vit", "loss.ce_agent", "loss.kd_vit", "loss.kd_agent")
MUTUAL_FIELDS += ("loss.feature_vit", "loss.temperature", "loss.feature_loss", "loss.adapt")
MUTUAL_FIELDS += ("loss.feature_decay",)
REQUIRED = {
  "vit": (*RUN_FIELDS, *ADAMW_FIELDS, *VIT_FIELDS, "loss.ce_vit"),
  "agent": (*RUN_FIELDS, *ADAMW_FIELDS, *AGENT_FIELDS, "loss.ce_agent"),
  "joint": (*RUN_FIELDS, *ADAMW_FIELDS, *VIT_FIELDS, *AGENT_FIELDS, *MUTUAL_FIELDS),
  "shared": (*RUN_FIELDS, *ADAMW_FIELDS, *VIT_FIELDS, *AGENT_FIELDS, *MUTUAL_FIELDS, "align"),
  "cnn": (*RUN_FIELDS, "cnn.name", "loss.ce_cnn"),
}
REQUIRED["shared"] += ("align_granularity",)


def _flatten(tree, prefix=""):
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
  return out


def resolve(row_config: str) -> dict:
  """The row's config as flat fields, plus the normalisation it resolves to."""
  config = load_config(row_config)
  flat = _flatten(config.to_dict())
  mean, std = configlib.NORMALISATION[config.data.normalisation]
  return {**flat, "normalisation.mean": tuple(mean), "normalisation.std": tuple(std)}


def _same(got, want) -> bool:
  if isinstance(want, bool) or isinstance(got, bool):
    return type(got) is type(want) and got == want
  return got == want


def mismatches(expected: dict, resolved: dict) -> list[str]:
  """'field: expected X, got Y' for every pinned field the resolved config disagrees with."""
  out = []
  for field, want in expected.items():
    got = resolved.get(field, MISSING)
    if got is MISSING or not _same(got, want):
      got_text = "no such field" if got is MISSING else repr(got)
      out.append(f"{field}: expected {want!r}, got {got_text}")
  return out


def _runner_rows() -> dict[str, list[str]]:
  """Each config the table runner runs -> the rows that report it ("table: name (model)")."""
  by_config = {}
  for table in sweep_tables.PAPER_TABLES:
    for row in sweep_tables.rows(table):
      label = f"{table}: {row.name} ({', '.join(row.models)}, {row.note})"
      by_config.setdefault(row.config, []).append(label)
  return by_config


RUNNER_ROWS = _runner_rows()


def check_row(row_config: str) -> None:
  expected = paper_recipes.RECIPES[row_config]
  errors = mismatches(expected, resolve(row_config))
  rows = "; ".join(RUNNER_ROWS.get(row_config, []))
  if errors:
    raise AssertionError(f"{row_config} [{rows}]:\n  " + "\n  ".join(errors))


def test_the_table_holds_exactly_the_runner_rows():
  missing = sorted(set(RUNNER_ROWS) - set(paper_recipes.RECIPES))
  stale = sorted(set(paper_recipes.RECIPES) - set(RUNNER_ROWS))
  assert not missing, f"runner rows with no recipe in tests/paper_recipes.py: {missing}"
  assert not stale, f"recipes in tests/paper_recipes.py that no runner row runs: {stale}"


@pytest.mark.parametrize("row_config", sorted(paper_recipes.RECIPES))
def test_each_row_pins_every_field_of_its_mode(row_config):
  expected = paper_recipes.RECIPES[row_config]
  unpinned = [f for f in REQUIRED[expected["mode"]] if f not in expected]
  assert not unpinned, f"{row_config}: tests/paper_recipes.py pins no value for {unpinned}"


@pytest.mark.parametrize("row_config", sorted(RUNNER_ROWS))
def test_row_resolves_to_the_authors_recipe(row_config):
  check_row(row_config)


def _perturbed(value):
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value + 1
  if isinstance(value, tuple):
    return (*value, 99)
  return f"{value}_changed"


def test_changing_any_pinned_field_of_any_row_names_that_field():
  for row_config, expected in paper_recipes.RECIPES.items():
    resolved = resolve(row_config)
    for field in expected:
      changed = {**resolved, field: _perturbed(resolved[field])}
      errors = mismatches(expected, changed)
      assert [e.split(":")[0] for e in errors] == [field], (row_config, field, errors)


def test_a_recipe_change_fails_naming_row_and_field(monkeypatch, tmp_path):
  """A change where recipes are written (here: Agent-B becomes pre-norm) fails the row."""
  config = (REPO / "configs" / "vitb_cifar100.py").read_text()
  assert config.count("c.agent.pre_norm = False") == 1
  (tmp_path / "configs").mkdir()
  edited = config.replace("c.agent.pre_norm = False", "c.agent.pre_norm = True")
  (tmp_path / "configs" / "vitb_cifar100.py").write_text(edited)
  monkeypatch.setitem(globals(), "REPO", tmp_path)  # load_config reads the edited copy.
  with pytest.raises(AssertionError) as failure:
    check_row("configs/vitb_cifar100.py:mode=agent")
  message = str(failure.value)
  assert "configs/vitb_cifar100.py:mode=agent [cifar100: Agent-B (agent" in message
  assert "agent.pre_norm: expected False, got True" in message
  assert message.count("expected") == 1
