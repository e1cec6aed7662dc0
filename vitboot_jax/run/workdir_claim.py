"""One run per workdir: an exclusive claim held for the whole run.

The claim is `<workdir>/claim.json` holding the owner's host, pid, start time, a random token and
a heartbeat time. On a file system (local or network: NFS, Lustre, GCS FUSE) it is created with
O_CREAT|O_EXCL, which exactly one creator wins; on an object store (gs://...) it is an object with
the same content, written only when none exists and read back to confirm the token (object stores
offer no exclusive create through epath, so two runs started within a second may both see a free
workdir there; the heartbeat then finds the loser, which stops before its next checkpoint).

A background thread rewrites the heartbeat every HEARTBEAT_SECONDS. A claim is stale, and taken
over with a warning, when its holder ran on this host and its pid is gone, or when its heartbeat is
older than STALE_AFTER_SECONDS (the holder's host died or lost the workdir). "This host" means
the same host name, boot and pid namespace, so containers sharing a host name never judge each
other's pids. To take over at once a claim you know is dead (e.g. its host was powered off),
delete claim.json and re-run.

Read-only tools (visualize, plot, sweep's table) never take or look at the claim.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from absl import logging
from etils import epath

from vitboot_jax.base import errors, files

CLAIM_FILE = "claim.json"
HEARTBEAT_SECONDS = 60.0
# Ten missed heartbeats: long enough for a slow network file system or a paused VM.
STALE_AFTER_SECONDS = 600.0

# Claims held by this process, by workdir: the checkpointer asks whether its run still owns one.
_HELD: dict[str, Claim] = {}
_HELD_LOCK = threading.Lock()


class WorkdirBusyError(errors.WorkdirError):
  """Another live run holds the workdir."""


def _key(workdir: epath.PathLike) -> str:
  path = os.fspath(workdir)
  return path if "://" in path else os.path.abspath(path)


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Alive, owned by another user.
    return True
  return True


def _describe(record: dict[str, Any]) -> str:
  started = record.get("started")
  when = (
    datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(started, (int, float))
    else "an unknown time"
  )
  return f"pid {record.get('pid')} on {record.get('host')} (started {when})"


_LEFTOVER = "it was left by an earlier run in this process"


def _leftover(record: dict[str, Any]) -> Claim | bool | None:
  """This process's claim named by `record` if no live run uses it, else None.

  Runs are synchronous: a claim acquired on the calling thread belongs to a run that has ended
  (returned or raised) by the time the same thread starts another.
  """
  with _HELD_LOCK:
    claim = next((c for c in _HELD.values() if c.token == record.get("token")), None)
  if claim is None:
    return True
  return claim if claim.thread_id == threading.get_ident() else None


def _read_proc(path: str, link: bool = False) -> str | None:
  try:
    if link:
      return os.readlink(path)
    with open(path) as f:
      return f.read().strip()
  except OSError:  # Not Linux.
    return None


def _machine() -> dict[str, Any]:
  """Who may judge a pid: the host, its boot, and the pid namespace (containers sharing a host
  name see different pids)."""
  return {
    "host": socket.gethostname(),
    "boot_id": _read_proc("/proc/sys/kernel/random/boot_id"),
    "pid_namespace": _read_proc("/proc/self/ns/pid", link=True),
  }


def stale_reason(record: dict[str, Any], now: float | None = None) -> str | None:
  """Why the claim `record` no longer holds its workdir, or None while its holder may be alive."""
  now = time.time() if now is None else now
  here = _machine()
  if record.get("host") == here["host"] and record.get("boot_id") != here["boot_id"]:
    return "its host has rebooted since"
  same_pids = record.get("host") == here["host"] and (
    record.get("pid_namespace") == here["pid_namespace"]
  )
  if same_pids and isinstance(record.get("pid"), int):
    if not _pid_alive(record["pid"]):
      return "its process no longer exists"
    if record["pid"] == os.getpid() and _leftover(record) is not None:
      return _LEFTOVER
  heartbeat = record.get("heartbeat")
  if not isinstance(heartbeat, (int, float)):
    return "it is unreadable"
  if now - heartbeat > STALE_AFTER_SECONDS:
    return f"its heartbeat is {now - heartbeat:.0f} s old (stale after {STALE_AFTER_SECONDS:.0f} s)"
  return None


def read(workdir: epath.PathLike) -> dict[str, Any] | None:
  """The claim record of `workdir`, {} if unreadable (a write cut short), None if unclaimed."""
  path = epath.Path(workdir) / CLAIM_FILE
  try:
    text = path.read_text()
  except (FileNotFoundError, NotADirectoryError):
    return None
  try:
    record = json.loads(text)
  except json.JSONDecodeError:
    return {}
  return record if isinstance(record, dict) else {}


def _busy_message(workdir: epath.PathLike, record: dict[str, Any]) -> str:
  path = epath.Path(workdir) / CLAIM_FILE
  return (
    f"--workdir={workdir} is in use by another run: {_describe(record)}. Give a second run its own "
    f"--workdir; if that run is gone (its host died), delete {path} and re-run (a claim is also "
    f"taken over by itself once its heartbeat is {STALE_AFTER_SECONDS:.0f} s old)"
  )


def check_free(workdir: epath.PathLike) -> None:
  """Raises WorkdirBusyError if a live run holds `workdir`; writes nothing (for main's checks)."""
  record = read(workdir)
  if record and stale_reason(record) is None:
    raise WorkdirBusyError(_busy_message(workdir, record))


class Claim:
  """A held claim: refreshes its heartbeat until `release()`; `lost` once another run took it."""

  def __init__(self, workdir: epath.Path, record: dict[str, Any]):
    self.workdir = workdir
    self.path = workdir / CLAIM_FILE
    self.record = record
    self.token = record["token"]
    self.lost: str | None = None
    self.thread_id = threading.get_ident()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, name="workdir-claim", daemon=True)
    self._settle: list[Callable[[], object]] = []

  def _start(self) -> None:
    with _HELD_LOCK:
      _HELD[_key(self.workdir)] = self
    self._thread.start()
    atexit.register(self.release)

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      self.refresh()

  def refresh(self) -> None:
    """Rewrites the heartbeat, or marks the claim lost if another run has taken it over."""
    try:
      current = read(self.workdir)
      if current is None or current.get("token") != self.token:
        holder = _describe(current) if current else "nobody"
        self.lost = f"{self.path} now names {holder}"
        logging.error("Lost the claim on %s: %s.", self.workdir, self.lost)
        self._stop.set()
        return
      self.record = {**self.record, "heartbeat": time.time()}
      _replace(self.path, self.record)
    except OSError as error:  # A network hiccup; the next beat tries again.
      logging.warning("Could not refresh %s: %s", self.path, error)

  def check(self) -> None:
    """Raises WorkdirBusyError if another run has taken the workdir over."""
    if self.lost:
      raise WorkdirBusyError(
        f"--workdir={self.workdir} was taken over by another run ({self.lost}); this run stops "
        "without writing more. Run one job per workdir."
      )

  def settle_first(self, settle: Callable[[], object]) -> None:
    """Has `release_after_failure` call `settle` (the run's checkpointer's close) first."""
    self._settle.append(settle)

  def release_after_failure(self) -> None:
    """Releases the claim of a run that raised once what it left in flight has settled: a save
    still writing must not meet the next run's clean-up of unfinished steps."""
    for settle in self._settle:
      try:
        settle()
      except Exception as error:  # The run's own error is the one its caller sees.
        logging.warning("Settling %s before releasing its claim: %s", self.workdir, error)
    self.release()

  def release(self) -> None:
    """Stops the heartbeat and deletes the claim if it is still this run's."""
    self._stop.set()
    self._settle.clear()
    with _HELD_LOCK:
      if _HELD.get(_key(self.workdir)) is self:
        del _HELD[_key(self.workdir)]
    atexit.unregister(self.release)
    try:
      current = read(self.workdir)
      if current is not None and current.get("token") == self.token:
        self.path.unlink()
    except OSError as error:
      logging.warning("Could not remove %s: %s", self.path, error)

  def __enter__(self) -> Claim:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.release()


