#!/usr/bin/env bash
# CPU-scale replication of the paper's claim: 9 rows (ViT, agent, joint, shared with/without
# Align, DrLoc, impulse/mimetic init, shared + DrLoc) on 10% of CIFAR-10 at 32 px, equal epochs
# and flags, every seed; then ROOT/table.md, ROOT/table.json and ROOT/curves.png.
#   bash launch/cpu_replication.sh [ROOT] [EPOCHS] [SEEDS] [flags of tools/replication.py ...]
#   bash launch/cpu_replication.sh workdirs/cpu_replication 10 0,1 --data_dir=/data/cifar10
# Defaults: workdirs/cpu_replication, 10 epochs, seeds 0,1. Relative paths are taken from the
# repository root. Re-running skips finished runs and resumes an interrupted one. Log:
# ROOT/replication.log. Measured on the 2-core CPU VM: 74.6 min for all 9 rows at 5 epochs and
# 1 seed (~2.1 min per epoch of a mutual row, ~1 min of a single-model row), i.e. ~15 min per
# epoch and seed; 10 epochs x 2 seeds is ~5 h.
set -euo pipefail
root=${1:-workdirs/cpu_replication}
epochs=${2:-10}
seeds=${3:-0,1}
shift $(($# < 3 ? $# : 3))
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$root"
python -m vitboot_jax.tools.replication --root="$root" --epochs="$epochs" --seeds="$seeds" \
  --run "$@" 2>&1 | tee -a "$root/replication.log"
