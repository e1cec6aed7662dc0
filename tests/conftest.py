"""Test set-up: 8 fake CPU devices (or the accelerator, with JAX_PLATFORMS set empty), XLA's
backend optimisations off, full float32 matmuls on accelerators, TensorFlow kept off accelerators,
paths to ../shared."""

import atexit
import os
import pathlib
import shutil
import sys
import tempfile

# Must happen before jax is imported anywhere: every test sees 8 CPU devices, so sharding code
# runs exactly as on an 8-accelerator host.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests check what a program computes, not how fast: XLA's backend optimisations (LLVM -O3) would
# double the compile time that dominates the suite. Inherited by every subprocess run; the product's
# optimised build is checked against this one in test_steps (set it to 0 to run all optimised).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# One persistent compilation cache per test session, inherited by every subprocess run: the
# end-to-end tests start dozens of processes that compile the same tiny steps from scratch.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="vitboot_jax_test_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
# Each pytest-xdist worker keeps its own part of it: jax writes an entry in place, so a worker
# could read another's half-written file (and print a warning into a run's checked log).
if "PYTEST_XDIST_WORKER" in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
    os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["PYTEST_XDIST_WORKER"]
  )
  os.makedirs(os.environ["JAX_COMPILATION_CACHE_DIR"], exist_ok=True)

import pytest  # noqa: E402

_GIB_PER_WORKER = 6  # A worker with its end-to-end subprocesses peaked at ~5 GiB.


def pytest_xdist_auto_num_workers(config):
  """`-n auto`: one worker per usable core, fewer where memory is short."""
  if hasattr(os, "sched_getaffinity"):
    cores = len(os.sched_getaffinity(0))
  else:
    cores = os.cpu_count() or 1
  try:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (AttributeError, ValueError, OSError):  # No sysconf (Windows) or no such name.
    return max(1, cores)
  return max(1, min(cores, int(memory_gib // _GIB_PER_WORKER)))


REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("VITBOOT_SHARED", REPO_ROOT.parent / "shared"))
GOLDEN_DIR = SHARED / "reference" / "golden"
CIFAR10_DIR = SHARED / "data" / "cifar10"


@pytest.fixture(autouse=True)
def full_float32_matmuls():
  """On GPUs XLA multiplies float32 in TF32 by default (~3e-4 relative error); the tests compare
  float32 results to 1e-4 or tighter, so on accelerators they run at full float32 precision."""
  if os.environ["JAX_PLATFORMS"] == "cpu":  # Leaves JAX untouched until a test starts it.
    yield
    return
  import jax

  with jax.default_matmul_precision("highest"):
    yield


@pytest.fixture(autouse=True)
def claims_end_with_their_test():
  """Tests share worker processes: whatever claim a test left held (a claim acquired directly, a
  run cut short in a way that skips its release) ends with the test, heartbeat thread and all."""
  yield
  claim_module = sys.modules.get("vitboot_jax.run.workdir_claim")
  if claim_module is not None:
    claim_module.release_held()


_GOLDEN_MISSING = "golden vectors not found at"


@pytest.fixture(scope="session")
def golden_dir():
  if not GOLDEN_DIR.is_dir():
    pytest.skip(f"{_GOLDEN_MISSING} {GOLDEN_DIR} (../shared is absent)")
  return GOLDEN_DIR


def pytest_terminal_summary(terminalreporter):
  """One loud line when the fidelity tests skipped: a clone without ../shared passes without
  checking that the models compute what the authors' code computes."""
  skipped = [
    r for r in terminalreporter.stats.get("skipped", []) if _GOLDEN_MISSING in str(r.longrepr)
  ]
  if not skipped:
    return
  files = " ".join(sorted({r.nodeid.split("::")[0] for r in skipped}))
  tests = "test" if len(skipped) == 1 else "tests"
  terminalreporter.write_sep(
    "!",
    f"{len(skipped)} fidelity (golden) {tests} skipped: no golden vectors at {GOLDEN_DIR}; put "
    f"the shared folder beside the repository or run VITBOOT_SHARED=DIR python -m pytest {files}",
    red=True,
    bold=True,
  )


@pytest.fixture(scope="session")
def cifar10_dir():
  if not (CIFAR10_DIR / "train").is_dir():
    pytest.skip(f"CIFAR-10 image folder not found at {CIFAR10_DIR} (../shared is absent)")
  return CIFAR10_DIR


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
  """10 classes x (16 train, 4 test) random 32x32 PNGs: 10 steps per epoch at batch 16."""
  import numpy as np
  import tensorflow as tf

  root = tmp_path_factory.mktemp("folder")
  rng = np.random.default_rng(0)
  for split, n in (("train", 16), ("test", 4)):
    for c in range(10):
      d = root / split / f"class{c}"
      d.mkdir(parents=True)
      for i in range(n):
        # A class-dependent colour so the models can learn something in a few steps.
        img = rng.integers(0, 60, (32, 32, 3)) + np.array([c * 20, 255 - c * 20, 100])
        png = tf.io.encode_png(np.clip(img, 0, 255).astype(np.uint8)).numpy()
        (d / f"{i:03d}.png").write_bytes(png)
  return root


@pytest.fixture(scope="session")
def uninterrupted(image_folder, tmp_path_factory):
  """The tiny config trained start to end in one go: the reference for every resumed run."""
  from tests.runs import run

  workdir = tmp_path_factory.mktemp("uninterrupted")
  proc = run(workdir, image_folder)
  (workdir.parent / "uninterrupted.console.txt").write_text(proc.stderr)  # test_progress reads it.
  return workdir
