r"""Host memory over many checkpoint saves, under the allocator settings CPU hosts train with.

  python -m launch.save_memory --config=configs/vits_cifar10.py:mode=joint \
    --config.image_size=32 --saves 30 --every 3 --rounds 2

The project's own instrument, not a user's tool: it chose the jemalloc settings of
cpu/host_memory.py (docs/performance.md records its runs), so it lives outside the package; run
it from the repository root.

Trains the config's train step (jitted and donated as train.py runs it, on a synthetic batch)
and saves the state with checkpointer.Checkpointer as train.py does (asynchronous, keeping 2),
in one child process per (allocator setting, schedule), the settings alternating round after
round so the machine's drift hits them alike. Each child runs jemalloc preloaded with the
setting's MALLOC_CONF, as main re-executes itself on a CPU host (cpu/host_memory.py):

  settings: "product" (host_memory's MALLOC_CONF for jemalloc) and "before" (decay off alone,
    host_memory's first setting); --malloc_conf=NAME=CONF (repeated) gives others (NAME=
    alone: the system's malloc, what accelerator hosts run with).
  schedules: "every" (a save every --every steps, --saves of them) and "once" (one save, after
    step --every, then as many steps as "every" runs without saving).

With --schedule=every or once the tool runs that one schedule in its own process, under
whatever allocator it re-executes with (main's), and prints its line.

Output, one JSON object per line:
  1. One line per child: {"setting", "malloc_conf", "schedule", "steps", "saves",
     "state_bytes", "peak_rss_bytes" (getrusage's maximum, or a later sample), "rss_bytes" (resident
     set after each --every steps: after each save's step in "every"), "rss_growth_bytes" (the
     last of them minus the second: what the saves after the first two added), "step_s"
     (median over every step after the first --every; "step_s_all" lists them),
     "step_cpu_s" (the process's CPU seconds in a step, all threads, median over the same
     steps: less moved than step_s by other programs on the machine),
     "minor_faults_per_step" (the process's page faults during a step, median over the same
     steps: fresh pages the allocator had handed back or never had), "allocator"}.
  2. {"summary": ...}: per setting, medians over rounds of peak_rss_bytes, step_s, step_cpu_s
     and minor_faults_per_step per schedule, "peak_every_over_once" (what saving often costs
     the host's memory) and "rss_growth_bytes" of "every"; and "step_s_before_over_product" per
     schedule (above 1: the product's steps are faster).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from vitboot_jax.base import cli
from vitboot_jax.cpu import host_memory

# Defined by `define_flags` when run as a program, so tests can import this module beside other
# tools that define the same names.
_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "Config file.")
  _FLAGS["saves"] = flags.DEFINE_integer("saves", 30, "Saves of the 'every' schedule.")
  _FLAGS["every"] = flags.DEFINE_integer("every", 3, "Steps between saves.")
  _FLAGS["rounds"] = flags.DEFINE_integer("rounds", 1, "Rounds of every (setting, schedule) child.")
  _FLAGS["malloc_conf"] = flags.DEFINE_multi_string(
    "malloc_conf",
    [],
    "NAME=CONF, repeated: jemalloc settings to compare instead of 'product' and 'before'; NAME= "
    "(no CONF): the system's malloc.",
  )
  _FLAGS["schedule"] = flags.DEFINE_enum(
    "schedule", None, ["every", "once"], "Run this schedule in this process and print its line."
  )
  _FLAGS["dir"] = flags.DEFINE_string("dir", None, "Where to save (default: a temp directory).")


SCHEDULES = ("every", "once")
# host_memory's first MALLOC_CONF: pages never returned, nothing else set.
BEFORE = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def _jemalloc() -> tuple[str, str]:
  """The jemalloc library main preloads on this host and the product's MALLOC_CONF for it."""
  found = host_memory.find_allocator()
  if found is None or "jemalloc" not in found[0]:
    cli.fail("this benchmark compares jemalloc settings: install libjemalloc2 (apt)")
  return found[0], found[1]["MALLOC_CONF"]


def settings(named: Sequence[str]) -> dict[str, str]:
  """{name: MALLOC_CONF}: --malloc_conf's NAME=CONF items, or the product's and `BEFORE`."""
  if not named:
    return {"product": _jemalloc()[1], "before": BEFORE}
  out = {}
  for item in named:
    name, sep, conf = item.partition("=")
    if not sep or not name:
      cli.fail(f"--malloc_conf item {item!r} must look like NAME=CONF")
    out[name] = conf
  return out


