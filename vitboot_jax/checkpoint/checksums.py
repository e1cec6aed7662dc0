"""The integrity record of a checkpoint step: every file's size and CRC32, written by the save
before its commit marker (ChecksummedHandler, the Checkpointer's orbax handler) and checked
before a restore or a tool reads the step. CRC32 catches bit rot, bad copies and partial
overwrites (as TensorFlow's bundles and object stores check theirs); it is not a defence against
deliberate tampering.

A save that records checksums also says so in its item's own metadata (orbax's
`custom_metadata`), so a step whose record was deleted or not copied is damaged, never read
unverified. The flag is kept there because no step can be read without that metadata: no loss
can drop the flag and leave the step readable, as it could a marker file beside the steps; and
it is per step, since a workdir of an older version resumed by this one holds both kinds of
step. Only a step without the flag (saved before records existed) is read unverified, with a
warning.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import zlib
from typing import Any

import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vitboot_jax.base import errors
from vitboot_jax.checkpoint.step_dirs import ITEM

# The size and CRC32 of every file of a step, written before its commit marker.
CHECKSUM_FILE = "checksums.json"
# The key of the item's custom metadata that says the save wrote CHECKSUM_FILE.
RECORDED_KEY = "checksums"

# zlib.crc32 releases the GIL on large buffers: files are checked in parallel, in 8 MiB reads.
_READ_BYTES = 8 << 20

_CHECK_THREADS = 8


class ChecksummedHandler(ocp.StandardCheckpointHandler):
  """Orbax's handler, recording every file's checksum once the item's files are final, and
  flagging in the item's metadata that it does.

  Orbax calls `finalize` on process 0 only, after every process's writes have finished and
  before the commit marker: in the background thread of an asynchronous save.
  """

  async def async_save(self, directory: Any, item=None, save_args=None, args=None) -> Any:
    if args is not None:  # A synchronous `save` runs through here too.
      args = dataclasses.replace(args, custom_metadata=_with_flag(args.custom_metadata))
    return await super().async_save(directory, item, save_args, args)

  def finalize(self, directory: epath.Path) -> None:
    super().finalize(directory)  # Merges the per-process databases: the last write of the item.
    directory = epath.Path(directory)
    # `directory` may still carry orbax's temporary name; it becomes `<step>/<ITEM>`.
    # Before the commit marker: a kill here leaves an incomplete step, which is set aside.
    record(directory, directory.parent, prefix=ITEM)


def record(directory: epath.Path, step_dir: epath.Path, prefix: str) -> None:
  """Writes the record of the files under `directory` (named `<prefix>/<path>`) into `step_dir`."""
  files = {f"{prefix}/{name}": _size_and_crc(directory / name) for name in _files_in(directory)}
  content = {"algorithm": "crc32", "files": {k: list(v) for k, v in sorted(files.items())}}
  (step_dir / CHECKSUM_FILE).write_text(json.dumps(content, indent=1) + "\n")


def verify(step_dir: epath.PathLike) -> str | None:
  """What is wrong with a complete step's files, or None when they match the sizes and CRC32s
  recorded at save time (or the step predates checksums: then there is nothing to check, and a
  warning says so)."""
  step_dir = epath.Path(step_dir)
  record_path = step_dir / CHECKSUM_FILE
  if not record_path.exists():
    return _without_record(step_dir)
  try:
    files = {
      str(name): (int(size), int(crc))
      for name, (size, crc) in json.loads(record_path.read_text())["files"].items()
    }
  except Exception as error:  # Garbled JSON, a wrong shape: the record itself is damaged.
    return f"its {CHECKSUM_FILE} is unreadable ({errors.first_line(error)})"

  def check(name: str) -> str | None:
    want_size, want_crc = files[name]
    try:
      size, crc = _size_and_crc(step_dir / name)
    except FileNotFoundError:
      return f"{name} is missing"
    except OSError as error:
      return f"{name} cannot be read ({errors.first_line(error)})"
    if size != want_size:
      return f"{name} has {size} bytes where the save wrote {want_size} (truncated or replaced)"
    if crc != want_crc:
      return f"{name} fails its CRC32 check (its bytes changed after the save)"
    return None

  with concurrent.futures.ThreadPoolExecutor(_CHECK_THREADS) as pool:
    problems = [p for p in pool.map(check, sorted(files)) if p is not None]
  if not problems:
    return None
  more = f"; {len(problems) - 1} more file(s) fail too" if len(problems) > 1 else ""
  return problems[0] + more


def _with_flag(custom_metadata: dict | None) -> dict:
  """The item's custom metadata of a save that records its checksums."""
  return {**(custom_metadata or {}), RECORDED_KEY: CHECKSUM_FILE}


def _without_record(step_dir: epath.Path) -> str | None:
  """Damage when the step's save wrote a record (it is gone); None, with a warning, when the
  step was saved before records existed."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    custom = handler.metadata(step_dir / ITEM).custom_metadata or {}
  except Exception as error:  # No readable metadata either: nothing vouches for the files.
    return (
      f"its {CHECKSUM_FILE} is missing and its metadata is unreadable ({errors.first_line(error)})"
    )
  finally:
    handler.close()
  if RECORDED_KEY in custom:
    return f"its {CHECKSUM_FILE} is missing, though its save wrote one (deleted or not copied)"
  logging.warning(
    "Checkpoint %s has no %s: it was saved before checkpoints recorded checksums, so it is "
    "read unverified.",
    step_dir,
    CHECKSUM_FILE,
  )
  return None


def _size_and_crc(path: epath.Path) -> tuple[int, int]:
  size, crc = 0, 0
  with path.open("rb") as f:
    while chunk := f.read(_READ_BYTES):
      size, crc = size + len(chunk), zlib.crc32(chunk, crc)
  return size, crc


def _files_in(directory: epath.Path) -> list[str]:
  """Every file under `directory`, as paths relative to it."""
  if "://" not in os.fspath(directory):  # os.walk: one listing per directory, no stat per file.
    return sorted(
      os.path.relpath(os.path.join(root, name), directory)
      for root, _, names in os.walk(directory)
      for name in names
    )
  return sorted(str(p.relative_to(directory)) for p in directory.glob("**/*") if p.is_file())
