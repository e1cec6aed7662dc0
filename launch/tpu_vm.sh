#!/usr/bin/env bash
# A Cloud TPU VM pod slice: the same command on every worker, one process per host.
#   bash launch/tpu_vm.sh TPU_NAME ZONE configs/vitb_imagenet.py:subset=0.1 gs://BUCKET/vitb_in10 \
#     --config.data.dir=gs://BUCKET/tfds
# Needs the repository checked out at ~/vitboot_jax on every worker (first run installs it).
# The workdir should be a gs:// path so every host sees the same checkpoints.
set -euo pipefail
tpu=${1:?usage: tpu_vm.sh TPU_NAME ZONE CONFIG WORKDIR [overrides...]}
zone=${2:?usage: tpu_vm.sh TPU_NAME ZONE CONFIG WORKDIR [overrides...]}
config=${3:?usage: tpu_vm.sh TPU_NAME ZONE CONFIG WORKDIR [overrides...]}
workdir=${4:?usage: tpu_vm.sh TPU_NAME ZONE CONFIG WORKDIR [overrides...]}
shift 4
extra=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="
  cd ~/vitboot_jax && pip install -q -e '.[tpu,tfdata]' &&
  python -m vitboot_jax.main --config='$config' --workdir='$workdir' --distributed \
    --config.compute_dtype=bfloat16 $extra"
