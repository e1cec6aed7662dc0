"""Stop requests: SIGTERM (preemption notices, SLURM `--signal`) and SIGINT (Ctrl-C).

The trainer asks `reached(...)` after every jitted call (config.steps_per_call steps); when it
says yes, the trainer saves the call's last step and exits, and re-running the same command
resumes there. A signal during an evaluation (single process) cuts it short: the step is saved
unevaluated and evaluated on resume, so a stop does not wait minutes for an evaluation to end.

Single process: a Python handler records the signal. Multi-process: every process must save the
same step, so the decision comes from JAX's preemption sync service, which catches SIGTERM itself
(on any host) and picks a step all processes reach; SIGINT is re-sent to this process as SIGTERM
so Ctrl-C takes the same agreed path.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import TypeVar

import jax
from absl import logging
from jax.experimental import multihost_utils

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
T = TypeVar("T")


class Preempted(Exception):  # noqa: N818 (not an error: a requested stop)
  """Training stopped on a signal after saving; re-running the same command resumes."""

  def __init__(self, signal_name: str, step: int, checkpoint_dir: str):
    self.signal_name, self.step, self.checkpoint_dir = signal_name, step, checkpoint_dir
    self.exit_code = 128 + getattr(signal, signal_name, signal.SIGTERM)
    super().__init__(
      f"Stopped by {signal_name} after step {step}: checkpoint saved in {checkpoint_dir}. "
      "Re-run the same command to resume."
    )


class EvaluationInterrupted(Exception):  # noqa: N818 (not an error: a requested stop)
  """A stop signal arrived during an evaluation; the step is saved and evaluated on resume."""


class StopSignals:
  """Within `with StopSignals() as stop:`, SIGTERM/SIGINT ask training to stop after a step."""

  def __init__(self):
    self.received: str | None = None
    self._previous: dict[int, object] = {}
    self._multi_process = jax.process_count() > 1

  def __enter__(self) -> StopSignals:
    if threading.current_thread() is not threading.main_thread():
      return self  # Python only delivers signals to the main thread; nothing to install.
    for sig in _SIGNALS:
      if self._multi_process and sig == signal.SIGTERM:
        continue  # JAX's preemption service owns SIGTERM in multi-process runs.
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc_info: object) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def _handle(self, signum: int, frame: FrameType | None) -> None:
    del frame
    name = signal.Signals(signum).name
    if self.received is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt  # A second Ctrl-C: stop now, without the save.
    self.received = name
    logging.warning("Received %s: finishing this step, saving, then exiting.", name)
    if self._multi_process:
      os.kill(os.getpid(), signal.SIGTERM)  # Hand it to JAX's preemption service.

  def interrupting(self, batches: Iterable[T]) -> Iterator[T]:
    """Passes evaluation `batches` through; raises EvaluationInterrupted once a signal arrived.

    Single process only: the processes of a multi-process run must agree on the step to stop
    at, so they finish the evaluation and stop after it.
    """
    for batch in batches:
      if self.received is not None and not self._multi_process:
        raise EvaluationInterrupted(self.received)
      yield batch

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step`; in multi-process runs call it after every training
    call, with `step` growing by one a call (the sync point counts calls)."""
    if not self._multi_process:
      return self.received is not None
    try:
      if multihost_utils.reached_preemption_sync_point(step):
        self.received = self.received or "SIGTERM"
        return True
      return False
    except RuntimeError:  # Preemption service off (jax_enable_preemption_service=False).
      return self.received is not None
