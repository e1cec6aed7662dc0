"""Running a sweep table's rows: each (row, seed) trains into its own workdir as a subprocess of
`vitboot_jax.main`, one after another; a signal to the sweep reaches the run in progress, which
saves and stops the sweep (tools/sweep/__main__.py says how it is used).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from etils import epath

from vitboot_jax.tools.sweep.tables import Row, Table, describe, runs

DEFAULT_DATA_DIR = "../shared/data/cifar10"
# The repository root: config paths are relative to it and runs start in it.
REPO = pathlib.Path(__file__).resolve().parents[3]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every run of a sweep shares."""

  root: str  # As printed: relative to the repository root when inside it, else absolute.
  seeds: tuple[int, ...]
  epochs: int | None
  data_dir: str | None  # Absolute (written into each run's config.json); None: not a folder table.
  extra: tuple[str, ...] = ()


def repo_path(path: str | os.PathLike) -> str:
  """`path` (relative to the cwd) as it works from the repository root; a URL (gs://) as is."""
  if "://" in os.fspath(path):
    return os.fspath(path)
  absolute = pathlib.Path(os.path.abspath(path))
  try:
    return str(absolute.relative_to(REPO))
  except ValueError:
    return str(absolute)


def settings(
  table: Table,
  root: str | None = None,
  seeds: Sequence[int] | None = None,
  epochs: int | None = None,
  data_dir: str = DEFAULT_DATA_DIR,
  extra: Sequence[str] = (),
) -> Settings:
  if epochs is not None and table.epochs is None:
    raise ValueError(
      f"table {table.name} trains its configs' epochs; change them with "
      "--override=--config.num_epochs=N"
    )
  return Settings(
    root=repo_path(root or REPO / table.root),
    seeds=tuple(table.seeds if seeds is None else seeds),
    epochs=table.epochs if epochs is None else epochs,
    data_dir=os.path.abspath(data_dir) if table.data_folder else None,
    extra=tuple(extra),
  )


def workdir(s: Settings, row: Row, seed: int) -> epath.Path:
  """Where (row, seed) trains, relative to the repository root unless ROOT is outside it (a
  bucket's gs://... included: epath reads it, pathlib would turn it into gs:/...)."""
  return epath.Path(s.root) / f"{row.run_name}_seed{seed}"


def absolute(path: epath.Path) -> epath.Path:
  return path if "://" in os.fspath(path) or path.is_absolute() else epath.Path(REPO) / path


def row_config(s: Settings, row: Row) -> str:
  return row.config + (f",epochs={s.epochs}" if s.epochs is not None else "")


def command(table: Table, s: Settings, row: Row, seed: int) -> list[str]:
  """The training command of (row, seed), starting with `python`; run it from the repo root."""
  data = ["--config.data.name=folder", f"--config.data.dir={s.data_dir}"] if s.data_dir else []
  return [
    "python",
    "-m",
    "vitboot_jax.main",
    f"--config={row_config(s, row)}",
    f"--workdir={workdir(s, row, seed)}",
    f"--config.seed={seed}",
    *data,
    *table.overrides,
    *(o.format(root=s.root, seed=seed) for o in row.overrides),
    *s.extra,
  ]


def print_commands(table: Table, s: Settings, selected: Sequence[Row]) -> None:
  print(f"# {table.title}: run the commands from the repository root ({REPO}).")
  for seed in s.seeds:
    for row in runs(selected):
      shared = [r for r in selected if r.run_name == row.run_name]
      for r in shared:
        print(describe(table, r))
      print(shlex.join(command(table, s, row, seed)))
  print()


class Stopped(Exception):  # noqa: N818 (not an error: a requested stop)
  """A run stopped on SIGTERM/SIGINT after saving its checkpoint; the sweep stops with it."""

  def __init__(self, workdir: str, exit_code: int):
    self.workdir, self.exit_code = workdir, exit_code
    super().__init__(
      f"stopped ({signal.Signals(exit_code - 128).name}) with {workdir} saved; re-run the same "
      "command to resume"
    )


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run_training(cmd: Sequence[str], cwd: str | os.PathLike = REPO) -> tuple[int, int | None]:
  """Runs one training command from `cwd` (the repo root): (exit code, stop signal received).

  SIGTERM or SIGINT to the sweep reaches the run as SIGTERM, so it saves and exits (a Ctrl-C in
  a terminal reaches both; a second SIGTERM is harmless, a second SIGINT would skip the save).
  """
  process = subprocess.Popen([sys.executable, *cmd[1:]], cwd=cwd)
  received: list[int] = []

  def forward(signum: int, frame: Any) -> None:
    del frame
    received.append(signum)
    if process.poll() is None:
      process.send_signal(signal.SIGTERM)

  in_main_thread = threading.current_thread() is threading.main_thread()
  previous = {sig: signal.signal(sig, forward) for sig in _STOP_SIGNALS} if in_main_thread else {}
  try:
    return process.wait(), (received[0] if received else None)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def run_missing(table: Table, s: Settings, selected: Sequence[Row]) -> list[str]:
  """Trains every (run, seed) without a final.json, seed by seed; returns the failed workdirs.

  Raises Stopped when a run stops on a signal (sent to the sweep or to the run itself).
  """
  failed = []
  for seed in s.seeds:
    for row in runs(selected):
      wd = workdir(s, row, seed)
      if (absolute(wd) / "final.json").exists():
        print(f"done already: {wd}", flush=True)
        continue
      cmd = command(table, s, row, seed)
      print(f"running: {shlex.join(cmd)}", flush=True)
      start = time.perf_counter()
      returncode, stop_signal = run_training(cmd)
      minutes = (time.perf_counter() - start) / 60
      if stop_signal is not None or returncode in (128 + sig for sig in _STOP_SIGNALS):
        raise Stopped(str(wd), returncode if returncode > 128 else 128 + stop_signal)
      if returncode:
        print(f"FAILED ({returncode}) after {minutes:.1f} min: {wd}", flush=True)
        failed.append(str(wd))
      else:
        print(f"finished in {minutes:.1f} min: {wd}", flush=True)
  return failed
