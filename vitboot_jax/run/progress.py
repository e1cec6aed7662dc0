"""What a run prints: one compact line per log step, lines during evaluation, an honest ETA.

Everything else (every loss term, gradient norms, learning rate) goes to metrics.jsonl and
TensorBoard only. The ETA counts the training steps left at the rate of the last RATE_WINDOW_S of
training after the first logged interval (which holds compilation unless `compiled` marked its
end; until a second one, its own rate), so a machine that gets busier or freer mid-run moves the
ETA within minutes, and every evaluation left at the duration of the last one without its first
batch's call (which holds the compilation of a process's first evaluation); before the first
evaluation, an evaluation is estimated at a fixed fraction of the training cost per image (a
fifth, as measured on CPU), and the first one's line says that its compilation comes on top.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from absl import logging

# Of a training image's cost, until an evaluation is measured: not the forward's third of the
# FLOPs, since a training step also pays for augmentation, dropout and the losses
# (docs/performance.md, "ETA").
_EVAL_COST_PER_IMAGE = 1 / 5
EVAL_LOG_SECONDS = 30.0
# The training rate of the ETA: the logged intervals of about the last ten minutes of training.
RATE_WINDOW_S = 600.0


def duration(seconds: float) -> str:
  """'42s', '6m05s', '2h03m'."""
  seconds = max(0, round(seconds))
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def evaluations_after(step: int, total_steps: int, eval_every: int) -> int:
  """Evaluations at steps in (step, total_steps]: every eval_every-th step, and the last."""
  count = total_steps // eval_every - step // eval_every
  return count + (1 if total_steps % eval_every and step < total_steps else 0)


class Progress:
  """Logs progress lines and measures training and evaluation time for the ETA."""

  def __init__(
    self,
    *,
    total_steps: int,
    steps_per_epoch: int,
    batch_size: int,
    start_step: int,
    eval_every: int,
    num_eval_examples: int,
    clock: Callable[[], float] = time.perf_counter,
    log: Callable[..., None] = logging.info,
  ):
    self.total, self.per_epoch, self.batch = total_steps, steps_per_epoch, batch_size
    self.eval_every, self.num_eval = eval_every, num_eval_examples
    self._clock, self._log = clock, log
    self._mark_step, self._mark_time = start_step, clock()
    self._paused = 0.0  # Evaluation seconds inside the current log interval.
    self._first_interval = True  # May hold compilation: left out once others exist.
    # Training since the first interval: (steps, seconds) of the intervals in the rate's window.
    self._window: collections.deque[tuple[int, float]] = collections.deque()
    self._steps, self._seconds = 0, 0.0  # Their sums.
    self._first_rate: float | None = None
    self.eval_seconds: float | None = None  # The last evaluation's, less its first call.
    self._eval_took = 0.0  # The last evaluation's whole duration.
    self._first_call = 0.0  # Its first batch's call: compilation, in a process's first one.
    self.top1: dict[str, float] = {}

  def compiled(self, step: int) -> None:
    """The first call of the run (the steps after `step`) has compiled and is dispatched: the
    first interval's rate starts here, so the first line's ETA is not scaled by compilation."""
    self._mark_step, self._mark_time, self._paused = step, self._clock(), 0.0

  def seconds_per_step(self) -> float | None:
    if self._steps:
      return self._seconds / self._steps
    return None if self._first_rate is None else 1.0 / self._first_rate

  def _eval_estimate(self) -> float:
    if self.eval_seconds is not None:
      return self.eval_seconds
    per_step = self.seconds_per_step() or 0.0
    return per_step / self.batch * self.num_eval * _EVAL_COST_PER_IMAGE

  def eta(self, step: int, *, evaluated: bool = False) -> float:
    """Seconds left once step `step` has trained: the steps and evaluations still to come, the
    evaluation at `step` itself included unless `evaluated`."""
    per_step = self.seconds_per_step() or 0.0
    evals = evaluations_after(step, self.total, self.eval_every)
    if not evaluated and (step % self.eval_every == 0 or step == self.total):
      evals += 1
    return (self.total - step) * per_step + evals * self._eval_estimate()

  def step(self, step: int, scalars: Mapping[str, float]) -> dict[str, float]:
    """Logs the line of a log step; returns the throughput for the metrics."""
    now = self._clock()
    seconds = max(now - self._mark_time - self._paused, 1e-9)
    rate = (step - self._mark_step) / seconds
    if self._first_interval:
      self._first_rate, self._first_interval = rate, False
    else:
      self._window.append((step - self._mark_step, seconds))
      self._steps += step - self._mark_step
      self._seconds += seconds
      # Keep just enough of the latest intervals to span RATE_WINDOW_S.
      while self._seconds - self._window[0][1] >= RATE_WINDOW_S:
        old_steps, old_seconds = self._window.popleft()
        self._steps -= old_steps
        self._seconds -= old_seconds
    self._mark_step, self._mark_time, self._paused = step, now, 0.0
    losses = _by_model(scalars, "train/loss_")
    line = f"step {step}/{self.total} ep {step / self.per_epoch:.2f}"
    if losses:  # Each model's weighted sum of its terms (CE, KD, feature, DrLoc): its total.
      line += "  total loss " + " ".join(f"{k} {v:.3f}" for k, v in losses.items())
    if self.top1:
      line += "  top-1 " + _percentages(self.top1, digits=1)
    self._log("%s  %.0f img/s  ETA %s", line, rate * self.batch, duration(self.eta(step)))
    return {"train/img_per_s": rate * self.batch}

  @contextlib.contextmanager
  def evaluating(self, step: int) -> Iterator[None]:
    """Times an evaluation at `step` (kept out of the training rate)."""
    start = self._clock()
    self._eval_step, self._eval_start, self._first_call = step, start, 0.0
    # Before one is measured, the estimate leaves out what only the first pays (compilation).
    first = " plus compilation, the first time" if self.eval_seconds is None else ""
    self._log("Evaluating at step %d (about %s%s).", step, duration(self._eval_estimate()), first)
    yield
    self._eval_took = self._clock() - start
    self._paused += self._eval_took
    self.eval_seconds = self._eval_took - self._first_call

  def eval_batches(self, batches: Iterable, num_batches: int) -> Iterator:
    """Passes `batches` through, logging a line every EVAL_LOG_SECONDS of the evaluation."""
    last = self._clock()
    for i, batch in enumerate(batches):
      now = self._clock()
      if i and now - last >= EVAL_LOG_SECONDS:
        last = now
        elapsed = now - self._eval_start
        left = (elapsed - self._first_call) / i * max(num_batches - i, 0)
        if self.eval_seconds is not None:  # Batches do not cost alike; the last run's time holds.
          left = max(left, self.eval_seconds - elapsed)
        after = self.eta(self._eval_step, evaluated=True)  # What follows this evaluation.
        self._log(
          "evaluating at step %d: batch %d/%d  ETA %s",
          self._eval_step,
          i,
          num_batches,
          duration(left + after),
        )
      handed = self._clock()
      yield batch
      if i == 0:  # The consumer asks for batch 1 once batch 0's call has compiled and dispatched.
        self._first_call = self._clock() - handed

  def evaluated(self, step: int, eval_metrics: Mapping[str, float]) -> None:
    """Logs the evaluation's top-1 and remembers it for the following lines."""
    self.top1 = _by_model(eval_metrics, "eval/top1_")
    val = _by_model(eval_metrics, "val/top1_")
    self._log(
      "eval at step %d: top-1 %s%s (%s)",
      step,
      _percentages(self.top1),
      f", validation {_percentages(val)}" if val else "",
      duration(self._eval_took),
    )


def final_line(final: Mapping[str, float]) -> str:
  """What a finished run's final.json says: its last step and each model's top-1."""
  top1 = _percentages(_by_model(final, "top1_"))
  val = _percentages(_by_model(final, "val_top1_"))
  val = f" (validation {val})" if val else ""
  return f"Final top-1 (step {final.get('step', '?')}): {top1 or 'none recorded'}{val}."


def _percentages(by_model: Mapping[str, float], digits: int = 2) -> str:
  return " ".join(f"{k} {100 * v:.{digits}f}%" for k, v in by_model.items())


def _by_model(scalars: Mapping[str, float], prefix: str) -> dict[str, float]:
  return {k.removeprefix(prefix): v for k, v in sorted(scalars.items()) if k.startswith(prefix)}
