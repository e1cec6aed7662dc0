"""The run's outputs in its workdir: metrics.jsonl, TensorBoard events and JSON summaries.

`metrics.jsonl` is the machine-readable record the tools read (one `{"step": N, ...}` object a
line); TensorBoard gets the same scalars as event files written with the `tensorboard` package's
record writer, which needs no TensorFlow (without that package: metrics.jsonl alone, said once).
Only process 0 writes files, so a pod run leaves one copy. A run killed after its last
checkpoint leaves lines that its resumed run will write again: `truncate_after(restored_step)`
drops them first, so no step appears twice.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath

from vitboot_jax.base import errors, files

try:  # TensorFlow-free: clu's writer would import TensorFlow.
  from tensorboard.compat import tf as tb_tf
  from tensorboard.compat.proto import (
    event_pb2,
    summary_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
  )
  from tensorboard.summary.writer.record_writer import RecordWriter
except ImportError:
  RecordWriter = None

METRICS_FILE = "metrics.jsonl"


# On an object store every flush rewrites the whole object, so lines are buffered and flushed in
# chunks: after an evaluation, before a line past a checkpoint step, at flush(), and at least
# this often, which bounds what a kill can lose.
REMOTE_FLUSH_SECONDS = 30.0


class _RemoteLines:
  """metrics.jsonl on an object store: appended lines kept in memory and written in chunks.

  The file is read once (at the first flush); each flush writes the known text plus the new
  lines, so a run's writes cost O(flushes x size), never a read and a rewrite per line.
  """

  def __init__(self, path: epath.Path, flush_every_steps: int | None):
    self._path = path
    self._every = flush_every_steps
    self._text: str | None = None
    self._pending: list[tuple[int, str]] = []
    self._since = time.monotonic()

  def reset(self, text: str) -> None:
    """The file's content as just written (by truncate_after)."""
    self._text, self._pending = text, []

  def append(self, step: int, line: str, *, boundary: bool) -> None:
    every = self._every
    if every and self._pending and (step - 1) // every > (self._pending[0][0] - 1) // every:
      self.flush()  # Lines up to a checkpoint step are on disk before the run moves past it.
    if not self._pending:
      self._since = time.monotonic()
    self._pending.append((step, line))
    due = boundary or (every and step % every == 0)
    if due or time.monotonic() - self._since >= REMOTE_FLUSH_SECONDS:
      self.flush()

  def flush(self) -> None:
    if not self._pending:
      return
    if self._text is None:
      self._text = self._path.read_text() if self._path.exists() else ""
    self._text += "".join(line for _, line in self._pending)
    files.write_atomically(self._path, self._text)
    self._pending = []


def _json_default(obj: Any) -> Any:
  """Lets numpy/jax values and paths into JSON without the caller converting them."""
  if hasattr(obj, "__array__"):
    return np.asarray(obj).tolist()
  if isinstance(obj, os.PathLike):
    return os.fspath(obj)
  raise TypeError(f"Object of type {type(obj).__name__} is not JSON serialisable: {obj!r}")


