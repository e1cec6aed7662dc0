r"""What a run costs alone on this machine: its own train step and evaluations, timed here.

  python -m vitboot_jax.tools.perf.run_cost WORKDIR [WORKDIR ...] [--steps=20] [--warmup=3] \
    [--evaluations=1]

For each WORKDIR (a run of ours, finished or not: its config.json), the step train.py runs is
built from the run's config as it ran (its teacher's weights are not read: a step's time does not
depend on them), and --steps of train.py's loop on the run's own data are timed
(benchmark.time_loop: batches, transfer, step, logging). Each split the run evaluates (validation,
then test) is evaluated twice: the first pass decodes, the second reads tf.data's cache, as every
later evaluation of a run does. The run alone on this machine would take

  idle_total_s = compile_s + total_steps x loop_step_s
                 + eval_s_first + (evaluations - 1) x eval_s

where total_steps and the evaluations (every eval interval and the last step) are the run's
schedule; start-up and checkpoint saves are left out. Runs' own wall times (final.json's
train_seconds_this_run) count only their last launch and include whatever shared the machine;
this tool measures each run alone, so run it with nothing else running (pause other work with
`kill -STOP PID`, resume it with `kill -CONT PID`). Workdirs sharing a step share one timing
process, so ratios between them are like for like.

Output, one JSON object per line: the measured matmul peak of the devices (benchmark.measure_peak),
then per workdir {"workdir", "mode", "batch", "devices", "total_steps", "loop_step_s",
"loop_data_s", "compile_s", "evaluations", "eval_images", "eval_s_first", "eval_s",
"idle_train_s", "idle_eval_s", "idle_total_s", "train_seconds_this_run", "steps_this_run"}.
"""

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

from vitboot_jax import configlib, evaluate, sharding
from vitboot_jax.base import cli, errors
from vitboot_jax.cpu import devices as cpu_devices
from vitboot_jax.cpu import host_memory
from vitboot_jax.run import workdir_rules
from vitboot_jax.tools.perf import benchmark


def run_config(workdir: epath.PathLike) -> ml_collections.ConfigDict:
  """The config a run ran (config.json; fields added since take their defaults), without the
  checkpoints it started from: the step's cost does not depend on their values."""
  config = workdir_rules.read_config(epath.Path(workdir))
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
  workdir: epath.PathLike, mesh: jax.sharding.Mesh, *, steps: int, warmup: int
) -> dict[str, Any]:
  """The idle cost of the run in `workdir` (this module's docstring)."""
  from vitboot_jax import train  # The run's own schedule rules.

  config = run_config(workdir)
  step = benchmark.compile_step(config, mesh)
  loop = benchmark.time_loop(step, steps, warmup)
  timed = time_evaluations(step)
  per_epoch = timed.pop("steps_per_epoch")
  total = configlib.total_steps(config, per_epoch)
  count = evaluations(total, train.eval_interval(config, per_epoch))
  idle_train = step.compile_s + total * loop["loop_step_s"]
  idle_eval = timed["eval_s_first"] + (count - 1) * timed["eval_s"]
  try:
    final = json.loads((epath.Path(workdir) / "final.json").read_text())
    this_run = int(final["step"]) - int(final.get("resumed_from_step", 0))
  except FileNotFoundError:
    final, this_run = {}, None
  return {
    "workdir": str(workdir),
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
  workdirs: Sequence[str],
  *,
  steps: int,
  warmup: int,
  peak_size: int = 0,
  emit: Callable[[str], Any] = print,
) -> None:
  """Emits the devices' matmul peak, then each workdir's idle cost, as JSON lines."""
  mesh = sharding.make_mesh()
  emit(json.dumps(benchmark.measure_peak(mesh, size=peak_size)))
  for workdir in workdirs:
    emit(json.dumps(run_cost(workdir, mesh, steps=steps, warmup=warmup)))


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
  """This tool's flags; defined only when it runs as a program (tests import several tools)."""
  _FLAGS["steps"] = flags.DEFINE_integer("steps", 20, "Timed steps of each run's loop.")
  _FLAGS["warmup"] = flags.DEFINE_integer("warmup", 3, "Untimed loop steps after compilation.")
  _FLAGS["cpu_devices"] = cpu_devices.define_flag()
  _FLAGS["peak_size"] = flags.DEFINE_integer(
    "peak_size", 0, "Side of the peak matmul; 0: 2048 on CPU, 8192 on accelerators."
  )


def main(argv: Sequence[str]) -> None:
  workdirs = list(argv[1:])
  if not workdirs:
    cli.fail(f"no WORKDIR; usage: {__doc__.splitlines()[2].strip()}")
  for workdir in workdirs:  # All checked before any is timed.
    if not (epath.Path(workdir) / workdir_rules.CONFIG_FILE).is_file():
      cli.fail(f"{workdir} is not the workdir of a run (no {workdir_rules.CONFIG_FILE} there)")
  try:  # The host split into the devices the runs trained on (their batches divide it).
    first = workdir_rules.read_config(epath.Path(workdirs[0]))
    cpu_devices.split_host_for(first, requested=_FLAGS["cpu_devices"].value)
  except errors.UsageError as error:
    cli.fail(str(error))
  run(
    workdirs,
    steps=_FLAGS["steps"].value,
    warmup=_FLAGS["warmup"].value,
    peak_size=_FLAGS["peak_size"].value,
    emit=functools.partial(print, flush=True),
  )


if __name__ == "__main__":
  host_memory.reexec_with_allocator()  # As main does: the tools time what training runs.
  define_flags()
  app.run(main)
