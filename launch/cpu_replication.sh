#!/usr/bin/env bash
# CPU-scale replication of the paper's claim: every method (ViT, agent, joint, shared with and
# without Align, DrLoc, impulse/mimetic init, shared + DrLoc, Table 4's joint rows) on 10% of
# CIFAR-10 at 32 px, equal epochs and flags, every seed; then ROOT/table.md, ROOT/table.json and
# ROOT/curves.png.
#   bash launch/cpu_replication.sh [ROOT] [EPOCHS] [SEEDS] [flags of tools/sweep/__main__.py ...]
#   bash launch/cpu_replication.sh workdirs/cpu_replication 10 0,1 --data_dir=/data/cifar10
#   bash launch/cpu_replication.sh ROOT 10 0,1 --config=configs/cifar10_tokens16.py  # 16x16 tokens
# --config=configs/quickstart.py (the default) or configs/cifar10_tokens16.py picks the sweep's
# table (replication or replication_tokens16). Defaults: workdirs/cpu_replication (16x16
# tokens: workdirs/cpu_replication_tokens16), 10 epochs, seeds 0,1. Relative paths are taken
# from the repository root. Re-running skips finished runs and resumes an interrupted one.
# Log: ROOT/replication.log.
set -euo pipefail
root=${1:-}
epochs=${2:-10}
seeds=${3:-0,1}
shift $(($# < 3 ? $# : 3))
table=replication
args=()
for a in "$@"; do
  case "$a" in
    --config=configs/quickstart.py) table=replication ;;
    --config=configs/cifar10_tokens16.py) table=replication_tokens16 ;;
    --config=*) echo "cpu_replication.sh: no replication table for $a" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
[[ -n "$root" ]] || root=workdirs/cpu_$table
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$root"
python -m vitboot_jax.tools.sweep --table="$table" --root="$root" --epochs="$epochs" \
  --seeds="$seeds" --run ${args[@]+"${args[@]}"} 2>&1 | tee -a "$root/replication.log"
