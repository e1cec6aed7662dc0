"""Test set-up: 8 fake CPU devices, TensorFlow kept off accelerators, paths to ../shared."""

import os
import pathlib

# Must happen before jax is imported anywhere: every test sees 8 CPU devices, so sharding code
# runs exactly as on an 8-accelerator host.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("VITBOOT_SHARED", REPO_ROOT.parent / "shared"))
GOLDEN_DIR = SHARED / "reference" / "golden"
CIFAR10_DIR = SHARED / "data" / "cifar10"


@pytest.fixture(scope="session")
def golden_dir():
  if not GOLDEN_DIR.is_dir():
    pytest.skip(f"golden vectors not found at {GOLDEN_DIR} (../shared is absent)")
  return GOLDEN_DIR


@pytest.fixture(scope="session")
def cifar10_dir():
  if not (CIFAR10_DIR / "train").is_dir():
    pytest.skip(f"CIFAR-10 image folder not found at {CIFAR10_DIR} (../shared is absent)")
  return CIFAR10_DIR
