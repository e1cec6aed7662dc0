"""Runs Python code in a fresh interpreter where TensorFlow cannot be imported, as on an
accelerator host that has only jax (launch/accelerator_check.sh)."""

import pathlib
import subprocess
import sys

# Imports of tensorflow(_datasets) fail as where it is not installed, and importlib.util.find_spec
# says None for them (etils asks it before touching TensorFlow).
_REFUSE_TENSORFLOW = (
  "import sys, importlib.util\n"
  "_BLOCKED = ('tensorflow', 'tensorflow_datasets')\n"
  "class NoTF:\n"
  "  def find_spec(self, name, path=None, target=None):\n"
  "    if name.split('.')[0] in _BLOCKED:\n"
  "      raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
  "sys.meta_path.insert(0, NoTF())\n"
  "_find_spec = importlib.util.find_spec\n"
  "def find_spec(name, package=None):\n"
  "  if name.split('.')[0] in _BLOCKED:\n"
  "    return None\n"
  "  return _find_spec(name, package)\n"
  "importlib.util.find_spec = find_spec\n"
)


def run(code: str, env: dict[str, str] | None = None, timeout: float | None = None):
  """Runs `code` from the repository root; asserting on the result is the caller's."""
  root = pathlib.Path(__file__).resolve().parents[1]
  return subprocess.run(
    [sys.executable, "-c", _REFUSE_TENSORFLOW + code],
    cwd=root,
    capture_output=True,
    text=True,
    env=env,
    timeout=timeout,
  )


def run_module(module: str, args: list[str], env: dict[str, str] | None = None, timeout=600):
  """`python -m module args...` without TensorFlow."""
  code = (
    "import runpy\n"
    f"sys.argv = [{module!r}] + {list(map(str, args))!r}\n"
    f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
  )
  return run(code, env=env, timeout=timeout)
