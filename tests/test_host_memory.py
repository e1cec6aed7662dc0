"""CPU hosts re-execute under jemalloc/tcmalloc: when, with what environment, and its effect."""

import ctypes.util
import json
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


# Asynchronous saves of a 28 MB state shaped like a ViT's (weights and Adam's two moments) on 2
# CPU devices, as train.py saves it, each after two donated steps; prints the resident set (MiB)
# after every save.
_SAVES = """
import os, sys, tempfile
import jax, jax.numpy as jnp, numpy as np
from vitboot_jax.checkpoint import checkpointer
from vitboot_jax.base import library_logs
from vitboot_jax import sharding
library_logs.libraries()
w, saves = 256, int(sys.argv[1])
shapes = [(w, 3 * w), (w, w), (w, 4 * w), (4 * w, w), (3 * w,), (w,), (4 * w,), (w,)] * 9
rng = np.random.default_rng(0)
replicated = sharding.replicated(sharding.make_mesh())
state = [jax.device_put(rng.standard_normal(s, np.float32), replicated) for s in shapes]
step = jax.jit(lambda s: [x * 1.0001 + jnp.tanh(x) * 1e-6 for x in s], donate_argnums=0)
ckpt = checkpointer.Checkpointer(tempfile.mkdtemp(), keep=2)
for i in range(1, 2 * saves + 1):
  state = jax.block_until_ready(step(state))
  if i % 2 == 0:
    ckpt.save(i, state, force=True)
    print(int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20)
ckpt.close()
"""


@pytest.mark.skipif(platform.system() != "Linux", reason="LD_PRELOAD: Linux only")
@pytest.mark.slow
def test_memory_stays_flat_over_saves_under_the_products_jemalloc():
  """jemalloc as main runs it (host_memory.ALLOCATORS) reuses what every save frees: from the
  6th to the 24th save this program grew 23-30 MiB under it, and 86-130 MiB under what main
  set before issue 66 (decay off alone; 2-core VM, docs/performance.md), growing by ~5 MiB a
  save without end."""
  library = ctypes.util.find_library("jemalloc")
  if library is None:
    pytest.skip("libjemalloc is not installed (apt install libjemalloc2)")
  env = {
    **os.environ,
    **dict(host_memory.ALLOCATORS)["jemalloc"],
    "LD_PRELOAD": library,
    host_memory.PRELOADED: library,
    "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
  }
  argv = [sys.executable, "-c", _SAVES, "24"]
  out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
  rss = [int(line) for line in out.split()]
  assert len(rss) == 24
  assert rss[-1] - rss[5] < 50, rss


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


def test_a_preloaded_jemalloc_without_settings_gets_the_products(cpu_host):
  """jemalloc preloaded by the user (LD_PRELOAD=...libjemalloc.so.2, a common tip) and no
  MALLOC_CONF: re-executed as it is with the product's settings, not jemalloc's default decay."""
  library = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
  env = host_memory.preload_environment({"LD_PRELOAD": f"libother.so {library}", "PATH": "/bin"})
  assert env["MALLOC_CONF"] == dict(host_memory.ALLOCATORS)["jemalloc"]["MALLOC_CONF"]
  assert env["MALLOC_CONF"].startswith("dirty_decay_ms:-1,muzzy_decay_ms:-1,")
  assert env["LD_PRELOAD"] == f"libother.so {library}" and env["PATH"] == "/bin"
  assert env[host_memory.PRELOADED] == library
  assert host_memory.preload_environment(env) is None  # Re-executed once: never loops.


@pytest.mark.skipif(platform.system() != "Linux", reason="LD_PRELOAD: Linux only")
def test_a_program_started_under_jemalloc_runs_with_the_products_settings():
  """The re-execution itself: a program started with jemalloc preloaded and no MALLOC_CONF
  (as `LD_PRELOAD=libjemalloc.so.2 python -m vitboot_jax.main ...`) runs with ours."""
  library = ctypes.util.find_library("jemalloc")
  if library is None or host_memory.accelerator_plugin_installed():
    pytest.skip("libjemalloc is not installed (apt install libjemalloc2), or an accelerator host")
  program = (
    "import os\nfrom vitboot_jax.cpu import host_memory\nhost_memory.reexec_with_allocator()\n"
    "print(os.environ.get('MALLOC_CONF'), host_memory.description())"
  )
  env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_CONF", host_memory.PRELOADED)}
  env.update({"LD_PRELOAD": library, host_memory.OPT_OUT: "0"})
  argv = [sys.executable, "-c", program]
  out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout.split()
  assert out == [dict(host_memory.ALLOCATORS)["jemalloc"]["MALLOC_CONF"], library]


@pytest.mark.parametrize(
  "environ",
  [
    {host_memory.OPT_OUT: "1"},
    {host_memory.PRELOADED: "libjemalloc.so.2"},  # Already re-executed: never loops.
    {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"},  # The user chose one.
    {"LD_PRELOAD": "libjemalloc.so.2", "MALLOC_CONF": "narenas:1"},  # And its settings.
    {host_memory.OPT_OUT: "1", "LD_PRELOAD": "libjemalloc.so.2"},
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


@pytest.mark.slow
def test_save_memory_benchmark_lines_and_summary(tmp_path):
  """launch/save_memory.py in this process (the test's allocator): its child's line for each
  schedule, and the summary over settings, as the tool prints them."""
  from launch import save_memory
  from tests.config_files import load_config

  config = load_config("tiny_config", "mode=vit")
  lines = []
  for name in ("product", "before"):
    for schedule in save_memory.SCHEDULES:
      line = save_memory.run_schedule(config, schedule, 3, 2, str(tmp_path / name / schedule))
      lines.append({"setting": name, **json.loads(json.dumps(line))})
  every, once = lines[:2]
  assert (every["saves"], once["saves"]) == (3, 1) and every["steps"] == once["steps"] == 6
  assert len(every["rss_bytes"]) == 3 and every["peak_rss_bytes"] >= max(every["rss_bytes"])
  assert every["state_bytes"] > 0 and every["step_s"] > 0 and every["minor_faults_per_step"] >= 0
  summary = save_memory.summarise(lines)
  assert summary["product"]["peak_every_over_once"] > 0
  assert summary["step_s_before_over_product_once"] > 0
