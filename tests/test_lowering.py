"""Every step of every mode lowers for GPUs and TPUs: real convolutions, no host callbacks."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.config_files import load_config
from vitboot_jax.tools.perf import lowering

ROOT = pathlib.Path(__file__).resolve().parents[1]


def check_accelerator_rows(rows, platforms=("cuda", "tpu")):
  assert {(r["mode"], r["platform"], r["dtype"]) for r in rows} == {
    (m, p, d) for m in lowering.MODES for p in platforms for d in lowering.DTYPES
  }
  for row in rows:
    name = f"{row['mode']}/{row['platform']}/{row['dtype']}"
    assert row["ok"] and row["error"] is None, (name, row["error"])
    assert row["kernels"] == "xla", name
    assert row["host_callbacks"] == 0, name
    assert row["dot_generals"] > 0 and row["flops"] > 0, name
    # The agent's stem (and the ViT's patch embedding) are real convolutions.
    assert row["convolutions"] > 0, name


@pytest.mark.slow
def test_tiny_config_lowers_for_accelerators_and_cpu(monkeypatch):
  config = load_config("tiny_config")
  built = []
  step_specs = lowering.step_specs
  monkeypatch.setattr(
    lowering, "step_specs", lambda c, platform: built.append(platform) or step_specs(c, platform)
  )
  printed = []
  rows = lowering.run(config, platforms=("cuda", "tpu", "cpu"), emit=printed.append)
  assert [json.loads(line) for line in printed] == rows
  # Steps are built (and traced) once per kernel set: cuda and tpu share the xla set's.
  assert built == ["cuda", "cpu"] * len(lowering.MODES) * len(lowering.DTYPES)
  check_accelerator_rows([r for r in rows if r["platform"] != "cpu"])
  by_key = {(r["mode"], r["platform"], r["dtype"]): r for r in rows}
  depth = config.model.depth
  for mode in ("agent", "joint", "shared"):
    # Forward stem (2 convs) + the standalone agent's CONV per block in the train step, again
    # in the eval step (the shared agent's CONV is two matmuls around shifts).
    per_forward = 2 + (0 if mode == "shared" else depth)
    assert by_key[(mode, "cuda", "float32")]["convolutions"] >= 2 * per_forward
    # On CPU devices `auto` takes the cpu set: float32 convolutions forward and for input
    # gradients only (kernel gradients are matmuls), bf16 ones all matmuls.
    cpu = by_key[(mode, "cpu", "float32")]
    assert cpu["kernels"] == "cpu" and cpu["ok"]
    assert 0 < cpu["convolutions"] < by_key[(mode, "cuda", "float32")]["convolutions"]
    assert by_key[(mode, "cpu", "bfloat16")]["convolutions"] == 0
    # FLOPs are those of the plain ops, whichever set the platform runs.
    assert cpu["flops"] == by_key[(mode, "cuda", "float32")]["flops"]


def test_unknown_mode_is_rejected():
  with pytest.raises(ValueError, match="--modes"):
    lowering.run(load_config("tiny_config"), platforms=("cuda",), modes=("cnn",))


@pytest.mark.slow
@pytest.mark.parametrize("config_name", ["vits_cifar100", "vitb_cifar100"])
def test_paper_configs_lower_for_gpu_and_tpu(config_name):
  """The command of the acceptance test, as a program: every line ok, convolutions, no callbacks."""
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "vitboot_jax.tools.perf.lowering",
      f"--config={ROOT / 'configs' / config_name}.py",
      "--platforms=cuda,tpu",
      "--batch=8",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  check_accelerator_rows(rows)
  # The paper's ViT-S trains at ~8 GFLOP per image (3x its 2.7 GFLOP forward).
  if config_name == "vits_cifar100":
    vit = next(r for r in rows if r["mode"] == "vit")
    assert 7.5e9 < vit["flops_per_image"] < 8.5e9
