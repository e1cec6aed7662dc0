r"""What a run costs alone on this machine: its own train step and evaluations, timed here.

  python -m vitboot_jax.tools.perf.run_cost WORKDIR [WORKDIR ...] [--steps=20] [--warmup=3]
  python -m vitboot_jax.tools.perf.run_cost --config=configs/quickstart.py:ARGS [--config.F=V ...]

For each WORKDIR (a run of ours, finished or not: its config.json), or for --config (a run not
made yet: its command's --config flags, as a sweep prints them), the step train.py runs is built
from that config (the teacher's or initial weights are not read: a step's time does not depend on
them), and --steps of train.py's loop on the run's own data are timed (benchmark.time_loop:
batches, transfer, step, logging). Each split the run evaluates (validation, then test) is
evaluated twice: the first pass decodes, the second reads tf.data's cache, as every later
evaluation of a run does. The run alone on this machine would take

  idle_total_s = compile_s + total_steps x loop_step_s
                 + eval_s_first + (evaluations - 1) x eval_s

where total_steps and the evaluations (every eval interval and the last step) are the run's
schedule; start-up and checkpoint saves are left out. Runs' own wall times (final.json's
train_seconds_this_run) count only their last launch and include whatever shared the machine;
this tool measures each run alone, so run it with nothing else running (pause other work with
`kill -STOP PID`, resume it with `kill -CONT PID`). All runs given are timed in one process, so
ratios between them are like for like.

Output, one JSON object per line: the measured matmul peak of the devices (benchmark.measure_peak),
then per run {"run" (the workdir, or "config"), "mode", "batch", "devices", "total_steps",
"loop_step_s", "loop_data_s", "compile_s", "evaluations", "eval_images", "eval_s_first", "eval_s",
"idle_train_s", "idle_eval_s", "idle_total_s", "train_seconds_this_run", "steps_this_run" (null
without a final.json)}."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
from absl import app, flags
from etils import epath
from ml_collections import config_flags

from vitboot_jax import configlib, evaluate, sharding
from vitboot_jax.base import cli, errors
from vitboot_jax.cpu import devices as cpu_devices
from vitboot_jax.cpu import host_memory
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools.perf import benchmark


def timed_config(run: epath.PathLike | ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config of `run`: a workdir's (config.json; fields added since take their defaults) or
  the given one, without the checkpoints it starts from (a step's cost ignores their values)."""
  if isinstance(run, ml_collections.ConfigDict):
    config = run.copy_and_resolve_references()
  else:
    config = workdir_rules.read_config(epath.Path(run))
  with config.unlocked():
    config.agent_init_from = config.init_from = ""
  configlib.validate(config, num_devices=jax.device_count())
  return config


def evaluations(total_steps: int, eval_every: int) -> int:
  """How many evaluations a run of `total_steps` makes: every `eval_every` steps and the last."""
  return total_steps // eval_every + (1 if total_steps % eval_every else 0)


def time_evaluations(step: benchmark.CompiledStep) -> dict[str, Any]:
  """One evaluation as train.py runs it (every split it evaluates), twice: decoded, then cached."""
  from vitboot_jax.data import loop_feed  # TensorFlow only for the tf.data pipeline.

  config, trainer = step.config, step.trainer
  feed = loop_feed.open_feed(config, step.mesh)
  in_flight = trainer.models.kernels.eval_batches_in_flight
  params, stats = step.state.params, step.state.batch_stats
  passes, images = [], 0.0
  for _ in range(2):
    start, images = time.perf_counter(), 0.0
    for part in loop_feed.eval_parts(config):
      batches = feed.eval_batches(part)
      images += evaluate.evaluate(trainer.eval_step, params, stats, batches, in_flight)[
        "eval/count"
      ]
    passes.append(time.perf_counter() - start)
  return {
    "steps_per_epoch": feed.info.steps_per_epoch,
    "eval_images": int(images),
    "eval_s_first": passes[0],
    "eval_s": passes[1],
  }


