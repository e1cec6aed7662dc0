"""Library chatter kept off the console: TensorFlow's C++ start-up lines and orbax, tfds and JAX
INFO logs (warnings and errors still show), and TensorFlow imported without them and with its GPUs
hidden, since it is only ever the input pipeline; and the tracebacks orbax, tensorstore and
asyncio print for a failed save or restore that the checkpoint modules say in one line: only
those, held while our save or restore is outstanding and dropped when we raise its failure, so an
orbax error we did not report still shows.
"""

from __future__ import annotations

import contextlib
import importlib
import logging as logging_lib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from absl import logging

_TF_STARTUP_CHATTER = ("WARNING: All log messages before absl::InitializeLog()",)


_NOISY_PATHS = ("/orbax/", "/tensorflow_datasets/", "/jax/_src/xla_bridge.py")


class _QuietLibraries(logging_lib.Filter):
  """Drops INFO chatter of orbax and tfds (every checkpoint logs ~20 lines) and JAX's backend
  probing ("Unable to initialize backend 'tpu'" on every CPU run); keeps warnings."""

  def filter(self, record: logging_lib.LogRecord) -> bool:
    noisy = any(part in record.pathname for part in _NOISY_PATHS)
    if noisy and "read only" in record.getMessage().replace("read_only", "read only"):
      return False  # orbax's notes on a read-only checkpoint: what the tools ask for.
    return record.levelno >= logging_lib.WARNING or not noisy


def libraries() -> None:
  """Keeps orbax's, tfds' and JAX's backend-probing INFO logs off the console (absl's handler)
  and TensorFlow's C++ INFO logs off stderr; warnings stay. Call it before JAX starts a backend
  (main and every tool)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _QuietLibraries) for f in handler.filters):
    handler.addFilter(_QuietLibraries())


def import_tensorflow():
  """Imports TensorFlow without its C++ INFO start-up lines (printed once per loaded library),
  with its GPUs hidden: it is only the input pipeline and must never take memory JAX needs."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  if "tensorflow" not in sys.modules:
    _import_quietly("tensorflow")
  tf = sys.modules["tensorflow"]
  try:
    tf.config.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError):  # Its devices are already initialised: nothing to change.
    pass
  return tf


def _import_quietly(name: str) -> None:
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      importlib.import_module(name)
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      for line in captured.read().decode(errors="replace").splitlines(keepends=True):
        if not (line.startswith(_TF_STARTUP_CHATTER) or line[:1] == "I" and line[1:5].isdigit()):
          sys.stderr.write(line)
      sys.stderr.flush()


class _HeldFailures:
  """The library failure reports held while our checkpoint calls are outstanding.

  A report is held from when it is logged until the last outstanding call settles: dropped if a
  call failed (its error, which we raise, says it in one line), shown otherwise. Reports of work
  abandoned by a failure (asyncio's futures, orbax's coroutines, collected later, often at exit)
  are dropped once a failure was reported and shown before.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._outstanding = 0
    self._held: list[Any] = []
    self._reported = False

  def hold(self) -> None:
    with self._lock:
      self._outstanding += 1

  def settle(self, reported: bool) -> list[Any]:
    """Ends one outstanding call; returns the reports to show now."""
    with self._lock:
      self._outstanding -= 1
      if reported:
        self._reported = True
        self._held.clear()
      if self._outstanding or not self._held:
        return []
      shown, self._held = self._held, []
    return shown

  def takes(self, report: Any, leftover: bool) -> bool:
    """Whether `report` is kept off the console now (held, or a reported failure's leftover)."""
    with self._lock:
      if self._outstanding:
        self._held.append(report)
        return True
      return leftover and self._reported


_FAILURES = _HeldFailures()


class _QuietLibraryFailures(logging_lib.Filter):
  """Holds orbax's ERROR records (and asyncio's unretrieved-future reports) per _HeldFailures
  unless absl logs at debug level."""

  def filter(self, record: logging_lib.LogRecord) -> bool:
    if record.levelno < logging_lib.ERROR or logging.level_debug():
      return True
    if "/orbax/" in record.pathname.replace(os.sep, "/"):
      return not _FAILURES.takes(record, leftover=False)
    if record.name == "asyncio" and "exception was never retrieved" in str(record.msg):
      return not _FAILURES.takes(record, leftover=True)
    return True


def quiet_library_failures() -> None:
  """Installs the filter above on absl's handler and the hook below (once each)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _QuietLibraryFailures) for f in handler.filters):
    handler.addFilter(_QuietLibraryFailures())
  if not getattr(sys.unraisablehook, "_vitboot_quiet", False):
    sys.unraisablehook = _quiet_unraisable_hook(sys.unraisablehook)


def hold_library_failures() -> None:
  """Opens one outstanding call: orbax's failure reports are held until it is settled."""
  quiet_library_failures()
  _FAILURES.hold()


def settle_library_failures(reported: bool) -> None:
  """Closes one call opened by hold_library_failures: `reported` when we raised its failure in
  one line (the reports held are dropped), else they are shown once no call is outstanding."""
  for report in _FAILURES.settle(reported):  # Through the filter and hook again: none holds now.
    if isinstance(report, logging_lib.LogRecord):
      logging.get_absl_handler().handle(report)
    else:
      sys.unraisablehook(report)


@contextlib.contextmanager
def library_failures_held() -> Iterator[None]:
  """A call of ours whose failures we raise in one line: an exception leaving the block is one."""
  hold_library_failures()
  reported = True
  try:
    yield
    reported = False
  finally:
    settle_library_failures(reported)


def _quiet_unraisable_hook(previous: Any) -> Any:
  """A failed save or restore abandons orbax's pending reads and writes: when collected (often at
  exit) each prints a traceback, dozens per failure, as does every read that finds its event loop
  closed. Those are held per _HeldFailures (at debug level, shown); anything else to `previous`."""

  def hook(unraisable: Any) -> None:
    value = unraisable.exc_value
    closed_loop = isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
    if (closed_loop or _raised_in_orbax(unraisable)) and not logging.level_debug():
      if _FAILURES.takes(_kept(unraisable), leftover=True):
        return None
    return previous(unraisable)

  hook._vitboot_quiet = True
  return hook


def _kept(unraisable: Any) -> Any:
  """`unraisable` to report later, its object named but not kept (it is being finalised, and
  keeping it would revive it)."""
  what = unraisable.err_msg or "Exception ignored in"
  if unraisable.object is not None:
    what = f"{what}: {unraisable.object!r}"
  fields = (unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback, what, None)
  return type(unraisable)(fields)


def _raised_in_orbax(unraisable: Any) -> bool:
  code = getattr(unraisable.object, "cr_code", None)  # An abandoned coroutine of orbax's.
  if code is not None and "/orbax/" in code.co_filename.replace(os.sep, "/"):
    return True
  tb = unraisable.exc_traceback
  while tb is not None:
    if "/orbax/" in tb.tb_frame.f_code.co_filename.replace(os.sep, "/"):
      return True
    tb = tb.tb_next
  return False
