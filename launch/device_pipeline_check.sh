#!/usr/bin/env bash
# The dataset-on-the-device pipeline on a GPU/TPU host without TensorFlow (issue 43's evidence):
#   bash launch/device_pipeline_check.sh OUT [NPZ_DIR]
# 1. devices.txt: jax and its devices; whether TensorFlow imports (it need not).
# 2. NPZ_DIR/{train,test}.npz: used as is; else packed here from an image folder of CIFAR-10
#    (${VITBOOT_SHARED:-../shared}/data/cifar10, 10% of train + all of test, with PIL), else
#    class-coloured noise of CIFAR's shape (5,000 + 1,000 images).
# 3. run_a: `main` on CONFIG (default configs/vits_cifar100.py, ViT-S + Agent-S at 224 px, batch
#    64) with pipeline=device for STEPS steps (default 300), an evaluation every STEPS/2, an
#    orbax checkpoint every CKPT (default 100).
# 4. run_b: the same command, a SIGTERM once checkpoint CKPT exists, the same command again to
#    the end; resume.json compares its losses and evaluations with run_a's.
# 5. run_k1: run_a's command with one step a call (config.steps_per_call=1; run_a runs the
#    platform's default, 8 on accelerators, or K); calls.json compares its losses at every logged
#    step and its final evaluation with run_a's, against the tolerances written below.
# 6. bench.jsonl: benchmark --loop_steps (the loop with the device feed vs the step alone).
# summary.json gathers the numbers. Each part is time-boxed (PART_S, default 240 s); compiled
# programs are cached in JAX_COMPILATION_CACHE_DIR (default /tmp/vitboot_jax_cache) so runs after
# the first skip most compilation. A toy check on CPU:
#   CONFIG=tests/tiny_config.py STEPS=12 CKPT=4 K=4 EXTRA="--config.data.eval_batch_size=40" \
#     JAX_PLATFORMS=cpu bash launch/device_pipeline_check.sh /tmp/check
set -uo pipefail
out=$(realpath -m "${1:?usage: device_pipeline_check.sh OUT [NPZ_DIR]}")
npz=$(realpath -m "${2:-$out/npz}")
config=${CONFIG:-configs/vits_cifar100.py}
steps=${STEPS:-300}
ckpt=${CKPT:-100}
part_s=${PART_S:-240}
shared=${VITBOOT_SHARED:-../shared}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
shared=$(realpath -m "$shared")
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export JAX_PLATFORMS=${JAX_PLATFORMS-}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/vitboot_jax_cache}
run() {  # run NAME COMMAND...: time-boxed, output to OUT/NAME, one status line on stdout.
  local name=$1 start=$SECONDS
  shift
  timeout "$part_s" "$@" >"$out/$name" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$out/parts.txt"
  return $rc
}
: >"$out/parts.txt"
run devices.txt python -c "
import jax; print(jax.__version__, jax.devices())
try:
  import tensorflow; print('tensorflow', tensorflow.__version__)
except ImportError as e:
  print('no tensorflow:', e)"

if [[ ! -f $npz/train.npz ]]; then
  if [[ -d $shared/data/cifar10/train ]]; then
    run pack.log python -m vitboot_jax.tools.prepare_data folder "--data_dir=$shared/data/cifar10" \
      "--npz_dir=$npz" --train_fraction=0.1
  else
    run pack.log python -c "
import numpy as np
from vitboot_jax.data import npz
rng = np.random.default_rng(0)
for split, n in (('train', 5000), ('test', 1000)):
  labels = np.arange(n) % 10
  colour = np.stack([labels * 20, 255 - labels * 20, np.full(n, 100)], -1)[:, None, None]
  images = np.clip(rng.integers(0, 60, (n, 32, 32, 3)) + colour, 0, 255).astype(np.uint8)
  npz.write_npz('$npz/' + split + '.npz', images, labels)
print('synthetic')"
  fi
fi

flags=("--config=$config" --config.data.name=npz "--config.data.dir=$npz"
  --config.data.pipeline=device --config.data.num_classes=10 --config.data.normalisation=cifar10
  --config.data.train_fraction=1.0 "--config.total_steps=$steps"
  "--config.eval_every_steps=$((steps / 2))" "--config.checkpoint_every_steps=$ckpt"
  --config.log_every_steps=10 ${EXTRA:-})
main=(python -m vitboot_jax.main "${flags[@]}" "--config.steps_per_call=${K:-0}")
rm -rf "$out/run_a" "$out/run_b" "$out/run_k1"
run run_a.log "${main[@]}" "--workdir=$out/run_a"

start=$SECONDS
"${main[@]}" "--workdir=$out/run_b" >"$out/run_b1.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null && ((SECONDS - start < part_s)); do
  if [[ -d $out/run_b/checkpoints/$ckpt ]]; then
    kill -TERM "$pid"
    break
  fi
  sleep 0.2
