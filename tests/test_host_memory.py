"""CPU hosts re-execute under jemalloc/tcmalloc: when, with what environment, and its effect."""

import os
import platform
import subprocess
import sys

import pytest

from vitboot_jax.cpu import host_memory

# A program that re-executes itself as main does, then times a step whose 64 MB temporary (a @ b,
# an operand of the next product) is allocated and freed on every call.
_PROGRAM = """
import resource
from vitboot_jax.cpu import host_memory
host_memory.reexec_with_allocator()
import jax, jax.numpy as jnp
step = jax.jit(lambda a, b: jnp.sum((a @ b).T @ a))
a, b = jnp.ones([4096, 64]), jnp.ones([64, 4096])
for _ in range(20):
  step(a, b).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  step(a, b).block_until_ready()
print(host_memory.description(), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _run(opt_out: str) -> tuple[str, float]:
  argv = [sys.executable, "-c", _PROGRAM]
  env = {**os.environ, host_memory.OPT_OUT: opt_out}
  out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
  allocator, faults = out.strip().splitlines()[-1].rsplit(maxsplit=1)
  return allocator, float(faults)


@pytest.mark.skipif(platform.system() != "Linux", reason="LD_PRELOAD: Linux only")
@pytest.mark.slow
def test_reexecution_under_the_allocator_stops_the_page_faults():
  found = host_memory.find_allocator()
  if found is None or host_memory.accelerator_plugin_installed():
    pytest.skip("no jemalloc/tcmalloc on this host, or an accelerator host")
  allocator, faults = _run("0")
  system, system_faults = _run("1")
  assert allocator == found[0]
  assert system == host_memory.SYSTEM
  # glibc maps each 64 MB temporary afresh: 16,384 pages faulted in per call.
  assert system_faults > 8_000
  assert faults < system_faults / 4  # ~0 seen (0.2-0.4 per call).


@pytest.fixture
def cpu_host(monkeypatch):
  monkeypatch.setattr(host_memory.platform, "system", lambda: "Linux")
  monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda: False)
  monkeypatch.setattr(
    host_memory, "find_allocator", lambda: ("libjemalloc.so.2", {"MALLOC_CONF": "x:-1"})
  )


def test_preload_environment_on_a_cpu_host(cpu_host):
  env = host_memory.preload_environment({"PATH": "/bin", "LD_PRELOAD": "libother.so"})
  assert env["LD_PRELOAD"] == "libjemalloc.so.2 libother.so"
  assert env["MALLOC_CONF"] == "x:-1"
  assert env[host_memory.PRELOADED] == "libjemalloc.so.2"
  assert env["PATH"] == "/bin"
  mine = host_memory.preload_environment({"MALLOC_CONF": "mine"})
  assert mine["MALLOC_CONF"] == "mine"  # The user's own setting wins.


@pytest.mark.parametrize(
  "environ",
  [
    {host_memory.OPT_OUT: "1"},
    {host_memory.PRELOADED: "libjemalloc.so.2"},  # Already re-executed: never loops.
    {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"},  # The user chose one.
  ],
)
def test_no_reexecution_when_chosen_already(cpu_host, environ):
  assert host_memory.preload_environment(environ) is None


def test_no_reexecution_on_accelerator_hosts_or_without_a_library(cpu_host, monkeypatch):
  monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda: True)
  assert host_memory.preload_environment({}) is None
  monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda: False)
  monkeypatch.setattr(host_memory, "find_allocator", lambda: None)
  assert host_memory.preload_environment({}) is None


def test_jax_platforms_cpu_means_no_accelerator(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert not host_memory.accelerator_plugin_installed()
