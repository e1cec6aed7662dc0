"""`load_config`: the one loader of config files (configs/, and tests/tiny_config.py) in tests."""

import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
TEST_CONFIGS = REPO / "tests"


def config_path(name: str) -> pathlib.Path:
  """configs/<name>.py, or tests/<name>.py for the test-only config (tiny_config)."""
  for folder in (REPO / "configs", TEST_CONFIGS):
    if (folder / f"{name}.py").exists():
      return folder / f"{name}.py"
  raise FileNotFoundError(f"no config {name!r} in configs/ or tests/")


def load_config(spec: str, arg: str | None = None):
  """get_config(arg) of a config: a name ("tiny_config", "vits_cifar100") with `arg`, or a path
  relative to the repository root with its args ("configs/vits_cifar100.py:mode=joint")."""
  if spec.endswith(".py") or ".py:" in spec:
    path, _, spec_arg = spec.partition(":")
    path, arg = REPO / path, spec_arg or arg
  else:
    path = config_path(spec)
  module_spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg)


def apply_flags(config, flags):
  """--config.a.b=v flags onto `config`, typed as the field (what main's config flags do)."""
  for flag in flags:
    key, _, value = flag.removeprefix("--config.").partition("=")
    *groups, field = key.split(".")
    node = config
    for g in groups:
      node = node[g]
    old = node[field]
    if isinstance(old, bool):
      value = value == "True"
    elif old is not None:
      value = type(old)(value)
    node[field] = value
  return config


def flat(tree, prefix=""):
  """A nested dict (a config's to_dict()) as {"a.b.c": leaf}, to compare configs field by field."""
  out = {}
  for key, value in tree.items():
    out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
  return out
