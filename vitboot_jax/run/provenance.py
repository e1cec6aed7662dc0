"""What code and software a run ran: recorded in its workdir so a result names its own commit.

Each launch of a run appends one line to launches.jsonl (the step it started from, the package's
git commit and whether the checkout had uncommitted changes, the versions of the libraries the
step depends on, the backend, devices and host allocator); final.json repeats the commit of the
launch that finished. A package installed without its git checkout records its version alone.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import subprocess
from typing import Any

from etils import epath

from vitboot_jax.base import files

LAUNCHES_FILE = "launches.jsonl"
# The libraries whose versions can move a run's numbers.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git(*args: str) -> str | None:
  try:
    result = subprocess.run(
      ["git", "-C", _ROOT, *args], capture_output=True, text=True, check=True, timeout=10
    )
  except (OSError, subprocess.SubprocessError):
    return None
  return result.stdout


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def code() -> dict[str, Any]:
  """The package's commit (None outside a git checkout), whether tracked files differ from it,
  and its installed version."""
  commit = None
  dirty = None
  # Only the package's own checkout counts, never a repository it happens to be installed inside.
  if os.path.exists(os.path.join(_ROOT, ".git")):
    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None else bool(status.strip())
  return {"commit": commit, "dirty": dirty, "version": _version("vitboot_jax")}


def software() -> dict[str, str | None]:
  """Versions of the libraries in PACKAGES (None where one is not installed)."""
  return {name: _version(name) for name in PACKAGES}


def record_launch(workdir: epath.PathLike, **fields: Any) -> dict[str, Any]:
  """Appends this launch's line (time, code, software, then `fields`) to launches.jsonl.

  Rewrites the whole file atomically, so a kill leaves the previous lines intact; call it on
  process 0 only.
  """
  path = epath.Path(workdir) / LAUNCHES_FILE
  line = {
    "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "code": code(),
    "software": software(),
    **fields,
  }
  before = path.read_text() if path.exists() else ""
  if before and not before.endswith("\n"):
    before += "\n"
  files.write_atomically(path, before + json.dumps(line) + "\n")
  return line


def launches(workdir: epath.PathLike) -> list[dict[str, Any]]:
  """The launch records of `workdir`, oldest first ([] for a run from before they were kept)."""
  return files.read_jsonl(epath.Path(workdir) / LAUNCHES_FILE)
