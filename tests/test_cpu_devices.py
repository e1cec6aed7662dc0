"""One CPU device per core: the count chosen, the CPU client it shapes, and a run trained on it."""

import subprocess
import sys

import pytest

from tests import runs
from vitboot_jax.base import errors
from vitboot_jax.cpu import devices as cpu_devices


@pytest.mark.parametrize(
  "batch_sizes, cores, expected",
  [
    ((64, 128), 2, 2),
    ((64, 256), 3, 2),  # 3 does not divide 64: the most cores that split both batches.
    ((60, 256), 6, 4),
    ((64, 128), 16, cpu_devices.MAX_AUTO_DEVICES),
    ((64, 128), 1, 1),
    ((63, 128), 2, 1),  # An odd batch stays on one device.
  ],
)
def test_auto_count_splits_every_batch_evenly(batch_sizes, cores, expected):
  assert cpu_devices.auto_count(batch_sizes, cores) == expected


def test_an_explicit_count_must_divide_the_batches():
  with pytest.raises(errors.UsageError, match=r"--cpu_devices=3 does not divide .*\[64, 128\]"):
    cpu_devices.split_host((64, 128), requested=3)
  with pytest.raises(errors.UsageError, match="must be 0"):
    cpu_devices.split_host((64, 128), requested=-1)


def test_a_count_fixed_by_the_environment_wins(monkeypatch):
  # conftest sets --xla_force_host_platform_device_count=8 for every test.
  assert cpu_devices.count_fixed_by_environment()
  assert cpu_devices.split_host((64, 128), cores=2) is None
  monkeypatch.setenv("XLA_FLAGS", "")
  assert not cpu_devices.count_fixed_by_environment()
  monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "4")
  assert cpu_devices.count_fixed_by_environment()


def _clean_env():
  variables = runs.env(1)
  del variables["XLA_FLAGS"]
  return variables


@pytest.mark.parametrize(
  "call, devices",
  [("split_host((64, 256), cores=3)", 2), ("split_host((64, 128), requested=1)", 1)],
)
def test_split_host_shapes_the_cpu_client(call, devices):
  code = (
    "import jax\n"
    "from vitboot_jax.cpu import devices as cpu_devices\n"
    f"print(cpu_devices.{call}, len(jax.devices()), jax.default_backend())\n"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True, timeout=120
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == [str(devices), str(devices), "cpu"]


@pytest.mark.slow
def test_main_trains_on_the_split_host(tmp_path, image_folder):
  workdir = tmp_path / "run"
  command = runs.command(workdir, image_folder, "--cpu_devices=2", "--config.num_epochs=1")
  proc = subprocess.run(
    command, env=_clean_env(), capture_output=True, text=True, timeout=600, cwd=runs.REPO
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "2 local / 2 global devices (cpu)" in proc.stderr
  assert "CPU host split into 2 devices" in proc.stderr
  records = runs.metrics(workdir)
  assert (workdir / "final.json").exists()
  assert any(key.startswith("eval/") for record in records for key in record)


@pytest.mark.slow
def test_main_refuses_a_count_that_does_not_divide_the_batch(tmp_path, image_folder):
  workdir = tmp_path / "run"
  command = runs.command(workdir, image_folder, "--cpu_devices=3")
  proc = subprocess.run(
    command, env=runs.env(1), capture_output=True, text=True, timeout=120, cwd=runs.REPO
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "error: --cpu_devices=3 does not divide the batch size(s) [16, 32]" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (workdir / "checkpoints").exists()


@pytest.mark.parametrize("tool", ["benchmark", "kernel_ab", "profile_step"])
@pytest.mark.slow
def test_perf_tools_lay_the_host_out_as_main_does(tool):
  # The tools share main's flag and rule: a count that does not divide --batch is refused alike.
  command = [sys.executable, "-m", f"vitboot_jax.tools.perf.{tool}", f"--config={runs.TINY}"]
  command += ["--batch=12", "--cpu_devices=8"] + (
    ["--switch=kernels"] if tool == "kernel_ab" else []
  )
  proc = subprocess.run(
    command, env=runs.env(1), capture_output=True, text=True, timeout=120, cwd=runs.REPO
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "error: --cpu_devices=8 does not divide the batch size(s) [12]" in proc.stderr
  assert "Traceback" not in proc.stderr