def _replace(path: epath.Path, record: dict[str, Any]) -> None:
  """Rewrites the claim in one step, so a reader never sees half a record."""
  text = json.dumps(record)
  if files.is_local(path):
    files.write_atomically(path, text)
  else:  # An object store: a rename is a copy, the write itself is whole.
    path.write_text(text)


def _create(path: epath.Path, record: dict[str, Any]) -> bool:
  """Writes the claim if none exists; True if this call created it."""
  text = json.dumps(record)
  if files.is_local(path):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    return True
  if path.exists():
    return False
  path.write_text(text)
  time.sleep(1.0)  # Let a concurrent writer's object land, then see whose token survived.
  current = read(path.parent)
  return current is not None and current.get("token") == record["token"]


def _set_aside(path: epath.Path, stale: dict[str, Any]) -> None:
  """Moves the stale claim out of the way, if it is still the one judged stale."""
  aside = path.with_name(f".{path.name}.stale-{uuid.uuid4().hex}")
  try:
    path.rename(aside)
  except FileNotFoundError:
    return  # Another starter took it over first.
  try:
    moved = json.loads(aside.read_text())
  except (FileNotFoundError, json.JSONDecodeError):
    moved = {}
  if moved and moved.get("token") != stale.get("token"):
    # The claim changed between reading and moving it (a new holder): put it back.
    if files.is_local(path):
      try:
        os.link(aside, path)
      except FileExistsError:
        pass
    elif not path.exists():
      aside.rename(path)
  if aside.exists():
    aside.unlink()