done
wait "$pid"
echo "run_b1.log: exit $? after SIGTERM in $((SECONDS - start)) s" | tee -a "$out/parts.txt"
run run_b2.log "${main[@]}" "--workdir=$out/run_b"
run run_k1.log "${main[@]}" --config.steps_per_call=1 "--workdir=$out/run_k1"

# resume.json: run_b (SIGTERM, resumed) against run_a. calls.json: run_k1 (one step a call)
# against run_a. K steps a call run the same program as K single steps, but XLA fuses the scan's
# body otherwise: values agree to rounding, not bits. Tolerances from that rounding: bf16 (8
# significant bits) moves a logit by up to 2^-9 relative, ~0.2% of a loss, and Adam's update
# lr*m/(sqrt(v)+eps) turns a rounding-level gradient difference near zero into an O(lr) step
# (float32 on CPU: 0.2% of the shared step's entries after 4 steps, tests/test_steps_per_call.py),
# so the runs drift apart as two roundings of one run do: 1% on each logged loss up to step 50, 3%
# after it (a batch's loss moves ~10% step to step), each model's final top-1 within 1.5 points.
python - "$out" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def read(name, file):
  path = out / name / file
  return path.read_text() if path.exists() else None
def losses(name):  # {(step, key): value} of the logged training losses.
  keys = ("train/loss_vit", "train/loss_agent")
  records = [json.loads(l) for l in (read(name, "metrics.jsonl") or "").splitlines()]
  return {(r["step"], k): r[k] for r in records for k in keys if k in r}
def rel_diffs(x, y):
  return {key: abs(x[key] - y[key]) / max(abs(x[key]), 1e-12) for key in sorted(set(x) & set(y))}
final = {n: json.loads(read(n, "final.json") or "{}") for n in ("run_a", "run_b", "run_k1")}
fa, fb, fk = final["run_a"], final["run_b"], final["run_k1"]
la = losses("run_a")

resumed = rel_diffs(la, losses("run_b"))
(out / "resume.json").write_text(json.dumps({
  "resumed_from_step": fb.get("resumed_from_step"),
  "steps_compared": len(resumed),
  "max_rel_diff_train_loss": max(resumed.values(), default=None),
  "final_eval_a_b": {k: (fa.get(k), fb.get(k)) for k in ("top1_vit", "top1_agent", "ce_vit", "ce_agent")},
  "train_seconds_a": fa.get("train_seconds_this_run"),
}) + "\n")

calls = rel_diffs(la, losses("run_k1"))
early = [v for (step, _), v in calls.items() if step <= 50]
late = [v for (step, _), v in calls.items() if step > 50]
top1 = {k: (fa.get(k), fk.get(k)) for k in ("top1_vit", "top1_agent") if k in fa or k in fk}
diffs = [abs(x - y) * 100 for x, y in top1.values() if None not in (x, y)]
(out / "calls.json").write_text(json.dumps({
  "steps_per_call_a": json.loads(read("run_a", "config.json") or "{}").get("steps_per_call"),
  "losses_compared": len(calls),
  "max_rel_loss_diff_to_step_50": max(early, default=None),
  "max_rel_loss_diff_after_50": max(late, default=None),
  "final_top1_a_k1": top1,
  "max_top1_diff_points": max(diffs, default=None),
  "within_tolerance": bool(calls) and bool(diffs) and max(early, default=0) <= 0.01
  and max(late, default=0) <= 0.03 and max(diffs) <= 1.5,
}) + "\n")
EOF
cat "$out/resume.json" "$out/calls.json"

bench=(python -m vitboot_jax.tools.perf.benchmark "${flags[@]}" --modes=shared --steps=20
  --warmup=3 "--loop_steps=${LOOP_STEPS:-200}")
run bench.jsonl "${bench[@]}"
grep -h '"mode"' "$out/bench.jsonl" | cut -c1-600

python - "$out" >"$out/summary.json" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "bench.jsonl").read_text().splitlines() if l.startswith("{")]
mode = next((r for r in rows if "mode" in r), {})
summary = {
  "devices": (out / "devices.txt").read_text().strip().splitlines(),
  "parts": (out / "parts.txt").read_text().strip().splitlines(),
  "resume": json.loads((out / "resume.json").read_text() or "{}"),
  "steps_per_call": json.loads((out / "calls.json").read_text() or "{}"),
  "step_s": mode.get("step_s"),
  "loop_step_s": mode.get("loop_step_s"),
  "loop_data_s": mode.get("loop_data_s"),
  "loop_over_step": (mode["loop_step_s"] / mode["step_s"]) if mode.get("loop_step_s") else None,
}
print(json.dumps(summary, indent=2))
EOF
cat "$out/summary.json"
