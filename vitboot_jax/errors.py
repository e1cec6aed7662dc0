"""Errors a user fixes by changing the command; `main` prints the message alone and exits 2."""


class UsageError(Exception):
  """The command cannot run as given (config, data or workdir); the message names the fix."""


class ConfigError(UsageError, ValueError):
  """A config value is unknown, out of range or inconsistent with the machine or the data."""


class DataError(UsageError, FileNotFoundError):
  """The data config.data names is missing and cannot be prepared here."""


class WorkdirError(UsageError, ValueError):
  """The workdir holds another config's run, or cannot be written."""
