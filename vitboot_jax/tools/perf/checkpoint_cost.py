r"""What checkpoint integrity costs: saves with and without the checksum record, and its check.

  python -m vitboot_jax.tools.perf.checkpoint_cost --config=configs/vitb_cifar10.py:mode=vit \
    --repeats 3

Builds the config's real train state (parameters and optimizer state, shapes from the trainer,
values random) and saves it with checkpointer.Checkpointer as train.py does, alternating two
variants in one process: "checksums" (the product: a CRC32 per file recorded in orbax's
background finalisation) and "none" (the record and its flag switched off, as a step saved before
checksums existed, whose restore reads the item's metadata to learn that and warns). Each variant
saves into its own directory on --dir's disk (keeping 2 steps, removed at the end); restores
read files the save has just written (warm page cache, as a resume after a crash usually does
not: a cold read adds the disk's time to both variants).

Output, one JSON object per line:
  1. {"state_bytes", "arrays", "step_dir_bytes", "files", ...}: what is saved.
  2. One line per variant: medians over --repeats of "save_call_s" (how long `save` blocks the
     training loop), "finalize_s" (orbax's finalisation in the background thread, where the
     checksums are computed: their cost is the difference between the variants),
     "save_total_s" (until the step is committed, nothing else running),
     "idle_step_s" (a synthetic step that rewrites every float array of the state, no save in
     flight), "busy_step_s" (the same step while a save is written in the background),
     "restore_s" (Checkpointer.restore into the trainer's abstract state; with checksums it
     verifies first).
  3. {"verify_s", "verify_bytes_per_s"}: checksums.verify of one step alone, median.
  4. {"summary": ...}: what the checksums add to each of the times above (s and %).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags
from ml_collections import config_flags

from vitboot_jax import sharding
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.base import cli, library_logs
from vitboot_jax.checkpoint import checkpointer, checksums
from vitboot_jax.cpu import host_memory

# Defined by `define_flags` when run as a program, so tests can import this module beside other
# tools that define the same names.
_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["repeats"] = flags.DEFINE_integer("repeats", 3, "Trials per variant (alternating).")
  _FLAGS["steps"] = flags.DEFINE_integer(
    "steps", 4, "Synthetic steps timed with and without a save."
  )
  _FLAGS["dir"] = flags.DEFINE_string("dir", None, "Where to save (default: a temp directory).")


VARIANTS = ("checksums", "none")


@contextlib.contextmanager
def _variant(name: str, finalize_times: list[float]) -> Iterator[None]:
  """The product ("checksums") or the record switched off ("none": orbax's own save and
  finalize, as a step saved before records); either way each finalize (in the background thread)
  is timed into `finalize_times`."""
  handler = checksums.ChecksummedHandler  # Only this benchmark patches it.
  product, product_save = handler.finalize, handler.async_save
  plain = ocp.StandardCheckpointHandler
  finalize = product if name == "checksums" else plain.finalize

  def timed(self: Any, directory: Any) -> None:
    start = time.perf_counter()
    finalize(self, directory)
    finalize_times.append(time.perf_counter() - start)

  handler.finalize = timed
  handler.async_save = product_save if name == "checksums" else plain.async_save
  try:
    yield
  finally:
    handler.finalize, handler.async_save = product, product_save


def _random_state(abstract: Any) -> Any:
  """Host arrays of the abstract state's shapes; floats random, so nothing compresses."""
  rng = np.random.default_rng(0)

  def draw(leaf: jax.ShapeDtypeStruct) -> Any:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      return jax.random.key(0)
    if jax.dtypes.issubdtype(leaf.dtype, np.floating):
      return rng.standard_normal(leaf.shape, np.float32).astype(leaf.dtype)
    return np.zeros(leaf.shape, leaf.dtype)

  return jax.tree.map(draw, abstract)


def _on_devices(host: Any, abstract: Any) -> Any:
  return jax.tree.map(
    lambda h, a: h if isinstance(h, jax.Array) else jax.device_put(h, a.sharding), host, abstract
  )


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def _dir_size(path: str) -> tuple[int, int]:
  sizes = [
    os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names
  ]
  return sum(sizes), len(sizes)