def acquire(workdir: epath.PathLike) -> Claim:
  """Claims `workdir` (created if missing) for this run, taking over a stale claim.

  Raises:
    WorkdirBusyError: Another live run holds it.
  """
  workdir = epath.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  path = workdir / CLAIM_FILE
  now = time.time()
  record = {
    **_machine(),
    "pid": os.getpid(),
    "started": now,
    "heartbeat": now,
    "token": uuid.uuid4().hex,
  }
  for _ in range(3):
    if _create(path, record):
      claim = Claim(workdir, record)
      claim._start()
      return claim
    current = read(workdir)
    if current is None:
      continue  # Released in between: try again.
    why = stale_reason(current)
    if why is None:
      raise WorkdirBusyError(_busy_message(workdir, current))
    if why == _LEFTOVER:
      old = _leftover(current)
      if isinstance(old, Claim):
        old.release()
        continue
    else:
      logging.warning("Taking over the claim on %s (%s): %s.", workdir, _describe(current), why)
    _set_aside(path, current)
  current = read(workdir) or {}
  raise WorkdirBusyError(_busy_message(workdir, current))


def held(workdir: epath.PathLike) -> Claim | None:
  """This process's claim on `workdir`, if it holds one."""
  with _HELD_LOCK:
    return _HELD.get(_key(workdir))


def release_held() -> None:
  """Releases every claim this process holds, for an exit that skips `atexit` (run/failing.py)."""
  with _HELD_LOCK:
    claims = list(_HELD.values())
  for claim in claims:
    claim.release()


class _OtherProcess:
  """What processes other than 0 hold: process 0 holds the claim for the whole run."""

  def check(self) -> None:
    pass

  def settle_first(self, settle: Callable[[], object]) -> None:
    pass

  def release_after_failure(self) -> None:
    pass

  def release(self) -> None:
    pass


# What `acquire_for_run` gives each process of a run.
RunClaim = Claim | _OtherProcess


def acquire_for_run(workdir: epath.PathLike) -> RunClaim:
  """`acquire` on process 0; every process of a multi-process run gets its verdict.

  The verdict goes through the coordination service's key-value store, not a collective: the
  processes reach this point up to minutes apart (imports, data checks), longer than a
  collective's set-up waits.
  """
  import jax

  if jax.process_count() == 1:
    return acquire(workdir)
  from jax._src import distributed  # The store jax.distributed started (orbax uses it too).

  client = distributed.global_state.client
  key = f"vitboot_jax/workdir_claim/{_key(workdir)}"
  if jax.process_index() == 0:
    try:
      claim = acquire(workdir)
    except WorkdirBusyError as error:
      client.key_value_set(key, str(error))
      raise
    except OSError as error:  # The others wait for a verdict: a full disk is one, too.
      failure = unwritable_error(workdir, error)
      client.key_value_set(key, str(failure))
      raise failure from error
    client.key_value_set(key, "")
    return claim
  verdict = client.blocking_key_value_get(key, int(VERDICT_TIMEOUT_SECONDS * 1000))
  if verdict:
    raise WorkdirBusyError(verdict)
  return _OtherProcess()


def unwritable_error(workdir: epath.PathLike, error: OSError) -> errors.WorkdirError:
  """A claim that could not be written (a full disk, lost permissions), in one line."""
  where = f" ({error.filename})" if error.filename else ""
  return errors.WorkdirError(
    f"Claiming --workdir={workdir} failed: {error.strerror or error}{where}. Free disk space or "
    "make the workdir writable, then re-run the same command."
  )


# How long processes other than 0 wait for process 0 to reach the claim.
VERDICT_TIMEOUT_SECONDS = 1800.0
