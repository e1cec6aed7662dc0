"""The host CPU's flags, model and widest vector ISA; the bfloat16 warning on CPUs without bf16."""

import pytest

from vitboot_jax.cpu import features as cpu_features

AVX2_ONLY = "fpu vme sse sse2 avx fma avx2 vaes"
AMX = "fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"


def _cpuinfo(tmp_path, flags: str):
  path = tmp_path / "cpuinfo"
  path.write_text(
    f"processor\t: 0\nvendor_id\t: TestVendor\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\n"
    f"processor\t: 1\nvendor_id\t: TestVendor\nmodel name\t: Test CPU\nflags\t\t: {flags}\n"
  )
  return path


def test_cpu_flags_reads_the_first_processor(tmp_path):
  flags = cpu_features.cpu_flags(_cpuinfo(tmp_path, AVX2_ONLY))
  assert flags == frozenset(AVX2_ONLY.split())


def test_cpu_flags_unreadable_or_without_flags(tmp_path):
  assert cpu_features.cpu_flags(tmp_path / "absent") is None
  empty = tmp_path / "empty"
  empty.write_text("processor\t: 0\n")
  assert cpu_features.cpu_flags(empty) is None


def test_bf16_on_avx2_only_warns_with_the_fix(tmp_path):
  message = cpu_features.bf16_warning(
    "bfloat16", cpu_features.cpu_flags(_cpuinfo(tmp_path, AVX2_ONLY))
  )
  assert message is not None
  assert "--config.compute_dtype=float32" in message and "amx_bf16" in message


@pytest.mark.parametrize(
  "dtype, flags",
  [
    ("bfloat16", frozenset(AMX.split())),
    ("bfloat16", frozenset({"avx2", "avx512_bf16"})),
    ("bfloat16", None),  # Unknown CPU: no claim.
    ("float32", frozenset(AVX2_ONLY.split())),
  ],
)
def test_no_warning_where_bf16_is_native_unknown_or_unused(dtype, flags):
  assert cpu_features.bf16_warning(dtype, flags) is None


def test_this_host_flags_parse_on_linux():
  flags = cpu_features.cpu_flags()
  if flags is None:
    pytest.skip("no /proc/cpuinfo flags on this host")
  assert "fpu" in flags or any(f.startswith("sse") for f in flags)


def test_cpu_model_and_widest_vector_isa(tmp_path):
  path = _cpuinfo(tmp_path, AVX2_ONLY)
  assert cpu_features.cpu_model(path) == "Test CPU"
  assert cpu_features.widest_vector_isa(cpu_features.cpu_flags(path)) == "avx2"
  assert cpu_features.widest_vector_isa(frozenset(AMX.split())) == "amx_bf16"
  assert cpu_features.widest_vector_isa(frozenset({"avx512f", "avx2"})) == "avx512f"
  assert cpu_features.widest_vector_isa(frozenset({"sse2"})) is None
  assert cpu_features.widest_vector_isa(None) is None
  assert cpu_features.cpu_model(tmp_path / "absent") is None
