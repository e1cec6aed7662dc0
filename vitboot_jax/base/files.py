"""Files written whole: a reader, a kill or a crash never sees half of one.

Every file the package writes and others read while it runs (metrics.jsonl, final.json, the
workdir claim, .npz datasets, exported weights, the impulse-init cache) goes through
`write_atomically` or `replacing`: a temporary file in the same directory, flushed to disk, then
renamed over the target in one step. Paths with a scheme (gs://, via etils/epath) are object
stores, where a rename is a copy: `is_local` tells the callers that must treat them otherwise.
JSON-lines files (metrics.jsonl, launches.jsonl) are read back through `read_jsonl`; local
metrics.jsonl grows by `append_text`. A failed write names its file, so callers can tell the
run's own files from others.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import uuid
from collections.abc import Iterator
from typing import IO, Any

from absl import logging
from etils import epath

# The fix for each way a write fails that the user must mend (one line names it, e.g. a full disk).
WRITE_FIXES = {
  errno.ENOSPC: "Free disk space (or move the workdir to a larger disk)",
  errno.EDQUOT: "Free space within your disk quota",
  errno.EACCES: "Make the workdir writable",
  errno.EPERM: "Make the workdir writable",
  errno.EROFS: "Use a workdir on a writable file system",
}


def is_local(path: epath.PathLike) -> bool:
  """Whether `path` is on a local file system (no scheme such as gs://)."""
  return "://" not in os.fspath(path)


def _temporary_name(path: str) -> str:
  # Hidden, and unique per writer: two processes or threads never share a temporary file.
  head, name = os.path.split(path)
  return os.path.join(head, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def naming(path: epath.PathLike) -> Iterator[None]:
  """Gives an OSError raised in the block `path` as its file name where it has none: a write that
  fails when its buffer is flushed (a full disk, at close or fsync) names no file."""
  try:
    yield
  except OSError as error:
    if error.filename is not None or error.errno is None:
      raise
    raise OSError(error.errno, error.strerror, os.fspath(path)) from error


def append_text(path: epath.PathLike, text: str) -> None:
  """Appends `text` to the local file `path` (object stores cannot append)."""
  with naming(path), open(path, "a", encoding="utf-8") as f:
    f.write(text)


@contextlib.contextmanager
def replacing(path: epath.PathLike, mode: str = "wb") -> Iterator[IO]:
  """A new file (opened with `mode`, "wb" or "w") that replaces the local `path` in one step
  when the block ends; on an error `path` is left as it was and the temporary file removed."""
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = _temporary_name(path)
  try:
    text = {} if "b" in mode else {"encoding": "utf-8"}
    with naming(path), open(tmp, mode.replace("w", "x"), **text) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def write_atomically(path: epath.PathLike, data: str | bytes) -> None:
  """Replaces `path` with `data` in one step; on an object store, a temporary object renamed."""
  if is_local(path):
    with replacing(path, "w" if isinstance(data, str) else "wb") as f:
      f.write(data)
    return
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = epath.Path(_temporary_name(os.fspath(path)))
  if isinstance(data, str):
    tmp.write_text(data)
  else:
    tmp.write_bytes(data)
  tmp.replace(path)


def parse_jsonl(text: str, path: epath.PathLike) -> list[dict[str, Any]]:
  """The records of a JSON-lines file's `text`; a torn last line (a kill mid-write) is dropped."""
  lines = text.splitlines()
  records = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as error:
      if number == len(lines) and not text.endswith("\n"):
        logging.warning("Dropping the unfinished last line of %s: %r", path, line)
        continue
      raise ValueError(f"{path}:{number} is not valid JSON ({error}): {line!r}") from error
  return records


def read_jsonl(path: epath.PathLike) -> list[dict[str, Any]]:
  """All records of the JSON-lines file `path` in file order; [] if there is none yet."""
  path = epath.Path(path)
  if not path.exists():
    return []
  return parse_jsonl(path.read_text(), path)
