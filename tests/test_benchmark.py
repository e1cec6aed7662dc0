"""The benchmark tool: JSON lines with every field, on the test devices, in one process."""

import dataclasses
import json

import pytest

from tests.config_files import load_config
from vitboot_jax.tools.perf import benchmark

MODE_KEYS = {
  "mode",
  "batch",
  "image_size",
  "img_per_s",
  "step_s",
  "compile_s",
  "flops_per_step",
  "xla_flops_per_step",
  "flops_per_s",
  "mfu",
  "peak_mem_bytes",
  "devices",
}


@pytest.mark.slow
def test_benchmark_prints_one_json_object_per_line():
  printed = []
  benchmark.run(
    load_config("tiny_config"),
    batch=8,
    steps=2,
    warmup=1,
    modes=("vit", "shared"),
    peak_size=256,  # Small: the test devices are 8 fake CPUs sharing the host's cores.
    emit=printed.append,
  )
  lines = [json.loads(line) for line in "\n".join(printed).splitlines()]
  assert len(lines) == 4  # peak, vit, shared, summary.
  peak, vit, shared, summary = lines
  assert peak["peak_matmul_flops_per_s"] > 0 and peak["matmul_precision"] == "default"
  assert {"cpu_model", "cpu_vector_isa"} <= set(peak)  # The machine beside every figure.
  for row, mode in ((vit, "vit"), (shared, "shared")):
    assert MODE_KEYS <= set(row), MODE_KEYS - set(row)
    assert row["mode"] == mode
    assert row["batch"] == 8 and row["image_size"] == 32 and row["devices"] == 8
    assert row["img_per_s"] > 0 and row["step_s"] > 0 and row["compile_s"] > 0
    assert row["mfu"] > 0
  # Shared trains both models, so its step does strictly more matmul work than the ViT's.
  assert shared["flops_per_step"] > vit["flops_per_step"] > 0
  assert summary["macs_ratio_shared_vit"] == shared["flops_per_step"] / vit["flops_per_step"]
  assert summary["step_ratio_shared_vit"] > 0
  assert summary["align_overhead_pct"] is None  # shared_noalign was not run.


def test_mode_config_sets_mode_align_and_dtype():
  config = load_config("tiny_config")
  noalign = benchmark.mode_config(config, "shared_noalign", batch=8, dtype="bfloat16")
  assert (noalign.mode, noalign.align, noalign.compute_dtype) == ("shared", "none", "bfloat16")
  vit = benchmark.mode_config(config, "vit", batch=8)
  assert (vit.mode, vit.align, vit.batch_size) == ("vit", config.align, 8)
  assert config.mode == "shared" and config.compute_dtype == "float32"  # The input is untouched.


@pytest.mark.slow
def test_kernel_ab_times_both_variants_of_each_mode(monkeypatch):
  from vitboot_jax.cpu import attention_chunks
  from vitboot_jax.cpu import kernels as cpu_kernels
  from vitboot_jax.tools.perf import kernel_ab

  traced = []
  original = attention_chunks.attend_in_chunks
  monkeypatch.setattr(
    attention_chunks, "attend_in_chunks", lambda *a, **k: traced.append(1) or original(*a, **k)
  )
  # A budget of one image: tiny_config's batch of 16 on 8 devices is sliced in two loop steps.
  budgets = dataclasses.replace(cpu_kernels.ATTENTION, train_bytes=1, whole_batch_bytes=0)
  monkeypatch.setattr(cpu_kernels, "ATTENTION", budgets)
  printed = []
  rows = kernel_ab.run(
    load_config("tiny_config"),
    switch="attention_chunks",
    batch=16,
    steps=1,
    warmup=0,
    modes=["vit"],
    emit=printed.append,
  )
  assert [json.loads(line) for line in printed] == rows
  (row,) = rows
  assert row["switch"] == "attention_chunks" and row["mode"] == "vit"
  assert row["images_per_chunk"] == 8
  assert row["step_s_old"] > 0 and row["step_s_new"] > 0
  assert row["speedup"] == row["step_s_old"] / row["step_s_new"]
  assert traced  # The new variant really took the chunked path.


@pytest.mark.slow
def test_kernel_ab_flips_the_kernel_set_and_rejects_unknown_switches():
  from vitboot_jax.tools.perf import kernel_ab

  (row,) = kernel_ab.run(
    load_config("tiny_config"), switch="kernels", batch=8, steps=1, warmup=0, modes=["agent"]
  )
  assert row["switch"] == "kernels" and row["speedup"] > 0
  with pytest.raises(ValueError, match="--switch='nope' is unknown"):
    kernel_ab.run(load_config("tiny_config"), switch="nope", batch=8, steps=1, warmup=0, modes=[])


