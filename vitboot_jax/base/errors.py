"""Errors a user fixes by changing the command; `main` prints the message alone and exits 2."""

from collections.abc import Iterable


class UsageError(Exception):
  """The command cannot run as given (config, data or workdir); the message names the fix.

  Raised by library code, which never exits: main turns it into one line and exit 2 (cli.fail
  before JAX loads, run/failing.fail once the run has started).
  """


class ConfigError(UsageError, ValueError):
  """A config value is unknown, out of range or inconsistent with the machine or the data."""


class DataError(UsageError, FileNotFoundError):
  """The data config.data names is missing and cannot be prepared here."""


class WorkdirError(UsageError, ValueError):
  """The workdir holds another config's run, or cannot be written."""


def first_line(error: BaseException, limit: int = 300) -> str:
  """The gist of an error for a one-line message; tensorstore's run to kilobytes of spec."""
  text = str(error).strip().split("\n", 1)[0]
  text = text if len(text) <= limit else text[:limit] + "..."
  return f"{type(error).__name__}: {text}"


def unknown_choice(name: str, value: object, choices: Iterable[object]) -> str:
  """The one message for a value outside its fixed set: a config field's (configlib.CHOICES), a
  config arg's or a tool's flag."""
  return f"{name}={value!r} is unknown; choose one of {', '.join(repr(c) for c in choices)}"
