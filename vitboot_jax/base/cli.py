"""Command-line checks of `main` that run before TensorFlow and JAX are imported.

A user's mistake (no such config file, a misspelled field, a bad value, a missing flag) is one
line on stderr and exit code 2, within a second; `--help` exits 0 and lists the configs, their
`:ARGS` and how to print every field of one.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import pathlib
import re
import sys
from typing import NoReturn

import ml_collections
from absl import flags

PROG = "python -m vitboot_jax.main"
CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"
USAGE_EXIT_CODE = 2
_HELP_FLAGS = ("-h", "-?", "--help", "-help", "--helpshort", "--helpfull", "--helpxml")
_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")


def fail(message: str) -> NoReturn:
  """Prints `message` as the one error line and exits with the usage-error code.

  For a program's checks before JAX loads, in one process. Once a run (of possibly several
  processes) has started: run/failing.fail. Library code raises errors.UsageError instead.
  """
  sys.stderr.write(f"error: {message}\n")
  sys.stderr.flush()
  sys.exit(USAGE_EXIT_CODE)


def flag_value(args: list[str], name: str) -> str | None:
  """The last value given to --name (as --name=V or --name V), or None."""
  value = None
  for i, arg in enumerate(args):
    if re.match(rf"^--?{name}=", arg):
      value = arg.split("=", 1)[1]
    elif re.match(rf"^--?{name}$", arg) and i + 1 < len(args):
      value = args[i + 1]
  return value


def _one_line(text: str) -> str:
  return " ".join(str(text).split())


def _config_files(directory: pathlib.Path) -> list[str]:
  if not directory.is_dir():
    return []
  # Config files define get_config; common.py and __init__.py are their shared code.
  files = (p for p in directory.glob("*.py") if not p.name.startswith("_"))
  return sorted(p.name for p in files if "def get_config(" in p.read_text())


def _check_config_file(path: str) -> None:
  if os.path.isfile(path):
    return
  directory = pathlib.Path(path).parent if pathlib.Path(path).parent.is_dir() else CONFIGS_DIR
  close = difflib.get_close_matches(pathlib.Path(path).name, _config_files(directory), n=1)
  hint = f"; did you mean {directory / close[0]}?" if close else ""
  fail(f"--config={path}: no such file{hint} ({PROG} --help lists the configs)")


def load_config(spec: str) -> ml_collections.ConfigDict:
  """`get_config(arg)` of `path[:arg]`, as ml_collections runs it; a bad arg is a usage error."""
  path, _, arg = spec.partition(":")
  _check_config_file(path)
  try:
    config = _exec_config(path, arg)
  except (ValueError, TypeError, KeyError) as error:  # A bad `:ARGS` value.
    fail(f"--config={spec}: {_one_line(error.args[0] if error.args else error)}")
  if not isinstance(config, ml_collections.ConfigDict):
    fail(f"--config={spec}: get_config() returned {type(config).__name__}, not a ConfigDict")
  return config


def _exec_config(path: str, arg: str) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location("_vitboot_cli_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def check_field(config: ml_collections.ConfigDict, field: str, spec: str) -> None:
  """Fails with a one-line message (and the closest field name) if `config.<field>` is unknown."""
  node, done = config, []
  for part in field.split("."):
    where = ".".join(["config", *done])
    if not isinstance(node, ml_collections.ConfigDict):
      fail(f"--config.{field}: {where} is a value ({node!r}), not a group of fields")
    if part not in node:
      close = difflib.get_close_matches(part, list(node.keys()), n=1, cutoff=0.6)
      hint = f"; did you mean --{where}.{close[0]}?" if close else ""
      fail(
        f"--config.{field}: {where} has no field {part!r}{hint} (every field: "
        f"{PROG} --config={spec} --print_config)"
      )
    node = node[part]
    done.append(part)


def parse_flags(argv: list[str], usage: str) -> list[str]:
  """The flags parser for `app.run(main, flags_parser=...)`: usage errors exit 2, --help 0."""
  args = argv[1:]
  spec = flag_value(args, "config")
  if any(a.split("=", 1)[0] in _HELP_FLAGS for a in args):
    print(help_text(usage, spec))
    sys.exit(0)
  if spec is None:
    fail(f"--config is required, e.g. --config=configs/quickstart.py ({PROG} --help)")
  config = load_config(spec)
  for arg in args:
    override = _OVERRIDE.match(arg)
    if override:
      check_field(config, override.group(1), spec)
  try:
    rest = flags.FLAGS(argv)
    flags.FLAGS["config"].value.to_dict()  # A load error is deferred to the first access.
  except flags.Error as error:
    fail(_one_line(error))
  except (AttributeError, KeyError, TypeError, OSError) as error:  # ml_collections' own errors.
    message = error.args[0] if error.args else error
    fail(_one_line(str(message).replace("\\n", " ").replace("\\'", "'")))
  if not flags.FLAGS["print_config"].value and not flags.FLAGS["workdir"].value:
    fail("--workdir is required: the directory for checkpoints and metrics (e.g. workdirs/run1)")
  if len(rest) > 1:
    fail(f"unexpected arguments: {' '.join(rest[1:])} (flags look like --name=value)")
  return rest


def _docstring(path: pathlib.Path) -> str:
  try:
    return ast.get_docstring(ast.parse(path.read_text())) or ""
  except (OSError, SyntaxError):
    return ""


def _args_paragraph(doc: str) -> list[str]:
  """The config docstring's `Args...` paragraph: from its first line to a sentence's end."""
  lines = doc.splitlines()
  start = next((i for i, line in enumerate(lines) if line.startswith("Args")), None)
  if start is None:
    return []
  out = []
  for i in range(start, len(lines)):
    if not lines[i].strip():
      break
    out.append(lines[i])
    following = lines[i + 1] if i + 1 < len(lines) else ""
    if lines[i].rstrip().endswith(".") and not following.startswith(" "):
      break
  return out


def help_text(usage: str, spec: str | None) -> str:
  """--help: the command, the configs with their `:ARGS` (or one config's docstring), flags."""
  parts = [usage.strip(), ""]
  example = spec or "configs/quickstart.py"
  path = pathlib.Path(spec.partition(":")[0]) if spec else None
  if path is not None and path.is_file():
    parts += [f"{path}:", *("  " + line for line in _docstring(path).splitlines()), ""]
  else:
    parts.append(f"Configs ({CONFIGS_DIR}); arguments follow the path after a colon, e.g.")
    parts.append("  --config=configs/quickstart.py:mode=vit,epochs=2")
    for name in _config_files(CONFIGS_DIR):
      doc = _docstring(CONFIGS_DIR / name)
      parts.append(f"  {name}: {doc.splitlines()[0] if doc else ''}")
      parts += ["      " + line.strip() for line in _args_paragraph(doc)]
    parts.append("")
  parts += [
    "Every field of a config and its value (set any with --config.FIELD=VALUE):",
    f"  {PROG} --config={example} --print_config",
    "",
    "Flags:",
  ]
  main_module = sys.modules.get("__main__")
  flag_help = flags.FLAGS.module_help(main_module) if main_module else ""
  if not flag_help.strip():
    flag_help = flags.FLAGS.module_help("vitboot_jax.main")
  parts.append(flag_help)
  return "\n".join(parts)