@pytest.mark.slow
def test_benchmark_times_the_whole_loop_and_a_full_evaluation(image_folder):
  config = load_config("tiny_config", "mode=vit")
  config.data.dir = str(image_folder)
  printed = []
  lines = benchmark.run(
    config,
    batch=16,
    steps=1,
    warmup=0,
    modes=("vit",),
    peak_size=128,
    loop_steps=3,
    eval_split=True,
    emit=printed.append,
  )
  row = lines[1]
  assert json.loads(printed[1]) == row
  assert row["loop_steps"] == 3 and row["loop_step_s"] > 0
  assert 0 < row["loop_data_s"] < row["loop_step_s"]  # Waiting for data is part of the loop.
  assert row["eval_images"] == 40  # Every test image once (10 classes x 4), padding masked out.
  assert row["eval_batch"] == config.data.eval_batch_size
  assert row["eval_img_per_s"] == 40 / row["eval_s"] and row["eval_s_first"] > 0
  assert row["eval_forward_img_per_s"] > 0


@pytest.mark.slow
def test_kernel_ab_compiles_the_new_variant_with_xla_options():
  from vitboot_jax.tools.perf import kernel_ab

  options = kernel_ab.parse_options(["xla_cpu_prefer_vector_width=256", "xla_cpu_use_xnnpack=true"])
  assert options == {"xla_cpu_prefer_vector_width": 256, "xla_cpu_use_xnnpack": True}
  (row,) = kernel_ab.run(
    load_config("tiny_config"),
    switch="xla_options",
    batch=8,
    steps=1,
    warmup=0,
    modes=["vit"],
    xla_options=options,
  )
  assert row["xla_options"] == options and row["speedup"] > 0
  with pytest.raises(ValueError, match="goes with --switch=xla_options"):
    kernel_ab.run(
      load_config("tiny_config"),
      switch="kernels",
      batch=8,
      steps=1,
      warmup=0,
      modes=[],
      xla_options=options,
    )
  with pytest.raises(ValueError, match="is not name=value"):
    kernel_ab.parse_options(["xla_cpu_use_xnnpack"])


@pytest.mark.slow
def test_benchmark_times_the_device_pipelines_evaluation_without_tensorflow(image_folder):
  from tests import without_tensorflow
  from tests.runs import env

  code = (
    "import json\n"
    "from tests.config_files import load_config\n"
    "from vitboot_jax.tools.perf import benchmark\n"
    "config = load_config('tiny_config', 'mode=vit')\n"
    f"config.data.update(dir={str(image_folder)!r}, pipeline='device')\n"
    "lines = benchmark.run(config, batch=16, steps=1, warmup=0, modes=('vit',), peak_size=128,\n"
    "                      loop_steps=2, eval_split=True, emit=lambda line: None)\n"
    "print(json.dumps([lines[1], 'tensorflow' in sys.modules]))\n"
  )
  proc = without_tensorflow.run(code, env=env(8))
  assert proc.returncode == 0, proc.stderr[-3000:]
  row, imported_tf = json.loads(proc.stdout.splitlines()[-1])
  assert not imported_tf
  assert row["eval_images"] == 40  # Every test image once, the device batches' padding masked.
  assert row["eval_img_per_s"] == 40 / row["eval_s"] and row["eval_s_first"] > 0
  assert row["loop_step_s"] > 0


def test_a_cnn_config_is_timed_in_its_own_mode_and_refused_in_a_vits():
  resnet = load_config("configs/cifar_resnet.py:model=resnet20")
  assert benchmark.default_modes(resnet) == ("cnn",)
  assert benchmark.default_modes(load_config("tiny_config")) == benchmark.ALL_MODES
  # Each tool's ViT default (kernel_ab's, profile_step's) gives way to a CNN config's own mode.
  assert benchmark.default_modes(resnet, ("vit", "shared")) == ("cnn",)
  assert benchmark.default_modes(load_config("tiny_config"), ("shared",)) == ("shared",)
  cnn = benchmark.mode_config(resnet, "cnn", batch=8)
  # Its own recipe: SGD, no clipping, the CNN named; only the batch changes.
  assert (cnn.mode, cnn.cnn.name, cnn.optim.name, cnn.batch_size) == ("cnn", "resnet20", "sgd", 8)
  assert cnn.optim.clip_norm == resnet.optim.clip_norm and cnn.loss == resnet.loss
  with pytest.raises(ValueError, match="needs a ViT config"):
    benchmark.mode_config(resnet, "vit", batch=8)
  with pytest.raises(ValueError, match="needs a CNN config"):
    benchmark.mode_config(load_config("tiny_config"), "cnn", batch=8)


@pytest.mark.slow
def test_benchmark_times_the_cifar_resnets_step():
  printed = []
  resnet = load_config("configs/cifar_resnet.py:model=resnet20")
  benchmark.run(
    resnet, batch=8, steps=1, warmup=1, modes=("cnn",), peak_size=256, emit=printed.append
  )
  _, row, summary = (json.loads(line) for line in printed)
  assert row["mode"] == "cnn" and row["img_per_s"] > 0 and row["devices"] == 8
  # 121.21M MACs a train-step image (models/cifar_resnet.py): twice that in FLOPs, 8 images.
  assert row["flops_per_step"] == pytest.approx(2 * 8 * 121.21e6, rel=1e-4)
  assert summary["step_ratio_shared_vit"] is None
