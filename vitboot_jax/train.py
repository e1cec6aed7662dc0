"""Training loop as a library: `train_and_evaluate(config, workdir)`.

One call trains every model of `config.mode`, evaluates them exactly at the end of each epoch
(or every `eval_every_steps`), checkpoints with orbax, and resumes from the newest complete
checkpoint in `workdir` when called again. Outputs in `workdir`: config.json, data.json,
launches.jsonl (each launch's code and library versions), metrics.jsonl, TensorBoard events,
checkpoints/, final.json (final-epoch top-1/top-5 of every model, which is what the paper
reports, and the finishing launch's commit).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from vitboot_jax import configlib, evaluate, sharding
from vitboot_jax import trainer as trainer_lib
from vitboot_jax.checkpoint import checkpointer, failures
from vitboot_jax.cpu import host_memory
from vitboot_jax.data import loop_feed, workdir_record
from vitboot_jax.run import (
  metrics,
  preemption,
  progress,
  provenance,
  startup,
  workdir_claim,
  workdir_rules,
)
from vitboot_jax.state import TrainState


def eval_interval(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  """Steps between evaluations (the last step is always evaluated as well)."""
  if config.eval_every_steps > 0:
    return config.eval_every_steps
  return steps_per_epoch * config.eval_every_epochs


class NonFiniteError(FloatingPointError):
  """A loss or gradient norm became NaN or infinite; nothing after the last good save is kept."""


class WriteError(OSError):
  """Writing a run's own file (metrics, config, results) failed: full disk, permissions; the
  complete checkpoints are intact and the message names the fix."""


# Step metrics that are not loss terms or gradient norms, so they need not be finite.
_NOT_CHECKED = ("train/lr", "train/feature_weight", "train/align_")


def call_length(step: int, steps_per_call: int, total_steps: int, *intervals: int) -> int:
  """How many steps the call after `step` runs: steps_per_call, or 1 where total_steps or the
  next multiple of a positive interval (evaluations, checkpoints) comes sooner, so those land on
  the same steps as with one step a call, and a run compiles two calls, not one per remainder."""
  end = min(step + steps_per_call, total_steps)
  for every in intervals:
    if every > 0:
      end = min(end, (step // every + 1) * every)
  return steps_per_call if end - step == steps_per_call else 1


def _step_values(call_metrics: dict[str, Any], index: int) -> dict[str, float]:
  """Step `index` of a call's fetched metrics (scalars of one step or stacked [n] of n)."""
  return {k: float(np.atleast_1d(v)[index]) for k, v in call_metrics.items()}


class _FiniteCheck:
  """Stops at the first non-finite loss or gradient norm, one call behind the device.

  Reading call c's scalars while call c+1 runs keeps the device busy; `check_pending()` checks
  the newest call before anything is saved, so a non-finite state is never written.
  """

  def __init__(self, ckpt: checkpointer.Checkpointer):
    self._ckpt = ckpt
    self._pending: tuple[int, int, dict[str, jax.Array]] | None = None

  def add(self, first_step: int, num_steps: int, call_metrics: dict[str, jax.Array]) -> None:
    """Checks the previous call, then queues the metrics of steps first_step, ... (one call)."""
    self.check_pending()
    checked = {k: v for k, v in call_metrics.items() if not k.startswith(_NOT_CHECKED)}
    self._pending = (first_step, num_steps, checked)

  def check_pending(self) -> None:
    """Checks the queued call's metrics now, waiting for them; raises NonFiniteError."""
    if self._pending is None:
      return
    first_step, num_steps, pending = self._pending
    self._pending = None
    fetched = {k.removeprefix("train/"): v for k, v in jax.device_get(pending).items()}
    for index in range(num_steps):  # The first bad step of the call is the one to report.
      values = _step_values(fetched, index)
      bad = sorted(k for k, v in values.items() if not np.isfinite(v))
      if bad:
        step = first_step + index
        break
    else:
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