def _rss_bytes() -> int:
  with open("/proc/self/statm") as statm:
    return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _minor_faults() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_schedule(config: Any, schedule: str, saves: int, every: int, directory: str) -> dict:
  """Steps and saves in this process; the child's JSON line (without its setting's name)."""
  import jax
  import numpy as np

  from vitboot_jax import sharding
  from vitboot_jax import trainer as trainer_lib
  from vitboot_jax.base import library_logs
  from vitboot_jax.checkpoint import checkpointer
  from vitboot_jax.cpu import devices as cpu_devices
  from vitboot_jax.tools.perf import benchmark

  library_logs.libraries()
  cpu_devices.split_host_for(config)
  mesh = sharding.make_mesh()
  trainer = trainer_lib.build(config, mesh, steps_per_epoch=1000)
  state = trainer.initial_state()
  batch = benchmark.synthetic_batch(config, config.batch_size, mesh)
  leaves = jax.tree.leaves(trainer.abstract_state)
  state_bytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves)
  ckpt = checkpointer.Checkpointer(directory, keep=2, async_save=True)
  times, cpu_times, faults, rss = [], [], [], []
  try:
    for step in range(1, saves * every + 1):
      start, cpu_start, faulted = time.perf_counter(), time.process_time(), _minor_faults()
      state, _ = trainer.train_step(state, batch)
      jax.block_until_ready(state)
      times.append(time.perf_counter() - start)
      cpu_times.append(time.process_time() - cpu_start)
      faults.append(_minor_faults() - faulted)
      if step % every == 0:
        if schedule == "every" or step == every:
          ckpt.save(step, state, force=True)
        rss.append(_rss_bytes())
    ckpt.wait()
  finally:
    ckpt.close()
  timed = times[every:]
  return {
    "schedule": schedule,
    "steps": len(times),
    "saves": saves if schedule == "every" else 1,
    "state_bytes": state_bytes,
    # The kernel's high-water mark can lag a sample just read from /proc: the larger of the two.
    "peak_rss_bytes": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, *rss),
    "rss_bytes": rss,
    "rss_growth_bytes": rss[-1] - rss[min(1, len(rss) - 1)],
    "step_s": statistics.median(timed),
    "step_s_all": [round(t, 4) for t in timed],
    "step_cpu_s": statistics.median(cpu_times[every:]),
    "minor_faults_per_step": statistics.median(faults[every:]),
    "devices": jax.device_count(),
    "allocator": host_memory.description(),
    "malloc_conf": os.environ.get("MALLOC_CONF"),
  }


def _child(schedule: str, conf: str, library: str) -> dict:
  """One schedule in a fresh process under jemalloc with `conf`, as main would re-execute, or
  under the system's malloc where `conf` is empty (as on accelerator hosts)."""
  if conf:
    env = {**os.environ, "MALLOC_CONF": conf, host_memory.PRELOADED: library}
    env["LD_PRELOAD"] = f"{library} {os.environ.get('LD_PRELOAD', '')}".strip()
  else:
    env = {**os.environ, host_memory.OPT_OUT: "1"}
  program = ["-m", __spec__.name] if __spec__ else [__file__]  # `python -m` or the file run.
  argv = [sys.executable, *program, *sys.argv[1:], f"--schedule={schedule}"]
  out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"{' '.join(argv)} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(lines: Sequence[dict]) -> dict[str, Any]:
  """Medians over rounds per setting and schedule, and the ratios the module docstring names."""
  median = lambda name, schedule, key: statistics.median(
    line[key] for line in lines if line["setting"] == name and line["schedule"] == schedule
  )
  names = list(dict.fromkeys(line["setting"] for line in lines))
  out: dict[str, Any] = {}
  for name in names:
    keys = ("peak_rss_bytes", "step_s", "step_cpu_s", "minor_faults_per_step")
    row = {f"{k}_{s}": median(name, s, k) for s in SCHEDULES for k in keys}
    row["peak_every_over_once"] = row["peak_rss_bytes_every"] / row["peak_rss_bytes_once"]
    row["rss_growth_bytes_every"] = median(name, "every", "rss_growth_bytes")
    out[name] = row
  if {"product", "before"} <= set(names):
    for s in SCHEDULES:
      out[f"step_s_before_over_product_{s}"] = (
        out["before"][f"step_s_{s}"] / out["product"][f"step_s_{s}"]
      )
  return out


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {argv[1:]}")
  if _FLAGS["saves"].value < 2 or _FLAGS["every"].value < 1:
    cli.fail("--saves must be at least 2 and --every at least 1")
  if _FLAGS["schedule"].value:
    directory = _FLAGS["dir"].value or tempfile.mkdtemp(prefix="save_memory_")
    try:
      line = run_schedule(
        _FLAGS["config"].value,
        _FLAGS["schedule"].value,
        _FLAGS["saves"].value,
        _FLAGS["every"].value,
        directory,
      )
    finally:
      shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(line), flush=True)
    return
  compared = settings(_FLAGS["malloc_conf"].value)
  # Only jemalloc settings need the library: the system's malloc alone runs anywhere (a GPU host).
  library = _jemalloc()[0] if any(compared.values()) else ""
  lines = []
  for _ in range(_FLAGS["rounds"].value):
    for name, conf in compared.items():  # Alternating: ABAB...
      for schedule in SCHEDULES:
        lines.append({"setting": name, **_child(schedule, conf, library)})
        print(json.dumps(lines[-1]), flush=True)
  print(json.dumps({"summary": summarise(lines)}), flush=True)


if __name__ == "__main__":
  define_flags()
  if cli.flag_value(sys.argv[1:], "schedule"):  # The parent only starts children.
    host_memory.reexec_with_allocator()
  flags.mark_flags_as_required(["config"])
  app.run(main)
