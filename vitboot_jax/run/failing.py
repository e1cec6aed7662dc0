"""How a run ends on a failure: one line and an exit code, on every process of the run.

A failure that only one process of a multi-process run meets (its save fails, its read of a
shard, any error on its host) would leave the others waiting in a collective it never enters:
collectives have no timeout, and the failed process's own exit waits minutes for the others at
jax.distributed's shutdown barrier. So the process that fails first publishes its line and code in
jax.distributed's key-value store; every process watches that key in a thread (`watching`) and,
once it is set, prints the same line and exits with the same code, in order (below), even while
its main thread is blocked in a collective. A single-process run prints the line and exits as it
always did.

The ending is one state of the process, begun once: every thread consults it before it reads the
store or says anything, and an error raised after it began is its echo (a read of the
store cancelled as the run ends), never a second line. An error of the coordination service
itself (a read cancelled, unavailable or past its deadline) is taken as a sign that a peer failed:
that peer's line is read and ended with. Leaving is an order, not jax.distributed's shutdown:
process 0 hosts the service, and a client that sees it vanish is aborted by jax (SIGABRT, no
line), so every other process marks that it exits and exits, and process 0 exits once all have
marked. jax's own shutdown (a barrier, then the service's teardown) is not used on this path: under
load it could still end every process by jax's abort, after the line.

A peer can also stop without a word (SIGKILL, the OOM killer, its host lost): its collectives fail
here at once (Gloo: "connection closed by peer") or never return (a read of the store), and jax's
own heartbeat check would abort every process 100 s later. So each watcher also counts up its own
key in the store every poll, and a peer whose count stopped (without its having left) for
_SILENT_S is gone: the run ends with one line naming it and the fix, relaunching every process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

from absl import logging

from vitboot_jax.base import cli, errors
from vitboot_jax.run import workdir_claim

# The key of the first failure's line and exit code; set once, by the process that failed first.
_KEY = "vitboot_jax/ending"
# How often the watcher looks again (a blocking read that times out, so it can be stopped).
_POLL_MS = 1000
# How long a process whose failure came second waits to read the first one.
_READ_MS = 60_000
# How long an unforeseen error waits for another process's line: that process's exit can be
# what surfaced here (a collective with it broken), published just before.
_SETTLE_MS = 2_000
# How long process 0 waits for the others to mark that they exit (a wedged one never does).
_LEAVE_S = 60.0
# Each process's mark that it is exiting on the run's ending, and how long process 0 waits after
# the last mark for that process's exit (the next statement) before the service goes with it.
_EXITING_KEY = "vitboot_jax/exiting/{}"
_EXIT_AFTER_S = 2.0
# Each process's count of its watcher's polls, and its mark of a normal leaving.
_ALIVE_KEY = "vitboot_jax/alive/{}"
_LEFT_KEY = "vitboot_jax/left/{}"
# How long a peer's count may stand still before it is gone: far above a loaded host's stall of
# a thread, and, with the leaving, below jax's heartbeat timeout (100 s), whose abort is no line.
_SILENT_S = 40.0
# How long leaving waits for the others when a peer is gone (it never comes to the barrier).
_LOST_LEAVE_S = 10.0

# The status codes of the coordination service's own failures (a peer gone, or this process's
# leaving): a peer's failure may be what they report.
_COORDINATION_ERRORS = ("CANCELLED", "UNAVAILABLE", "DEADLINE_EXCEEDED")
# What a collective with a peer that is gone reports (CPU: Gloo's TCP pairs; GPU: NCCL).
_LOST_PEER_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Gloo", "NCCL")


class _Ending:
  """Whether this process is being ended; begun once, by the one thread that then ends it."""

  def __init__(self):
    self._lock = threading.Lock()
    self._begun = threading.Event()

  def begun(self) -> bool:
    return self._begun.is_set()

  def begin(self) -> bool:
    """True for the one thread that begins the ending; False once another has."""
    with self._lock:
      if self._begun.is_set():
        return False
      self._begun.set()
      return True

  def defer(self) -> None:
    """Waits, if the ending has begun, for the thread that ends this process to exit it."""
    if self._begun.is_set():
      threading.Event().wait()


_STATE = _Ending()


def _multi_process() -> bool:
  import jax

  return jax.process_count() > 1


def _client():
  """jax.distributed's client (None once this process has left the service)."""
  from jax._src import distributed  # The store jax.distributed started (orbax uses it too).

  return distributed.global_state.client


