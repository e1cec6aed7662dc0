"""Training loop as a library: `train_and_evaluate(config, workdir)`.

One call trains every model of `config.mode`, evaluates them exactly at the end of each epoch
(or every `eval_every_steps`), checkpoints with orbax, and resumes from the newest complete
checkpoint in `workdir` when called again. Outputs in `workdir`: config.json, metrics.jsonl,
TensorBoard events, checkpoints/, final.json (final-epoch top-1/top-5 of every model, which is
what the paper reports).
"""

from __future__ import annotations

import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from vitboot_jax import (
  checkpoint,
  configlib,
  evaluate,
  input_pipeline,
  metrics,
  preemption,
  sharding,
)
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.state import TrainState

FINAL_FILE = "final.json"
CONFIG_FILE = "config.json"


def _total_steps(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  total = steps_per_epoch * config.num_epochs
  return min(total, config.total_steps) if config.total_steps > 0 else total


def eval_interval(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  """Steps between evaluations (the last step is always evaluated as well)."""
  if config.eval_every_steps > 0:
    return config.eval_every_steps
  return steps_per_epoch * config.eval_every_epochs


def _check_same_config(workdir: epath.Path, config: ml_collections.ConfigDict) -> None:
  """A workdir belongs to one config: refuse to resume it with different hyper-parameters."""
  path = workdir / CONFIG_FILE
  if not path.exists():
    return
  saved = json.loads(path.read_text())
  current = json.loads(config.to_json_best_effort())
  # Fields that may change between runs without changing the experiment.
  volatile = {
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "eval_every_steps",
    "eval_every_epochs",
  }
  changed = sorted(
    k for k in set(saved) | set(current) if k not in volatile and saved.get(k) != current.get(k)
  )
  if changed:
    raise ValueError(
      f"{workdir} holds a run with a different config (fields: {changed}); use a new --workdir "
      "or the original config to resume it"
    )


class NonFiniteError(FloatingPointError):
  """A loss or gradient norm became NaN or infinite; nothing after the last good save is kept."""


# Step metrics that are not loss terms or gradient norms, so they need not be finite.
_NOT_CHECKED = ("train/lr", "train/feature_weight", "train/align_")


class _FiniteCheck:
  """Stops at the first non-finite loss or gradient norm, one step behind the device.

  Reading step k's scalars while step k+1 runs keeps the device busy; `now()` checks the newest
  step before anything is saved, so a non-finite state is never written.
  """

  def __init__(self, ckpt: checkpoint.Checkpointer):
    self._ckpt = ckpt
    self._pending: tuple[int, dict[str, jax.Array]] | None = None

  def add(self, step: int, step_metrics: dict[str, jax.Array]) -> None:
    """Checks the previous step, then queues `step`'s metrics."""
    self.now()
    checked = {k: v for k, v in step_metrics.items() if not k.startswith(_NOT_CHECKED)}
    self._pending = (step, checked)

  def now(self) -> None:
    if self._pending is None:
      return
    step, pending = self._pending
    self._pending = None
    values = {k.removeprefix("train/"): float(v) for k, v in jax.device_get(pending).items()}
    bad = sorted(k for k, v in values.items() if not np.isfinite(v))
    if not bad:
      return
    self._ckpt.wait()
    last = self._ckpt.latest_step()
    saved = (
      f"the newest complete checkpoint is step {last} ({self._ckpt.step_dir(last)})"
      if last is not None
      else "no checkpoint was saved yet"
    )
    raise NonFiniteError(
      f"Non-finite {', '.join(bad)} at step {step}; nothing after it was saved and {saved}. "
      f"Step {step}'s values: "
      + " ".join(f"{k}={v:.4g}" for k, v in sorted(values.items()))
      + ". Lower the learning rate (config.optim.lr) or check the data; resuming this workdir "
      "with the same config repeats the same steps."
    )


class _Progress:
  """Logs step, epoch, img/s and ETA; throughput over the last reporting interval."""

  def __init__(self, total_steps: int, steps_per_epoch: int, batch_size: int, start_step: int):
    self.total, self.per_epoch, self.batch = total_steps, steps_per_epoch, batch_size
    self.last_step, self.last_time = start_step, time.perf_counter()

  def __call__(self, step: int, scalars: dict[str, float]) -> dict[str, float]:
    now = time.perf_counter()
    rate = (step - self.last_step) / max(now - self.last_time, 1e-9)
    self.last_step, self.last_time = step, now
    eta = (self.total - step) / max(rate, 1e-9)
    shown = {k.split("/")[-1]: v for k, v in scalars.items() if "loss" in k or "top1" in k}
    logging.info(
      "step %d/%d epoch %.2f  %.1f img/s  ETA %s  %s",
      step,
      self.total,
      step / self.per_epoch,
      rate * self.batch,
      time.strftime("%H:%M:%S", time.gmtime(eta)),
      " ".join(f"{k}={v:.4f}" for k, v in sorted(shown.items())),
    )
    return {"train/img_per_s": rate * self.batch}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains and evaluates `config` in `workdir`; returns the final metrics (final.json)."""
  configlib.validate(config, num_devices=jax.device_count())
  workdir = epath.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  if (workdir / FINAL_FILE).exists():
    final = json.loads((workdir / FINAL_FILE).read_text())
    logging.info("%s already holds a finished run (%s); nothing to do.", workdir, FINAL_FILE)
    return final
  _check_same_config(workdir, config)

  mesh = sharding.make_mesh()
  info = input_pipeline.dataset_info(config)
  steps_per_epoch = info.steps_per_epoch
  total_steps = _total_steps(config, steps_per_epoch)
  trainer = trainer_lib.build(config, mesh, steps_per_epoch)
  models, train_step, eval_step = trainer.models, trainer.train_step, trainer.eval_step

  ckpt = checkpoint.Checkpointer(
    workdir, keep=config.keep_checkpoints, save_every_steps=config.checkpoint_every_steps
  )
  restored = ckpt.restore_latest(trainer.abstract_state)
  if restored is None:
    state: TrainState = trainer.initial_state()
    start_step = 0
  else:
    state, start_step = restored
    logging.info("Resuming from the checkpoint of step %d in %s", start_step, ckpt.directory)

  writer = metrics.MetricWriter(workdir)
  writer.truncate_after(start_step if restored is not None else -1)
  if jax.process_index() == 0:
    metrics.write_json(workdir / CONFIG_FILE, json.loads(config.to_json_best_effort()))

  eval_dataset = input_pipeline.eval_dataset(config)  # Built once: it caches decoded images.

  def run_eval(state: TrainState) -> dict[str, float]:
    local = input_pipeline.numpy_batches(eval_dataset, config, config.data.eval_split)
    batches = (sharding.global_batch(b, mesh) for b in local)
    return evaluate.evaluate(eval_step, state.params, state.batch_stats, batches)

  eval_every = eval_interval(config, steps_per_epoch)
  progress = _Progress(total_steps, steps_per_epoch, config.batch_size, start_step)
  logging.info(
    "Training %s (%s) for %d steps (%d per epoch, %d examples) on %d devices, %d processes",
    "+".join(models.names),
    config.mode,
    total_steps,
    steps_per_epoch,
    info.num_train_examples,
    jax.device_count(),
    jax.process_count(),
  )
  train_start = time.perf_counter()
  eval_metrics: dict[str, float] = {}
  batches = input_pipeline.train_batches(config, start_step=start_step)
  finite = _FiniteCheck(ckpt)
  with preemption.StopSignals() as stop:
    for step in range(start_step + 1, total_steps + 1):
      state, step_metrics = train_step(state, sharding.global_batch(next(batches), mesh))
      finite.add(step, step_metrics)
      is_last = step == total_steps
      if step % config.log_every_steps == 0 or is_last:
        scalars = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        scalars.update(progress(step, scalars))
        writer.write(step, {"epoch": step / steps_per_epoch, **scalars})
      if step % eval_every == 0 or is_last:
        finite.now()
        logging.info("Evaluating at step %d.", step)
        eval_metrics = run_eval(state)
        writer.write(step, {"epoch": step / steps_per_epoch, **eval_metrics})
        logging.info(
          "eval step %d: %s",
          step,
          " ".join(f"{k}={v:.4f}" for k, v in eval_metrics.items() if "top1" in k),
        )
      stopping = stop.reached(step) and not is_last
      if is_last or stopping or ckpt.should_save(step):
        finite.now()  # Never save a non-finite state.
        ckpt.save(step, state, force=True)
      if stopping:
        writer.flush()
        ckpt.close()
        writer.close()
        raise preemption.Preempted(stop.received, step, str(ckpt.step_dir(step)))
  writer.flush()
  ckpt.wait()

  if not eval_metrics:  # Restarted at the very end (the last checkpoint was the final step).
    eval_metrics = run_eval(state)
  final = {
    "step": int(jnp.asarray(state.step)),
    "epochs": total_steps / steps_per_epoch,
    "mode": config.mode,
    "train_seconds_this_run": time.perf_counter() - train_start,
    # > 0 when this run continued a checkpoint: the time above then covers only this run's steps.
    "resumed_from_step": start_step,
    **{k.replace("eval/", ""): v for k, v in eval_metrics.items()},
  }
  if jax.process_index() == 0:
    metrics.write_json(workdir / FINAL_FILE, final)
  writer.close()
  ckpt.close()
  logging.info("Finished: %s", json.dumps(final))
  return final
