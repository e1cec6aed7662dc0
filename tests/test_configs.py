"""The config files and the schema: placeholders fail validate(), args are checked and typed."""

import pathlib

import pytest

from configs import common
from tests.config_files import load_config
from vitboot_jax import configlib
from vitboot_jax.base.errors import ConfigError, unknown_choice

CONFIGS = sorted(p.stem for p in (pathlib.Path(__file__).parents[1] / "configs").glob("*.py"))


@pytest.mark.parametrize(
  # image_folder counts its classes from the data: tests/test_image_folder.py.
  "name",
  [n for n in CONFIGS if n not in ("common", "__init__", "image_folder")] + ["tiny_config"],
)
def test_every_config_file_sets_every_required_field(name):
  configlib.validate(load_config(name))


def test_base_config_placeholders_fail_naming_the_fields():
  c = configlib.base_config()
  c.mode = "vit"
  with pytest.raises(ValueError, match=r"config.image_size, .*config.model.mlp_dim not set"):
    configlib.validate(c)
  c = load_config("vits_cifar100")
  c.data.num_classes = 0
  with pytest.raises(ValueError, match=r"^config.data.num_classes not set"):
    configlib.validate(c)


def test_args_are_typed_and_unknown_args_fail():
  arg = common.parse_arg("mode=joint,epochs=3,sam=1", mode="shared", epochs=10, sam=0.0)
  assert (arg.mode, arg.epochs, arg.sam) == ("joint", 3, 1.0)
  with pytest.raises(ValueError, match=r"config arg 'mdoe' is unknown; this config takes"):
    load_config("vits_cifar100", "mdoe=joint")
  with pytest.raises(ValueError, match=r"mode='jiont' is unknown"):
    load_config("vits_cifar100", "mode=jiont")
  with pytest.raises(ValueError, match=r"agent='small' is unknown"):
    load_config("vitb_cifar10", "agent=small")


@pytest.mark.parametrize("field", sorted(configlib.CHOICES))
def test_every_choice_is_refused_by_validate_in_one_message(field):
  config = load_config("quickstart", "mode=joint")
  *blocks, key = field.split(".")
  parent = config
  for block in blocks:
    parent = parent[block]
  parent[key] = "bogus"
  with pytest.raises(ConfigError) as error:
    configlib.validate(config)
  assert str(error.value) == unknown_choice(f"config.{field}", "bogus", configlib.CHOICES[field])
  assert str(error.value).startswith(f"config.{field}='bogus' is unknown; choose one of '")


def test_every_choice_default_is_allowed_or_a_required_placeholder():
  defaults, required = configlib.base_config(), set(configlib.REQUIRED)
  required.update(*configlib.REQUIRED_BY_MODE.values())
  for field, allowed in configlib.CHOICES.items():
    value = defaults
    for key in field.split("."):
      value = value[key]
    assert value in allowed or (value == "" and field in required), field
