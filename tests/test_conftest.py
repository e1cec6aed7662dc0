"""tests/conftest.py: a clone without ../shared is told, in one line, what it did not check; and
test modules share helpers only through tests/' helper modules (runs.py, tiny_steps.py, ...)."""

import ast
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


def _pytest(shared, *args):
  env = {**os.environ, "VITBOOT_SHARED": str(shared)}
  cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *args]
  return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_skipped_fidelity_tests_are_counted_in_one_line_with_the_command(tmp_path):
  proc = _pytest(tmp_path, "tests/test_golden_models.py", "-k", "wrong_depth or vit_logits")
  lines = [line for line in proc.stdout.splitlines() if "fidelity (golden)" in line]
  assert proc.returncode == 0, proc.stdout[-2000:]
  assert len(lines) == 1, proc.stdout[-2000:]
  assert "3 fidelity (golden) tests skipped" in lines[0]
  assert str(tmp_path / "reference" / "golden") in lines[0]
  assert "VITBOOT_SHARED=DIR python -m pytest tests/test_golden_models.py" in lines[0]


def test_no_line_when_no_fidelity_test_skipped(tmp_path):
  proc = _pytest(tmp_path, "tests/test_readme.py")
  assert proc.returncode == 0, proc.stdout[-2000:]
  assert "fidelity" not in proc.stdout


def _test_modules_imported(source: str) -> list[str]:
  """The test_ modules (tests/test_*.py) that `source` imports, in any form."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = (node.module or "").split(".")
      if base[-1].startswith("test_"):
        found.append(".".join(base))
      elif base in (["tests"], [""]):  # from tests import test_x; from . import test_x.
        found += [a.name for a in node.names]
  return [m for m in found if m.split(".")[-1].startswith("test_")]


def test_no_test_module_imports_another():
  """A test module's helpers are private to it; shared ones live in a helper module, so running
  or editing one test file never runs or breaks another's collection."""
  for path in sorted((REPO_ROOT / "tests").glob("*.py")):
    imported = _test_modules_imported(path.read_text())
    assert not imported, f"tests/{path.name} imports {imported}: move the helpers to tests/"
  for source in (
    "from tests.test_steps import batch_of",
    "from .test_steps import batch_of",
    "from tests import test_faults",
    "from . import test_faults",
    "import tests.test_faults",
    "def f():\n  from tests.test_mechanism import _run",
  ):
    assert _test_modules_imported(source), source
  assert not _test_modules_imported("from tests.tiny_steps import batch_of\nimport pytest")
