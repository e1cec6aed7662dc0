"""The step profiler: a real trace of a tiny step, attributed to categorised HLO ops."""

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest

from tests import without_tensorflow
from tests.config_files import load_config
from vitboot_jax.tools.perf import profile_step


def test_parse_hlo_folds_fused_computations_into_their_fusion():
  def layer(x, w):
    return jax.nn.gelu(x @ w, approximate=False).sum()

  x = jnp.ones((64, 32))
  w = jnp.ones((32, 16))
  text = jax.jit(jax.grad(layer, argnums=1)).lower(x, w).compile().as_text()
  instructions = profile_step.parse_hlo(text)
  categories = {profile_step.categorise(e) for e in instructions.values()}
  assert "matmul" in categories, categories
  # The erf of the exact GELU shows up in its own category or fused into the matmul.
  sources = " ".join(e["source"] + " ".join(e["fused_sources"]) for e in instructions.values())
  assert "transpose(" in sources or "jvp(" in sources  # JAX name stacks survive in metadata.


def test_parse_hlo_reads_headers_with_long_parameter_lists():
  """XLA numbers long parameter lists with /*index=N*/ comments, the only "=" in a header."""
  params = ", ".join(f"p{i}: u32[1]" for i in range(7))
  text = (
    f"%fused_xor ({params.replace('p5', '/*index=5*/p5')}) -> u32[8] {{\n"
    "  %p0 = u32[1]{0} parameter(0)\n"
    "  ROOT %x = u32[8]{0} xor(%p0, %p0)\n"
    "}\n\n"
    "ENTRY %main (a: u32[1]) -> u32[8] {\n"
    "  ROOT %loop_xor_fusion = u32[8]{0} fusion(%a), kind=kLoop, calls=%fused_xor\n"
    "}\n"
  )
  fusion = profile_step.parse_hlo(text)["loop_xor_fusion"]
  assert fusion["fused"] == {"parameter", "xor"}, fusion


def test_device_kernels_are_attributed_to_instructions_or_kept_as_library_kernels():
  """On a GPU, kernels in CUDA graphs carry the graph's name (`hlo_op`), XLA's own kernels are
  their instruction's name spelt with "_", and cuBLAS/cuDNN kernels match no instruction."""

  class Kernel(NamedTuple):
    name: str
    stats: tuple

  def entry(opcode, fused=(), source=""):
    return {
      "opcode": opcode,
      "shape": "f32[8]",
      "source": source,
      "fused": set(fused),
      "fused_sources": [],
    }

  instructions = {
    "loop_add_fusion.80": entry("fusion", {"add"}),
    "command_buffer": entry("call"),
    "cudnn-conv.3": entry("custom-call", source="jit(step)/conv_general_dilated"),
  }
  graph = (("hlo_op", "command_buffer"),)

  def kernel(name, stats, ps):
    return profile_step.Event(profile_step.kernel_names(Kernel(name, stats)), ps, kernel=name)

  events = [
    kernel("loop_add_fusion_80", graph, 10),
    kernel("sm90_xmma_gemm_tn_2", graph, 30),
    kernel("fprop", (("hlo_op", "cudnn-conv.3"),), 20),
    kernel("memcpy32_post", graph, 5),
    profile_step.Event(("python frame",), 99),
  ]
  seconds = profile_step.attribute(events, instructions, steps=1)
  assert seconds == pytest.approx(
    {
      "loop_add_fusion.80": 10e-12,
      "sm90_xmma_gemm_tn_2": 30e-12,
      "cudnn-conv.3": 20e-12,
      "memcpy32_post": 5e-12,
    }
  )
  by_category = profile_step.summarise(seconds, instructions, top=0)[0]["by_category"]
  assert by_category == pytest.approx(
    {
      "matmul": 30e-12,
      "convolution": 20e-12,
      "other elementwise": 10e-12,
      "data movement (copy, transpose, pad, slice)": 5e-12,
    }
  )


def test_trace_is_read_and_attributed_without_tensorflow():
  """Accelerator hosts often have jax but no TensorFlow: the profiler must not need it."""
  proc = without_tensorflow.run(
    "import pathlib, tempfile, jax, jax.numpy as jnp\n"
    "from vitboot_jax.tools.perf import profile_step\n"
    "f = jax.jit(lambda x: jnp.tanh(x @ x).sum())\n"
    "x = jnp.ones((128, 128))\n"
    "instructions = profile_step.parse_hlo(f.lower(x).compile().as_text())\n"
    "f(x).block_until_ready()\n"
    "with tempfile.TemporaryDirectory() as d:\n"
    "  with jax.profiler.trace(d):\n"
    "    f(x).block_until_ready()\n"
    "  events = profile_step.read_events(pathlib.Path(d))\n"
    "  seconds = profile_step.attribute(events, instructions, 1)\n"
    "assert 'tensorflow' not in sys.modules\n"
    "print(sorted({profile_step.categorise(instructions[n]) for n in seconds}))\n"
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "matmul" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_profile_of_a_tiny_vit_step_accounts_for_its_time():
  printed = []
  lines = profile_step.run(
    load_config("tiny_config"), mode="vit", batch=8, steps=1, warmup=1, top=5, emit=printed.append
  )
  assert [json.loads(p) for p in printed] == lines
  header, by_category, by_pass, by_model, *ops = lines
  assert header["mode"] == "vit" and header["devices"] == 8 and header["ops_traced"] > 0
  assert header["step_s"] > 0 and header["traced_op_s"] > 0
  total = header["traced_op_s"]
  assert sum(by_category["by_category"].values()) == pytest.approx(total)
  assert sum(by_pass["by_pass"].values()) == pytest.approx(total)
  assert "matmul" in by_category["by_category"]
  assert "backward" in by_pass["by_pass"] and "forward" in by_pass["by_pass"]
  assert 1 <= len(ops) <= 5
  shares = [op["share"] for op in ops]
  assert shares == sorted(shares, reverse=True) and 0 < shares[0] <= 1


@pytest.mark.slow
def test_profile_of_a_tiny_eval_step_has_only_forward_passes():
  config = load_config("tiny_config")
  lines = profile_step.run(
    config, mode="shared", batch=8, steps=1, warmup=1, top=3, evaluation=True, emit=lambda _: None
  )
  header, by_category, by_pass, by_model, *ops = lines
  assert header["step"] == "eval" and header["batch"] == config.data.eval_batch_size
  assert header["ops_traced"] > 0 and "matmul" in by_category["by_category"]
  assert "backward" not in by_pass["by_pass"] and "forward" in by_pass["by_pass"]
  assert {"vit", "agent"} <= set(by_model["by_model"])