def write_json(path: epath.PathLike, obj: Any) -> None:
  """Writes `obj` as indented JSON, atomically (e.g. config.json, final.json).

  Writes from whichever process calls it; call it on process 0 only in multi-host runs.
  """
  files.write_atomically(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def _to_number(name: str, value: Any) -> int | float:
  """A Python int or float from a Python, numpy or (replicated) jax scalar."""
  array = np.asarray(value)
  if array.size != 1:
    raise ValueError(f"Metric {name!r} must be a scalar, got shape {array.shape}.")
  if np.issubdtype(array.dtype, np.bool_) or np.issubdtype(array.dtype, np.integer):
    return int(array.reshape(()))
  if np.issubdtype(array.dtype, np.floating):
    return float(array.reshape(()))
  raise TypeError(f"Metric {name!r} must be a real number, got dtype {array.dtype}.")


def read_metrics(workdir: epath.PathLike) -> list[dict[str, Any]]:
  """All records of `<workdir>/metrics.jsonl` in file order; [] if there is none yet."""
  return files.read_jsonl(epath.Path(workdir) / METRICS_FILE)


# TensorBoard sees new scalars at least this often (its writer's own default interval).
EVENTS_FLUSH_SECONDS = 120.0
# Numbers this process's event files, so two opened in one second never share a name ("wb" would
# truncate the first).
_EVENT_FILES = itertools.count()


@contextlib.contextmanager
def _naming_event_file(path: str) -> Iterator[None]:
  """TensorBoard writes through TensorFlow's file API where TensorFlow is installed; its errors
  (a full disk is a ResourceExhaustedError) become OSErrors naming the event file, as ours are."""
  try:
    with files.naming(path):
      yield
  except OSError:
    raise
  except Exception as error:
    if not type(error).__module__.startswith("tensorflow"):
      raise
    code = next((c for c in files.WRITE_FIXES if os.strerror(c) in str(error)), None)
    if code is None:
      raise OSError(errno.EIO, errors.first_line(error), path) from error
    raise OSError(code, os.strerror(code), path) from error


class _EventWriter:
  """TensorBoard scalars (the scalars plugin's float tensors, as tf.summary.scalar writes them).

  Records are written in the caller's thread with tensorboard's record format: its
  EventFileWriter writes from a thread of its own, where a failed write (a full disk) prints a
  traceback instead of reaching the run's one-line ending.
  """

  def __init__(self, logdir: str):
    stamp, host, number = int(time.time()), socket.gethostname(), next(_EVENT_FILES)
    name = f"events.out.tfevents.{stamp:010d}.{host}.{os.getpid()}.{number}"
    self._file = os.path.join(logdir, name)
    with _naming_event_file(self._file):
      tb_tf.io.gfile.makedirs(logdir)
      self._records = RecordWriter(tb_tf.io.gfile.GFile(self._file, "wb"))
    self._metadata = summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    )
    version = event_pb2.Event(
      wall_time=time.time(),
      file_version="brain.Event:2",
      source_metadata=event_pb2.SourceMetadata(writer="vitboot_jax"),
    )
    self._add(version)
    self.flush()

  def _add(self, event: event_pb2.Event) -> None:
    with _naming_event_file(self._file):
      self._records.write(event.SerializeToString())

  def write_scalars(self, step: int, values: Mapping[str, int | float]) -> None:
    summary = summary_pb2.Summary(
      value=[
        summary_pb2.Summary.Value(
          tag=name,
          metadata=self._metadata,
          tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
            float_val=[float(value)],
          ),
        )
        for name, value in values.items()
      ]
    )
    self._add(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    if time.monotonic() - self._flushed >= EVENTS_FLUSH_SECONDS:
      self.flush()

  def flush(self) -> None:
    with _naming_event_file(self._file):
      self._records.flush()
    self._flushed = time.monotonic()

  def close(self) -> None:
    with _naming_event_file(self._file):
      self._records.flush()
      self._records.close()


class _NoEvents:
  def write_scalars(self, step: int, values: Mapping[str, int | float]) -> None:
    pass

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass


class MetricWriter:
  """Writes scalars per step to metrics.jsonl and to TensorBoard event files in `workdir`."""

  def __init__(
    self,
    workdir: epath.PathLike,
    *,
    asynchronous: bool = True,
    flush_every_steps: int | None = None,
  ):
    """Opens the writers; only process 0 writes files.

    Args:
      workdir: The run's directory; created if missing.
      asynchronous: Unused (kept for callers): events are written in the caller's thread.
      flush_every_steps: The checkpoint interval: on an object store, metrics.jsonl is flushed
        at these steps (and after evaluations, at flush(), every REMOTE_FLUSH_SECONDS), so lines
        up to a saved step survive a kill. Local files get every line at once.
    """
    self._workdir = epath.Path(workdir)
    self._path = self._workdir / METRICS_FILE
    self._is_writer = jax.process_index() == 0
    self._remote = (
      None if files.is_local(self._path) else _RemoteLines(self._path, flush_every_steps)
    )
    if self._is_writer:
      self._workdir.mkdir(parents=True, exist_ok=True)
    # No LoggingWriter: the console gets progress.py's compact line, not every scalar.
    del asynchronous
    self._writer = _NoEvents()
    if self._is_writer and RecordWriter is None:
      logging.info("No `tensorboard` package: metrics go to %s alone.", self._path)
    elif self._is_writer:
      self._writer = _EventWriter(os.fspath(self._workdir))

  @property
  def path(self) -> epath.Path:
    return self._path

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records `scalars` (names to scalar numbers) at `step`; call it on every process."""
    if "step" in scalars:
      raise ValueError("'step' is reserved for the step number; rename that metric.")
    values = {name: _to_number(name, value) for name, value in scalars.items()}
    step = int(step)
    if self._is_writer:
      # NaN/Infinity are written as JSON's common extension; Python's json reads them back.
      line = json.dumps({"step": step, **values}) + "\n"
      if self._remote is None:
        files.append_text(self._path, line)
      else:
        evaluated = any(name.startswith("eval/") for name in values)
        self._remote.append(step, line, boundary=evaluated)
    self._writer.write_scalars(step, values)

  def truncate_after(self, step: int) -> int:
    """Drops records with step > `step` (written after the checkpoint a run resumes from).

    Call it at start-up with the restored step, or -1 when starting from scratch.
    Returns the number of records dropped.
    """
    if not self._is_writer or not self._path.exists():
      return 0
    if self._remote is not None:
      self._remote.flush()
    text = self._path.read_text()
    records = files.parse_jsonl(text, self._path)
    kept = [r for r in records if r["step"] <= step]
    torn = bool(text) and not text.endswith("\n")
    if len(kept) != len(records) or torn:
      text = "".join(json.dumps(r) + "\n" for r in kept)
      files.write_atomically(self._path, text)
      logging.info(
        "Dropped %d records after step %d from %s.", len(records) - len(kept), step, self._path
      )
    if self._remote is not None:
      self._remote.reset(text)
    return len(records) - len(kept)

  def flush(self) -> None:
    if self._remote is not None:
      self._remote.flush()
    self._writer.flush()

  def close(self) -> None:
    if self._remote is not None:
      self._remote.flush()
    self._writer.close()

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()
