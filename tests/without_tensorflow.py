"""Runs Python code in a fresh interpreter where TensorFlow cannot be imported, as on an
accelerator host that has only jax (launch/accelerator_check.sh)."""

import pathlib
import subprocess
import sys

_REFUSE_TENSORFLOW = (
  "import sys\n"
  "class NoTF:\n"
  "  def find_spec(self, name, path=None, target=None):\n"
  "    if name.split('.')[0] in ('tensorflow', 'tensorflow_datasets'):\n"
  "      raise ImportError(name)\n"
  "sys.meta_path.insert(0, NoTF())\n"
)


def run(code: str) -> subprocess.CompletedProcess:
  """Runs `code` from the repository root; asserting on the result is the caller's."""
  root = pathlib.Path(__file__).resolve().parents[1]
  return subprocess.run(
    [sys.executable, "-c", _REFUSE_TENSORFLOW + code], cwd=root, capture_output=True, text=True
  )
