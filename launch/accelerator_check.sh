#!/usr/bin/env bash
# First run on a new GPU or TPU machine: is it correct there, and how fast?
#   bash launch/accelerator_check.sh [OUT] [CONFIG] [BATCH]
#   bash launch/accelerator_check.sh workdirs/accelerator_check configs/vits_cifar100.py 64
# 1. Fidelity on the accelerator: the golden tests (imported official weights reproduce the
#    authors' outputs), every one, slow included.
# 2. Speed: the benchmark of every mode of CONFIG (default: the paper's ViT-S row) in float32
#    and bfloat16 at BATCH (default: the config's).
# 3. The fast tier of the tests that need no input pipeline (TensorFlow), on the accelerator.
# 4. ViT and shared at 4 x BATCH (256 if BATCH is 0), for throughput.
# 5. Where the ViT and shared steps' time goes, per XLA op or GPU kernel (profile_step).
# The tests run in full float32 there (tests/conftest.py). Results go to OUT (default
# workdirs/accelerator_check): devices.txt, golden.log, bench_*.jsonl, tests.log,
# profile_*.jsonl; each part is time-boxed (CHECK_PART_S, default 600 s), so a part that hangs
# costs only its own results.
# Needs ../shared/reference/golden, or VITBOOT_SHARED pointing at a copy of ../shared.
set -uo pipefail
out=$(realpath -m "${1:-workdirs/accelerator_check}")
config=${2:-configs/vits_cifar100.py}
batch=${3:-0}
part_s=${CHECK_PART_S:-600}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
# The tests pin the CPU unless JAX_PLATFORMS is set; set but empty, jax picks the accelerator.
export JAX_PLATFORMS=${JAX_PLATFORMS-}
run() {  # run NAME COMMAND...: time-boxed, output to OUT/NAME, one status line on stdout.
  local name=$1 start=$SECONDS
  shift
  timeout "$part_s" "$@" >"$out/$name" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s"
}
pytest=(python -m pytest -q -p no:cacheprovider)
run devices.txt python -c "import jax; print(jax.__version__, jax.devices())"
run golden.log "${pytest[@]}" tests/test_golden_models.py
bench=(python -m vitboot_jax.tools.perf.benchmark "--config=$config" --steps=10 --warmup=3)
for dtype in float32 bfloat16; do
  run "bench_${dtype}.jsonl" "${bench[@]}" --modes=vit,agent,joint,shared --dtype="$dtype" \
    --batch="$batch"
done
tests=(tests/test_kernels.py tests/test_steps.py tests/test_methods.py tests/test_models.py
  tests/test_losses.py tests/test_align.py tests/test_conv.py tests/test_softmax_attention.py
  tests/test_attention_chunks.py tests/test_matmul.py tests/test_drloc.py tests/test_entmax.py
  tests/test_pretrained.py tests/test_optim.py tests/test_cnn_baselines.py tests/test_evaluate.py)
run tests.log "${pytest[@]}" -m "not slow" "${tests[@]}"
big=$((batch > 0 ? batch * 4 : 256))
for dtype in float32 bfloat16; do
  run "bench_${dtype}_batch${big}.jsonl" "${bench[@]}" --modes=vit,shared --dtype="$dtype" \
    --batch="$big"
done
for mode in vit shared; do
  run "profile_${mode}.jsonl" python -m vitboot_jax.tools.perf.profile_step "--config=$config" \
    --mode="$mode" --batch="$batch" --steps=3 --warmup=2 --top=15
done
grep -h '"mode"\|"summary"\|peak_matmul' "$out"/bench_*.jsonl | cut -c1-400
head -n 2 "$out"/profile_*.jsonl | cut -c1-400
tail -n 3 "$out/golden.log" "$out/tests.log"