def run_cost(
  run: epath.PathLike | ml_collections.ConfigDict,
  mesh: jax.sharding.Mesh,
  *,
  steps: int,
  warmup: int,
) -> dict[str, Any]:
  """The idle cost of `run`, a workdir or a config (this module's docstring)."""
  from vitboot_jax import train  # The run's own schedule rules.

  config = timed_config(run)
  step = benchmark.compile_step(config, mesh)
  loop = benchmark.time_loop(step, steps, warmup)
  timed = time_evaluations(step)
  per_epoch = timed.pop("steps_per_epoch")
  total = configlib.total_steps(config, per_epoch)
  count = evaluations(total, train.eval_interval(config, per_epoch))
  idle_train = step.compile_s + total * loop["loop_step_s"]
  idle_eval = timed["eval_s_first"] + (count - 1) * timed["eval_s"]
  final, this_run = {}, None
  if not isinstance(run, ml_collections.ConfigDict):
    done = epath.Path(run) / "final.json"
    if done.exists():
      final = json.loads(done.read_text())
      this_run = int(final["step"]) - int(final.get("resumed_from_step", 0))
  return {
    "run": "config" if isinstance(run, ml_collections.ConfigDict) else str(run),
    "mode": config.mode,
    "batch": int(config.batch_size),
    "devices": mesh.size,
    "total_steps": total,
    **loop,
    "loop_steps": steps,
    "compile_s": step.compile_s,
    "evaluations": count,
    **timed,
    "idle_train_s": idle_train,
    "idle_eval_s": idle_eval,
    "idle_total_s": idle_train + idle_eval,
    "train_seconds_this_run": final.get("train_seconds_this_run"),
    "steps_this_run": this_run,
  }


def run(
  runs: Sequence[str | ml_collections.ConfigDict],
  *,
  steps: int,
  warmup: int,
  peak_size: int = 0,
  emit: Callable[[str], Any] = print,
) -> None:
  """Emits the devices' matmul peak, then each run's idle cost (workdirs or configs), as JSON."""
  mesh = sharding.make_mesh()
  emit(json.dumps(benchmark.measure_peak(mesh, size=peak_size)))
  for one in runs:
    emit(json.dumps(run_cost(one, mesh, steps=steps, warmup=warmup)))


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  """This tool's flags; defined only when it runs as a program (tests import several tools)."""
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "A run not made yet.")
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 20, "Timed steps of each run's loop.")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 3, "Untimed loop steps after compilation.")
  _FLAGS["cpu_devices"] = cpu_devices.define_flag()
  _FLAGS["peak_size"] = flags.DEFINE_integer(
    "peak_size", 0, "Side of the peak matmul; 0: 2048 on CPU, 8192 on accelerators."
  )


def main(argv: Sequence[str]) -> None:
  runs: list[str | ml_collections.ConfigDict] = list(argv[1:])
  for workdir in runs:  # All checked before any is timed.
    if not (epath.Path(workdir) / workdir_rules.CONFIG_FILE).is_file():
      cli.fail(f"{workdir} is not the workdir of a run (no {workdir_rules.CONFIG_FILE} there)")
  if _FLAGS["config"].value is not None:
    runs.append(_FLAGS["config"].value)
  if not runs:
    cli.fail(f"no WORKDIR and no --config; usage: {__doc__.splitlines()[2].strip()}")
  first = runs[0]
  if not isinstance(first, ml_collections.ConfigDict):
    first = workdir_rules.read_config(epath.Path(first))
  try:  # The host split into the devices the runs train on (their batches divide it).
    cpu_devices.split_host_for(first, requested=_FLAGS["cpu_devices"].value)
  except errors.UsageError as error:
    cli.fail(str(error))
  run(
    runs,
    steps=_FLAGS["steps"].value,
    warmup=_FLAGS["warmup"].value,
    peak_size=_FLAGS["peak_size"].value,
    emit=functools.partial(print, flush=True),
  )


if __name__ == "__main__":
  host_memory.reexec_with_allocator()  # As main does: the tools time what training runs.
  define_flags()
  app.run(main)
