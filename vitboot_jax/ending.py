"""How a run ends on a failure: one line and an exit code, on every process of the run.

A failure that only one process of a multi-process run meets (its save fails, its read of a
shard, any error on its host) would leave the others waiting in a collective it never enters:
collectives have no timeout, and the failed process's own exit waits minutes for the others at
jax.distributed's shutdown barrier. So the process that fails first publishes its line and code in
jax.distributed's key-value store; every process watches that key in a thread (`watching`) and,
once it is set, prints the same line, leaves the distributed service together with the others and
exits with the same code, even while its main thread is blocked in a collective. A single-process
run prints the line and exits as it always did.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

from absl import logging

from vitboot_jax import cli, errors, workdir_claim

# The key of the first failure's line and exit code; set once, by the process that failed first.
_KEY = "vitboot_jax/ending"
# How often the watcher looks again (a blocking read that times out, so it can be stopped).
_POLL_MS = 1000
# How long a process whose failure came second waits to read the first one.
_READ_MS = 60_000
# How long an unforeseen error waits for another process's line: that process's leaving can be
# what surfaced here (a cancelled read of the store), published just before.
_SETTLE_MS = 2_000
# How long a process waits for the others to leave the service with it (a wedged one never does).
_LEAVE_S = 60.0

# Held by the one thread that ends this process; any other that wants to end it waits.
_ENDING = threading.Lock()


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
  client = _client()
  stop = threading.Event()
  thread = threading.Thread(target=_watch, args=(client, stop), name="ending", daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()


def _watch(client, stop: threading.Event) -> None:
  while not (stop.is_set() or _ENDING.locked()):  # Locked: this process is being ended.
    try:
      published = client.blocking_key_value_get(_KEY, _POLL_MS)
    except Exception as error:  # Nothing published yet: the read timed out.
      if "DEADLINE_EXCEEDED" not in str(error):
        stop.wait(_POLL_MS / 1000)  # The service is busy or going: look again later.
      continue
    _end(*_decode(published))


def fail(message: str, code: int) -> NoReturn:
  """Ends the run with `message` (code 2: a usage error, printed alone) and exit `code`; in a
  multi-process run, with the first failure's line and code on every process."""
  if not _multi_process():
    _say(message, code)
    sys.exit(code)
  if not _ENDING.acquire(blocking=False):
    threading.Event().wait()  # The watcher is ending this process with the published line.
  encoded = json.dumps({"message": message, "code": code})
  client = _client()
  try:
    client.key_value_set(_KEY, encoded)  # Refused once another process published first.
  except Exception:
    try:
      encoded = client.blocking_key_value_get(_KEY, _READ_MS)
    except Exception:  # The service is gone: this process's own line is all there is.
      pass
  _leave(*_decode(encoded))


def fail_unforeseen(error: Exception) -> NoReturn:
  """Ends the run on an error this process did not foresee: with the line another process
  published first, if any (its failure may be what raised here), else with this error's first
  line, its traceback logged."""
  import jax

  try:
    published = _client().blocking_key_value_get(_KEY, _SETTLE_MS)
  except Exception:  # Nothing published (the read timed out), or the service is gone.
    published = None
  if published is not None:
    if not _ENDING.acquire(blocking=False):
      threading.Event().wait()  # The watcher is ending this process with the published line.
    _leave(*_decode(published))
  logging.error("Process %d failed:", jax.process_index(), exc_info=error)
  fail(f"Process {jax.process_index()} failed: {errors.first_line(error)}", 1)


def _end(message: str, code: int) -> None:
  if _ENDING.acquire(blocking=False):  # Else the main thread is ending this process already.
    _leave(message, code)


def _leave(message: str, code: int) -> NoReturn:
  """Prints the line, lets go of the workdir and the distributed service, and exits at once: the
  main thread may be blocked in a collective that will never finish."""
  import jax

  def shutdown():
    try:
      jax.distributed.shutdown()  # Together with the others, so none sees the service vanish.
    except Exception as error:
      logging.info("Leaving the distributed service failed: %s", error)

  _say(message, code)
  workdir_claim.release_held()
  leaving = threading.Thread(target=shutdown, name="ending-shutdown", daemon=True)
  leaving.start()
  leaving.join(_LEAVE_S)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def _decode(encoded: str) -> tuple[str, int]:
  published = json.loads(encoded)
  return str(published["message"]), int(published["code"])


def _say(message: str, code: int) -> None:
  if code == cli.USAGE_EXIT_CODE:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
  else:
    logging.error("%s", message)  # The message names the step, the files and the fix.
