"""A run's record of its code: the package's commit, uncommitted changes, and each launch kept."""

import importlib.metadata
import json
import subprocess

import pytest

from vitboot_jax.run import provenance


def _git(repo, *args):
  return subprocess.run(
    ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
  ).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
  """A git repository standing in for the package's checkout, with one commit."""
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "a.py").write_text("x = 1\n")
  _git(repo, "add", "a.py")
  _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
  monkeypatch.setattr(provenance, "_ROOT", str(repo))
  return repo


def test_code_names_the_checkouts_commit_and_whether_it_was_changed(checkout):
  head = _git(checkout, "rev-parse", "HEAD")
  assert provenance.code()["commit"] == head and provenance.code()["dirty"] is False
  (checkout / "untracked.txt").write_text("not part of the code\n")
  assert provenance.code()["dirty"] is False
  (checkout / "a.py").write_text("x = 2\n")
  assert provenance.code() == {
    "commit": head,
    "dirty": True,
    "version": importlib.metadata.version("vitboot_jax"),
  }


def test_outside_a_checkout_only_the_version_is_known(tmp_path, monkeypatch):
  monkeypatch.setattr(provenance, "_ROOT", str(tmp_path))
  assert provenance.code() == {
    "commit": None,
    "dirty": None,
    "version": importlib.metadata.version("vitboot_jax"),
  }


def test_each_launch_appends_a_line_and_keeps_the_earlier_ones(checkout, tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  assert provenance.launches(workdir) == []
  first = provenance.record_launch(workdir, start_step=0, devices=8)
  # A file cut mid-line by an older writer still takes the next line on a line of its own.
  path = workdir / provenance.LAUNCHES_FILE
  path.write_text(path.read_text().rstrip("\n"))
  provenance.record_launch(workdir, start_step=400, devices=8)
  got = provenance.launches(workdir)
  assert [g["start_step"] for g in got] == [0, 400] and got[0] == json.loads(json.dumps(first))
  assert got[1]["code"]["commit"] == _git(checkout, "rev-parse", "HEAD")
  assert set(got[1]["software"]) == set(provenance.PACKAGES) and got[1]["software"]["jax"]
