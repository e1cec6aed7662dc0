"""The config files and the schema: placeholders fail validate(), args are checked and typed."""

import pathlib

import pytest

from configs import common
from tests.config_files import load_config
from vitboot_jax import configlib

CONFIGS = sorted(p.stem for p in (pathlib.Path(__file__).parents[1] / "configs").glob("*.py"))


@pytest.mark.parametrize(
  "name", [n for n in CONFIGS if n not in ("common", "__init__")] + ["tiny_config"]
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
