"""CPU-only hosts: run under jemalloc or tcmalloc, so XLA:CPU's step buffers stop page-faulting.

XLA:CPU allocates a step's buffers afresh on every call and frees them after it. glibc's malloc
hands the large ones back to the kernel, so every step faults in and zeroes hundreds of MB of
new pages. jemalloc (decay off) and tcmalloc keep freed memory for the next step, so CPU steps
run faster (docs/performance.md, "The allocator").
A program's allocator is fixed when it starts, so the command-line programs re-execute
themselves once with the library preloaded, when the system has one (Debian/Ubuntu:
`apt install libjemalloc2`). Accelerator hosts are left alone: device memory has its own
allocator there.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
import sys

from vitboot_jax.cpu import devices

OPT_OUT = "VITBOOT_SYSTEM_MALLOC"  # Set to 1 to keep the system's malloc.
PRELOADED = "VITBOOT_PRELOADED_ALLOCATOR"  # Set on re-execution: the library preloaded.
SYSTEM = "system malloc"
HINT = (
  " CPU steps run faster under jemalloc or tcmalloc, used when installed "
  "(apt install libjemalloc2; docs/performance.md)."
)


# jemalloc's settings (docs/performance.md, "Host memory over many saves"): never return freed
# pages (decay off), so a step's buffers are reused without page faults; split any free extent
# for any request (lg_extent_max_active_fit at its maximum; by default never for a request under
# 1/64 of the extent, so with decay off the extents each asynchronous save freed stayed resident
# for good and the process grew with every save); one arena per core, not four: each arena keeps
# its own freed pages, and no more threads than cores run at once.
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1,lg_extent_max_active_fit:64,narenas:{cores}"
# (library name for find_library, environment it needs), in order of preference.
ALLOCATORS = (
  ("jemalloc", {"MALLOC_CONF": JEMALLOC_CONF.format(cores=devices.usable_cores())}),
  ("tcmalloc_minimal", {}),
  ("tcmalloc", {}),
)


def accelerator_plugin_installed() -> bool:
  """True when JAX may find a GPU or TPU: a PJRT plugin or libtpu is installed and JAX_PLATFORMS
  does not pin the CPU. Read without initialising any JAX backend."""
  platforms = os.environ.get("JAX_PLATFORMS")
  if platforms is not None and platforms.strip().lower() == "cpu":
    return False
  if importlib.metadata.entry_points(group="jax_plugins"):
    return True
  if importlib.util.find_spec("libtpu") is not None:
    return True
  try:
    import jax_plugins
  except ImportError:
    return False
  return any(True for _ in pkgutil.iter_modules(jax_plugins.__path__))


def _allocator_in(preload: str) -> str | None:
  """The name of the allocator an LD_PRELOAD value loads, if any."""
  return next((name for name, _ in ALLOCATORS if name in preload), None)


def find_allocator() -> tuple[str, dict[str, str]] | None:
  """The preferred allocator library the dynamic linker can find, with its environment."""
  for name, env in ALLOCATORS:
    library = ctypes.util.find_library(name)
    if library:
      return library, env
  return None


def preload_environment(environ: dict[str, str]) -> dict[str, str] | None:
  """The environment to re-execute this program with, or None to run as it is: opted out,
  already re-executed, not Linux, an accelerator host, no library found, or an allocator
  preloaded already (jemalloc with a MALLOC_CONF of the user's, or tcmalloc). jemalloc preloaded
  without one runs with its default decay, which hands freed pages back to the kernel (a ViT's
  CPU steps ran at half speed in page faults): re-executed with the product's settings."""
  if environ.get(OPT_OUT, "") not in ("", "0") or environ.get(PRELOADED):
    return None
  if platform.system() != "Linux" or accelerator_plugin_installed():
    return None
  preload = environ.get("LD_PRELOAD", "")
  chosen = _allocator_in(preload)
  if chosen == "jemalloc" and "MALLOC_CONF" not in environ:
    library = next(part for part in preload.replace(":", " ").split() if "jemalloc" in part)
    return {**environ, **dict(ALLOCATORS)["jemalloc"], PRELOADED: library}
  if chosen:
    return None
  found = find_allocator()
  if found is None:
    return None
  library, extra = found
  env = {**extra, **environ}  # The user's own MALLOC_CONF wins.
  env["LD_PRELOAD"] = f"{library} {preload}".strip()
  env[PRELOADED] = library
  return env


def reexec_with_allocator() -> None:
  """Re-executes the running program under jemalloc/tcmalloc where preload_environment says so;
  call first thing in a program's `__main__` block (it never returns when it re-executes)."""
  env = preload_environment(dict(os.environ))
  if env is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def description() -> str:
  """One line for logs and benchmark JSON: which allocator this process runs with."""
  library = os.environ.get(PRELOADED)
  if library and library in os.environ.get("LD_PRELOAD", ""):
    return library
  return _allocator_in(os.environ.get("LD_PRELOAD", "")) or SYSTEM
