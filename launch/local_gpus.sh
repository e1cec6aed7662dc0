#!/usr/bin/env bash
# One node, all its GPUs, one process (JAX drives every local GPU from one process).
#   bash launch/local_gpus.sh configs/vits_cifar100.py workdirs/vits_c100 [--config.x=y ...]
set -euo pipefail
config=${1:?usage: local_gpus.sh CONFIG WORKDIR [overrides...]}
workdir=${2:?usage: local_gpus.sh CONFIG WORKDIR [overrides...]}
shift 2
# bf16 compute on GPUs; params and optimizer state stay float32.
exec python -m vitboot_jax.main --config="$config" --workdir="$workdir" \
  --config.compute_dtype=bfloat16 "$@"
