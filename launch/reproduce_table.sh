#!/usr/bin/env bash
# Runs every row of one paper table into its own workdir, then prints ours beside the paper's.
#   bash launch/reproduce_table.sh cifar100 workdirs/table1_c100 [--config.compute_dtype=bfloat16 ...]
#   bash launch/reproduce_table.sh imagenet workdirs/table3 --config.data.dir=/data/tfds
# Rows run one after another on this machine; to spread them over a cluster, run the printed
# commands there (python -m vitboot_jax.tools.sweep --table=... --root=... lists them) and
# call the sweep without --run afterwards for the table.
set -euo pipefail
table=${1:?usage: reproduce_table.sh cifar10|cifar100|imagenet|ablation ROOT [overrides...]}
root=${2:?usage: reproduce_table.sh cifar10|cifar100|imagenet|ablation ROOT [overrides...]}
shift 2
args=()
for o in "$@"; do args+=("--override=$o"); done
exec python -m vitboot_jax.tools.sweep --table="$table" --root="$root" --run ${args[@]+"${args[@]}"}
