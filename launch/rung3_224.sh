#!/usr/bin/env bash
# The third rung of the replication ladder: the paper's ViT-S and Agent-S rows at 224 px with the
# official recipe (configs/vits_cifar10.py unchanged but for the data and the epochs) on 10% of
# CIFAR-10, every row side by side on one accelerator, through the product's own `main`.
#   bash launch/rung3_224.sh ROOT EPOCHS NPZ_DIR [flags of tools/sweep/__main__.py ...]
#   bash launch/rung3_224.sh workdirs/rung3_224 240 data/cifar10_10pct
# NPZ_DIR holds train.npz (the official 10% subset: 5,000 images, in the subset's order) and
# test.npz (all 10,000), packed once where the images are:
#   python -m vitboot_jax.tools.prepare_data folder --data_dir=../shared/data/cifar10 \
#     --npz_dir=NPZ_DIR --train_fraction=0.1
# so each run trains on all of train.npz (data.train_fraction=1.0 on the packed subset: the same
# images in the same order as train_fraction=0.1 on the full split) with the dataset on the devices
# (data.pipeline=device: no TensorFlow needed). Rows (tools/sweep/__main__.py, table replication_224): ViT
# alone, Agent alone, joint, shared with Align and shared as the authors' code (align=none), one
# process each (one per row, sharing the accelerator), seed(s) SEEDS (default 0). Evaluations of
# the whole test split at every 10% of training when EPOCHS is a multiple of 10 (else every
# epoch), for curves.
# Each row runs under `timeout -s TERM BUDGET_S` (default: none), so a time-boxed machine gets
# every row's checkpoint and metrics back; re-running the same command resumes every row. SIGTERM
# or Ctrl-C to this script reaches every row (each saves and exits). Then ROOT/table.md,
# ROOT/table.json and ROOT/curves.png; logs in ROOT/<row>.log. Then, for the newest checkpoints of
# every row with a ViT, tools/study/representations (how alike the ViT's tokens are, and the hint's loss
# beside its floor) into ROOT/representations.log, its last line JSON, within REPR_S seconds.
# TABLE=mechanism_tokens16 runs that table's rows the same way (issue 53's queue, item 5: the
# mechanism study at 16x16 tokens; its teacher rows read the agent row's run, so run ROWS="agent"
# first, then the rest).
# Env: DRY=1 prints the commands and runs nothing; ROWS (all five, e.g. ROWS="vit agent"); SEEDS (0), BUDGET_S (0: no limit), MEM_FRACTION (the accelerator memory each process may
# take, default 0.9 / number of rows), JAX_COMPILATION_CACHE_DIR (ROOT/jax_cache), REPR_S (90;
# 0 skips the representations), REPR_IMAGES (256 test images).
set -uo pipefail
root=$(realpath -m "${1:?usage: rung3_224.sh ROOT EPOCHS NPZ_DIR [sweep flags]}")
epochs=${2:?usage: rung3_224.sh ROOT EPOCHS NPZ_DIR [sweep flags]}
npz=$(realpath -m "${3:?usage: rung3_224.sh ROOT EPOCHS NPZ_DIR [sweep flags]}")
shift 3
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -n ${TABLE:-} && -z ${ROWS:-} ]]; then
  echo "rung3_224.sh: TABLE=$TABLE needs ROWS (its rows to run side by side)" >&2
  exit 2
fi
read -r -a rows <<<"${ROWS:-vit agent joint shared_align shared_noalign}"
seeds=${SEEDS:-0}
budget=${BUDGET_S:-0}
for f in train test; do
  if [[ ! -f $npz/$f.npz ]]; then
    echo "rung3_224.sh: $npz/$f.npz not found; pack it first: python -m" \
      "vitboot_jax.tools.prepare_data folder --data_dir=DIR --npz_dir=$npz --train_fraction=0.1" >&2
    exit 2
  fi
done
if ((epochs % 10 == 0)); then
  evals=(--override=--config.eval_every_epochs=$((epochs / 10)))
else
  evals=(--override=--config.eval_every_epochs=1)
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export JAX_PLATFORMS=${JAX_PLATFORMS-}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$root/jax_cache}
# Several processes on one accelerator: none may take the default 75% of its memory.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${MEM_FRACTION:-$(python -c "print(round(0.9 / ${#rows[@]}, 3))")}
sweep=(python -m vitboot_jax.tools.sweep "--table=${TABLE:-replication_224}" "--root=$root"
  "--seeds=$seeds" --override=--config.data.pipeline=device
  --override=--config.data.name=npz "--override=--config.data.dir=$npz"
  --override=--config.data.train_fraction=1.0 "--override=--config.num_epochs=$epochs"
  "${evals[@]}" "$@")
if [[ -n ${DRY:-} ]]; then  # DRY=1: print every row's command and the table so far, run nothing.
  "${sweep[@]}"
  exit
fi
mkdir -p "$root"
pids=()
stop() {  # Every row saves its checkpoint and exits; the table below still gets written.
  kill -TERM "${pids[@]}" 2>/dev/null
}
trap stop TERM INT
start=$SECONDS
for row in "${rows[@]}"; do
  if ((budget > 0)); then
    timeout -s TERM -k 120 "$budget" "${sweep[@]}" "--rows=$row" --run >"$root/$row.log" 2>&1 &
  else
    "${sweep[@]}" "--rows=$row" --run >"$root/$row.log" 2>&1 &
  fi
  pids+=($!)
done
status=0
for i in "${!rows[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  while ((rc > 128)) && kill -0 "${pids[$i]}" 2>/dev/null; do  # wait was cut by our own trap.
    wait "${pids[$i]}"
    rc=$?
  done
  note=""
  for seed in ${seeds//,/ }; do  # A row cut after its run finished (writing its table) is done.
    if ((rc != 0)) && [[ -f $root/${rows[$i]}_seed$seed/final.json ]]; then
      note=" (seed $seed finished: final.json written)"
    fi
  done
  echo "${rows[$i]}: exit $rc after $((SECONDS - start)) s$note" | tee -a "$root/rows.txt"
  ((rc == 0)) || status=$rc
done
"${sweep[@]}" >"$root/table.log" 2>&1
sed -n '/^# /,$p' "$root/table.log"
repr_s=${REPR_S:-90}
runs=()
for row in joint "${rows[@]}"; do  # This call's rows with a ViT, joint first.
  [[ $row == agent || " ${rows[*]} " != *" $row "* ]] && continue
  [[ " ${runs[*]} " == *"/${row}_seed"* ]] && continue
  for seed in ${seeds//,/ }; do
    [[ -d $root/${row}_seed$seed/checkpoints ]] && runs+=("--workdir=$root/${row}_seed$seed")
  done
done
if ((repr_s > 0 && ${#runs[@]} > 0)); then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 timeout -s TERM "$repr_s" python -m \
    vitboot_jax.tools.study.representations "${runs[@]}" --steps=last \
    "--images=${REPR_IMAGES:-256}" >"$root/representations.log" 2>&1 ||
    echo "representations: exit $? (ROOT/representations.log)" | tee -a "$root/rows.txt"
  grep -v '^\[' "$root/representations.log" | grep 'top-1\|hint loss' || true
fi
exit "$status"