@contextlib.contextmanager
def watching() -> Iterator[None]:
  """Within it, another process's failure ends this one too (a no-op for one process)."""
  if not _multi_process():
    yield
    return
  import jax

  client = _client()
  stop = threading.Event()
  thread = threading.Thread(target=_watch, args=(client, stop), name="ending", daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()
    with contextlib.suppress(Exception):  # Left normally: the others do not wait for its count.
      client.key_value_set(_LEFT_KEY.format(jax.process_index()), "")


def _watch(client, stop: threading.Event) -> None:
  import jax

  me = jax.process_index()
  peers = _Peers(client, [p for p in range(jax.process_count()) if p != me])
  while not (stop.is_set() or _STATE.begun()):
    with contextlib.suppress(Exception):  # The service is busy or going: counted next time.
      client.key_value_increment(_ALIVE_KEY.format(me), 1)
    gone = peers.gone()
    if gone and _STATE.begin():
      _leave(_gone_message(gone), 1, _LOST_LEAVE_S)
    try:
      published = client.blocking_key_value_get(_KEY, _POLL_MS)
    except Exception as error:  # Nothing published yet: the read timed out.
      if "DEADLINE_EXCEEDED" not in str(error):
        stop.wait(_POLL_MS / 1000)  # The service is busy or going: look again later.
      continue
    if _STATE.begin():  # Else another thread is ending this process already.
      _leave(*_decode(published))


class _Peers:
  """The other processes' counts as this watcher last saw them change (on its own clock)."""

  def __init__(self, client, peers: list[int]):
    self._client = client
    self._seen: dict[int, tuple[str, float]] = {}
    self._peers = peers

  def gone(self) -> list[int]:
    """The peers whose count stood still for _SILENT_S and that did not leave normally."""
    now, gone = time.monotonic(), []
    for peer in list(self._peers):
      try:
        count = self._client.key_value_try_get(_ALIVE_KEY.format(peer))
      except Exception:  # It has not counted yet, or the service is busy.
        continue
      last = self._seen.get(peer)
      if last is None or last[0] != count:
        self._seen[peer] = (count, now)
      elif now - last[1] > _SILENT_S and not self._left(peer):
        gone.append(peer)
    return gone

  def _left(self, peer: int) -> bool:
    try:
      self._client.key_value_try_get(_LEFT_KEY.format(peer))
    except Exception:
      return False
    self._peers.remove(peer)
    return True


def _gone_message(gone: list[int]) -> str:
  named = ", ".join(map(str, gone))
  return (
    f"Process {named} of this run stopped without a word (no sign of life for {_SILENT_S:.0f} s: "
    "killed, out of memory, or its host lost), so the run cannot go on. Relaunch every process "
    "with the same command; the run resumes from its newest complete checkpoint."
  )


def fail(message: str, code: int) -> NoReturn:
  """Ends the run with `message` (code 2: a usage error, printed alone) and exit `code`; in a
  multi-process run, with the first failure's line and code on every process.

  For failures once a run of possibly several processes has started (within `watching`). Before
  JAX loads, in one process: base/cli.fail. Library code raises errors.UsageError instead.
  """
  if not _multi_process():
    _say(message, code)
    sys.exit(code)
  if not _STATE.begin():
    _STATE.defer()  # Ending already: this failure is its echo.
  _publish_and_leave(message, code)


def fail_unforeseen(error: Exception) -> NoReturn:
  """Ends the run on an error this process did not foresee: with the line another process
  published first, if any (its failure may be what raised here), else with this error's first
  line, its traceback logged."""
  import jax

  _STATE.defer()  # Ending already: the error is its echo (a read its leaving cancelled).
  # A peer's failure: its line comes, or the watcher finds it gone, within this wait.
  published = _published(_READ_MS if is_peer_error(error) else _SETTLE_MS)
  if not _STATE.begin():
    _STATE.defer()  # The watcher began the ending while this thread read.
  if published is not None:
    _leave(*_decode(published))
  logging.error("Process %d failed:", jax.process_index(), exc_info=error)
  _publish_and_leave(f"Process {jax.process_index()} failed: {errors.first_line(error)}", 1)


def _publish_and_leave(message: str, code: int) -> NoReturn:
  """Publishes this failure, unless another process's came first, and leaves with the first."""
  encoded = json.dumps({"message": message, "code": code})
  try:
    _client().key_value_set(_KEY, encoded)  # Refused once another process published first.
  except Exception:
    published = _published(_READ_MS)
    encoded = published if published is not None else encoded  # Else the service is gone.
  _leave(*_decode(encoded))


def is_peer_error(error: BaseException) -> bool:
  """Whether `error` (or an error behind it) is a failure of the coordination service's calls or
  of a collective with another process: what a peer's failure or loss looks like here."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error)
    if text.startswith(_COORDINATION_ERRORS) or any(s in text for s in _LOST_PEER_SIGNS):
      return True
    error = error.__cause__ or error.__context__
  return False


def _published(wait_ms: int) -> str | None:
  """The first failure's line as published, waiting up to `wait_ms`; None if none came (or the
  service is gone)."""
  client = _client()
  if client is None:  # This process has left the service.
    return None
  try:
    return client.blocking_key_value_get(_KEY, wait_ms)
  except Exception:  # Nothing published (the read timed out), or the service is gone.
    return None


def _leave(message: str, code: int, leave_s: float = _LEAVE_S) -> NoReturn:
  """Prints the line, lets go of the workdir and exits, after the others if this is process 0: the
  main thread may be blocked in a collective that will never finish."""
  _say(message, code)
  workdir_claim.release_held()
  sys.stdout.flush()
  sys.stderr.flush()
  _exit_in_order(leave_s)
  os._exit(code)


def _exit_in_order(leave_s: float) -> None:
  """Marks this process's exit; process 0, which hosts the service, first waits (up to `leave_s`)
  for every other process's mark."""
  import jax

  client = _client()
  if client is None:
    return
  me = jax.process_index()
  if me != 0:
    with contextlib.suppress(Exception):  # The service is gone: nobody waits for this mark.
      client.key_value_set(_EXITING_KEY.format(me), "")
    return
  deadline = time.monotonic() + leave_s
  for peer in range(1, jax.process_count()):
    wait_ms = max(1, int(1000 * (deadline - time.monotonic())))
    try:
      client.blocking_key_value_get(_EXITING_KEY.format(peer), wait_ms)
    except Exception as error:  # Wedged or gone: it exits on its own (jax aborts it) or is gone.
      logging.info("Process %d did not mark its exit: %s", peer, errors.first_line(error))
  time.sleep(_EXIT_AFTER_S)


def _decode(encoded: str) -> tuple[str, int]:
  published = json.loads(encoded)
  return str(published["message"]), int(published["code"])


def _say(message: str, code: int) -> None:
  if code == cli.USAGE_EXIT_CODE:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
  else:
    logging.error("%s", message)  # The message names the step, the files and the fix.
