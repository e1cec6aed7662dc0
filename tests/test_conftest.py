"""tests/conftest.py: a clone without ../shared is told, in one line, what it did not check."""

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