class _Trials:
  """One Checkpointer per variant for the whole process, as in training: orbax keeps part of
  every manager it opened (a few hundred MB at this size) until the process ends."""

  def __init__(self, trainer: trainer_lib.Trainer, host: Any, root: str, steps: int):
    self.abstract = trainer.abstract_state
    self.state = _on_devices(host, self.abstract)
    self.steps = steps
    self.saved = 0
    self.ckpts = {
      v: checkpointer.Checkpointer(os.path.join(root, v), keep=2, async_save=True) for v in VARIANTS
    }
    floats = lambda x: jax.dtypes.issubdtype(x.dtype, np.floating)
    # Donated like the train step: a save must have copied the arrays before the next step.
    self.step = jax.jit(
      lambda s: jax.tree.map(lambda x: x * 1.0001 if floats(x) else x, s), donate_argnums=0
    )
    self.run_steps()  # Compiles.

  def run_steps(self) -> list[float]:
    times = []
    for _ in range(self.steps):
      took, self.state = _timed(lambda s=self.state: jax.block_until_ready(self.step(s)))
      times.append(took)
    return times

  def close(self) -> None:
    for ckpt in self.ckpts.values():
      ckpt.close()

  def run(self, variant: str) -> dict[str, Any]:
    ckpt = self.ckpts[variant]
    out: dict[str, Any] = {}
    finalize_times: list[float] = []
    with _variant(variant, finalize_times):
      idle = self.run_steps()
      self.saved += 1
      out["save_call_s"], _ = _timed(lambda: ckpt.save(self.saved, self.state, force=True))
      wait_s, _ = _timed(ckpt.wait)
      out["save_total_s"] = out["save_call_s"] + wait_s
      self.saved += 1
      ckpt.save(self.saved, self.state, force=True)
      busy = self.run_steps()
      ckpt.wait()
      out["finalize_s"] = statistics.median(finalize_times)
      out["idle_step_s"] = statistics.median(idle)
      out["busy_step_s"] = statistics.median(busy)
      step_dir = os.fspath(ckpt.step_dir(self.saved))
      out["step_dir_bytes"], out["files"] = _dir_size(step_dir)
      if variant == "checksums":
        out["verify_s"], problem = _timed(lambda: checksums.verify(step_dir))
        assert problem is None, problem
      # restore() is what a resume runs per step: with a record it verifies first.
      out["restore_s"], _ = _timed(
        lambda: jax.block_until_ready(ckpt.restore(self.abstract, self.saved))
      )
    gc.collect()
    return out


def measure(config: Any, repeats: int, steps: int, directory: str) -> list[dict[str, Any]]:
  """The JSON lines described in the module docstring."""
  mesh = sharding.make_mesh()
  trainer = trainer_lib.build(config, mesh, steps_per_epoch=1)
  host = _random_state(trainer.abstract_state)
  leaves = jax.tree.leaves(trainer.abstract_state)
  state_bytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves)
  runner = _Trials(trainer, host, directory, steps)
  del host
  trials: dict[str, list[dict]] = {v: [] for v in VARIANTS}
  try:
    for variant in VARIANTS:  # Warm-up: orbax's first save and restore of a process cost more.
      runner.run(variant)
    for _ in range(repeats):
      for variant in VARIANTS:  # Alternating: the machine's drift hits both alike.
        trials[variant].append(runner.run(variant))
  finally:
    runner.close()
    for variant in VARIANTS:
      shutil.rmtree(os.path.join(directory, variant), ignore_errors=True)
  first = trials["checksums"][0]
  lines: list[dict[str, Any]] = [
    {
      "config": config.model.get("name", ""),
      "mode": config.mode,
      "state_bytes": state_bytes,
      "arrays": len(leaves),
      "step_dir_bytes": first["step_dir_bytes"],
      "files": first["files"],
      "devices": jax.device_count(),
      "device_kind": jax.devices()[0].device_kind,
      "cpus": os.cpu_count(),
      "allocator": host_memory.description(),
      "repeats": repeats,
      "dir": directory,
    }
  ]
  keys = ("save_call_s", "finalize_s", "save_total_s", "idle_step_s", "busy_step_s", "restore_s")
  medians = {v: {k: statistics.median(t[k] for t in trials[v]) for k in keys} for v in VARIANTS}
  for variant in VARIANTS:
    spread = {f"{k}_all": [round(t[k], 4) for t in trials[variant]] for k in keys}
    lines.append({"variant": variant, **medians[variant], **spread})
  verify_s = statistics.median(t["verify_s"] for t in trials["checksums"])
  lines.append({"verify_s": verify_s, "verify_bytes_per_s": first["step_dir_bytes"] / verify_s})
  on, off = medians["checksums"], medians["none"]
  lines.append(
    {
      "summary": {
        **{f"added_{k}": on[k] - off[k] for k in keys},
        **{f"added_{k}_pct": 100 * (on[k] / off[k] - 1) for k in keys},
      }
    }
  )
  return lines


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {argv[1:]}")
  library_logs.libraries()
  directory = _FLAGS["dir"].value or tempfile.mkdtemp(prefix="checkpoint_cost_")
  try:
    for line in measure(
      _FLAGS["config"].value, _FLAGS["repeats"].value, _FLAGS["steps"].value, directory
    ):
      print(json.dumps(line), flush=True)
  finally:
    if _FLAGS["dir"].value is None:
      shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
  define_flags()
  host_memory.reexec_with_allocator()
  flags.mark_flags_as_required(["config"])
  app.run(main)
