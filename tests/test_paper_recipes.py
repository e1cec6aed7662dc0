"""Every paper row of the table runner resolves to the recipe in tests/paper_recipes.py."""

import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_config(row_config: str):
  """get_config(arg) of a runner row's "configs/<file>.py:<args>"."""
  path, _, arg = row_config.partition(":")
  spec = importlib.util.spec_from_file_location("paper_row", REPO / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100", "imagenet"])
@pytest.mark.parametrize("size", ["vits", "vitb"])
def test_joint_agent_has_the_standalone_agent_dropout(size, dataset):
  """The official joint configs load cnn/agent-*.yaml: MLP dropout 0.1, no residual dropout."""
  joint = load_config(f"configs/{size}_{dataset}.py:mode=joint")
  agent = load_config(f"configs/{size}_{dataset}.py:mode=agent")
  got = (joint.agent.mlp_dropout, joint.agent.residual_dropout)
  assert got == (0.1, 0.0), f"{size} {dataset} joint agent (mlp, residual) dropout: {got}"
  assert (agent.agent.mlp_dropout, agent.agent.residual_dropout) == got
