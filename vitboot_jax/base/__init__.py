"""The ground floor, which every wing may use and which imports nothing else of the package:
errors a user fixes (errors), files written whole (files), library chatter kept off the console
(library_logs) and the command-line checks that run before JAX loads (cli)."""