def _evaluation_missing(workdir: epath.Path, step: int, eval_every: int, total_steps: int) -> bool:
  """Whether the restored `step` is an evaluation step whose evaluation was cut short.

  Only a single-process run stops mid-evaluation (preemption.StopSignals.interrupting), and
  only process 0 reads its own metrics file, so multi-process runs never ask.
  """
  if step == 0 or step == total_steps or step % eval_every or jax.process_count() > 1:
    return False
  records = metrics.read_metrics(workdir)
  return not any(r["step"] == step and any(k.startswith("eval/") for k in r) for r in records)


class _Loop:
  """What the loop does besides the steps: logs, evaluates, checks finiteness, saves and stops."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    feed: loop_feed.Feed,
    trainer: trainer_lib.Trainer,
    ckpt: checkpointer.Checkpointer,
    writer: metrics.MetricWriter,
    progress_log: progress.Progress,
  ):
    self._config, self._feed, self._trainer = config, feed, trainer
    self._ckpt, self._writer, self._progress = ckpt, writer, progress_log
    self._per_epoch, self._total = progress_log.per_epoch, progress_log.total
    counts = {"eval": feed.info.num_eval_examples, "val": feed.info.num_val_examples}
    self._num_eval_batches = {
      part: -(-counts[part] // config.data.eval_batch_size) for part in loop_feed.eval_parts(config)
    }
    self._finite = _FiniteCheck(ckpt)
    self._dispatched = False

  def check_and_log(self, first: int, last: int, call_metrics: dict[str, jax.Array]) -> None:
    """Queues the finite check of steps first..last (one call) and logs those due a line."""
    if not self._dispatched:  # The call returned once compiled: time the steps from here.
      self._progress.compiled(first - 1)
      self._dispatched = True
    self._finite.add(first, last - first + 1, call_metrics)
    every = self._config.log_every_steps
    logged = [s for s in range(first, last + 1) if s % every == 0 or s == self._total]
    if not logged:
      return
    fetched = jax.device_get(call_metrics)
    # The throughput is measured once a call: its steps finish together.
    rate = self._progress.step(logged[-1], _step_values(fetched, logged[-1] - first))
    for s in logged:
      scalars = _step_values(fetched, s - first)
      self._writer.write(s, {"epoch": s / self._per_epoch, **scalars, **rate})

  def evaluate(
    self, step: int, state: TrainState, stop: preemption.StopSignals | None = None
  ) -> dict[str, float]:
    """Evaluates `state` (of step `step`) on the test split ("eval/..." metrics) and on the
    validation split where there is one ("val/..."); a signal to `stop` raises
    EvaluationInterrupted."""
    in_flight = self._trainer.models.kernels.eval_batches_in_flight
    out: dict[str, float] = {}
    with self._progress.evaluating(step):
      for part, num_batches in self._num_eval_batches.items():
        batches = self._progress.eval_batches(self._feed.eval_batches(part), num_batches)
        if stop is not None:
          batches = stop.interrupting(batches)
        measured = evaluate.evaluate(
          self._trainer.eval_step, state.params, state.batch_stats, batches, in_flight
        )
        out.update({k.replace("eval/", f"{part}/", 1): v for k, v in measured.items()})
    return out

  def evaluate_and_log(
    self,
    step: int,
    state: TrainState,
    stop: preemption.StopSignals | None,
    *,
    saved: bool = False,
  ) -> dict[str, float]:
    """Evaluates and logs step `step`. A signal to `stop` during it saves the step (unless
    already `saved`) and raises preemption.Preempted: the evaluation runs again on resume."""
    self._finite.check_pending()
    try:
      eval_metrics = self.evaluate(step, state, stop)
    except preemption.EvaluationInterrupted:
      if not saved:
        self._ckpt.save(step, state, force=True)  # Checked finite before the evaluation.
      logging.warning("The evaluation of step %d stopped early; it runs again on resume.", step)
      raise self.stopped(stop, step) from None
    self._writer.write(step, {"epoch": step / self._per_epoch, **eval_metrics})
    self._progress.evaluated(step, eval_metrics)
    return eval_metrics

  def save(self, step: int, state: TrainState) -> None:
    self._finite.check_pending()  # Never save a non-finite state.
    self._ckpt.save(step, state, force=True)

  def stopped(self, stop: preemption.StopSignals, step: int) -> preemption.Preempted:
    """Closes the writers once `step` is saved; main turns the exception into the exit."""
    self._writer.flush()
    self._ckpt.close()
    self._writer.close()
    return preemption.Preempted(stop.received, step, str(self._ckpt.step_dir(step)))


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, *, checked: bool = False
) -> dict[str, Any]:
  """Trains and evaluates `config` in `workdir`; returns the final metrics (final.json).

  `checked`: the caller (main, before loading JAX) already ran startup.check for this config
  and workdir; only the device count is left to check. Library callers leave it False.
  """
  workdir = epath.Path(workdir)
  if checked:
    configlib.check_devices(config, jax.device_count())
  else:
    single_process = jax.process_count() == 1
    num_devices = jax.device_count()
    final = startup.check(config, workdir, single_process=single_process, num_devices=num_devices)
    if final is not None:
      return final
  # Nothing was written to the workdir before these checks passed (the Checkpointer creates it).
  claim = workdir_claim.acquire_for_run(workdir)  # One run per workdir: a second one stops here.
  try:
    final = _train(config, workdir, claim)
  except BaseException:
    # A run that raised in a live process (a notebook, a caller's loop) lets go of the workdir,
    # so the next launch from anywhere finds it free; a multi-process run ends its processes.
    if jax.process_count() == 1:
      claim.release_after_failure()
    raise
  claim.release()
  logging.info("Finished: %s", json.dumps(final))
  return final


def _train(
  config: ml_collections.ConfigDict, workdir: epath.Path, claim: workdir_claim.RunClaim
) -> dict[str, Any]:
  """The run itself, in the workdir `claim` holds: returns what final.json records."""
  mesh = sharding.make_mesh()
  feed = loop_feed.open_feed(
    config, mesh
  )  # What each jitted call takes: host batches or device data.
  info = feed.info
  data_record = workdir_record.data_fingerprint(config, info)
  workdir_rules.check_data(workdir, data_record)  # No resume on other data.
  feed.check_eval_split()  # Bad test images fail now.
  steps_per_epoch = info.steps_per_epoch
  trainer = trainer_lib.build(config, mesh, steps_per_epoch)
  total_steps = trainer.total_steps

  ckpt = checkpointer.Checkpointer(
    workdir, keep=config.keep_checkpoints, save_every_steps=config.checkpoint_every_steps
  )
  claim.settle_first(ckpt.close)  # A save still writing lands before the workdir is let go.
  restored = ckpt.restore_latest(trainer.abstract_state)
  if restored is None:
    state: TrainState = trainer.initial_state()
    start_step = 0
  else:
    state, start_step = restored
    logging.info("Resuming from the checkpoint of step %d in %s", start_step, ckpt.directory)

  writer = metrics.MetricWriter(workdir, flush_every_steps=config.checkpoint_every_steps)
  writer.truncate_after(start_step if restored is not None else -1)
  # 0 ("the platform's choice") resolved: the log line and config.json say what the calls run.
  steps_per_call = configlib.steps_per_call(config, mesh.devices.flat[0].platform)
  run_code = None
  if jax.process_index() == 0:
    recorded = json.loads(config.to_json_best_effort())
    recorded["steps_per_call"] = steps_per_call
    if restored is None:  # What a resume started from stays as its fresh start recorded it.
      sources = startup.source_warnings(config)
    else:
      sources = workdir_rules.saved_config(workdir).get(workdir_rules.SOURCE_WARNINGS, [])
    if sources:
      recorded[workdir_rules.SOURCE_WARNINGS] = sources
    metrics.write_json(workdir / workdir_rules.CONFIG_FILE, recorded)
    metrics.write_json(workdir / workdir_rules.DATA_FILE, data_record)
    # Which code and libraries ran each part of the run, so a result can name its own commit.
    run_code = provenance.record_launch(
      workdir,
      start_step=start_step,
      steps_per_call=steps_per_call,
      backend=jax.default_backend(),
      devices=jax.device_count(),
      processes=jax.process_count(),
      # A CPU step's speed depends on it (docs/performance.md, "The allocator").
      host_allocator=host_memory.description(),
    )["code"]

  eval_every = eval_interval(config, steps_per_epoch)
  progress_log = progress.Progress(
    total_steps=total_steps,
    steps_per_epoch=steps_per_epoch,
    batch_size=config.batch_size,
    start_step=start_step,
    eval_every=eval_every,
    num_eval_examples=info.num_eval_examples + info.num_val_examples,
  )
  loop = _Loop(config, feed, trainer, ckpt, writer, progress_log)
  logging.info("Data: %s.", data_record["summary"])
  logging.info(
    "Training %s (%s) for %d steps (%d per epoch, %d examples, up to %d a call) on %d devices, "
    "%d processes",
    "+".join(trainer.models.names),
    config.mode,
    total_steps,
    steps_per_epoch,
    info.num_train_examples,
    steps_per_call,
    jax.device_count(),
    jax.process_count(),
  )
  train_start = time.perf_counter()
  with _writes_named(workdir, ckpt):
    eval_metrics: dict[str, float] = {}
    next_input = feed.train(start_step)
    with preemption.StopSignals() as stop:
      if _evaluation_missing(workdir, start_step, eval_every, total_steps):
        # A stop signal cut this step's evaluation short: it was saved unevaluated.
        eval_metrics = loop.evaluate_and_log(start_step, state, stop, saved=True)
      step, calls = start_step, start_step
      while step < total_steps:
        # One jitted call runs steps first..step; it ends on every evaluation and checkpoint step.
        n = call_length(
          step, steps_per_call, total_steps, eval_every, config.checkpoint_every_steps
        )
        first, step, calls = step + 1, step + n, calls + 1
        call = trainer.train_step if n == 1 else trainer.multi_step(n)
        state, call_metrics = call(state, next_input(n))
        loop.check_and_log(first, step, call_metrics)
        is_last = step == total_steps
        if step % eval_every == 0 or is_last:
          # The final evaluation always finishes: final.json needs it.
          eval_metrics = loop.evaluate_and_log(step, state, None if is_last else stop)
        stopping = stop.reached(calls) and not is_last  # Within one call of the signal.
        if is_last or stopping or ckpt.should_save(step):
          loop.save(step, state)
        if stopping:
          raise loop.stopped(stop, step)
    writer.flush()
    ckpt.wait()

    if not eval_metrics:  # Restarted at the very end (the last checkpoint was the final step).
      eval_metrics = loop.evaluate(total_steps, state)
    final = {
      "step": int(jnp.asarray(state.step)),
      "epochs": total_steps / steps_per_epoch,
      "mode": config.mode,
      "train_seconds_this_run": time.perf_counter() - train_start,
      # > 0 when this run continued a checkpoint: the time above then covers only this run's steps.
      "resumed_from_step": start_step,
      "code": run_code,  # This launch's (launches.jsonl holds every launch's).
      **{k.replace("eval/", ""): v for k, v in eval_metrics.items() if k.startswith("eval/")},
      # The validation split's, where the config has one: what choices among runs read.
      **{k.replace("/", "_", 1): v for k, v in eval_metrics.items() if k.startswith("val/")},
    }
  failure = None
  if jax.process_index() == 0:
    try:
      with _writes_named(workdir, ckpt):
        metrics.write_json(workdir / workdir_rules.FINAL_FILE, final)
    except WriteError as error:
      failure = error
  # Process 0 alone writes final.json: every process learns how that went before any leaves.
  failure = failures.agreed("train.final", failure)
  if failure is not None:
    raise failure
  writer.close()
  ckpt.close()
  return final


@contextlib.contextmanager
def _writes_named(workdir: epath.Path, ckpt: checkpointer.Checkpointer) -> Iterator[None]:
  """A failed write of the run's own files is one line; where a background save failed first
  (the disk filled under it), that save is what the line names."""
  try:
    yield
  except OSError as error:
    if not str(error.filename or "").startswith(os.path.join(str(workdir), "")):
      raise  # Not a file of the run (the data, say): its own message stands.
    ckpt.wait()  # Raises the background save's CheckpointSaveError, if it failed.
    raise WriteError(ckpt.write_failure(f"Writing {error.filename}", error)) from error
