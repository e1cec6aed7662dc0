#!/usr/bin/env bash
# What a lent GPU machine (JAX, flax, optax, orbax, torch there; no TensorFlow, ml-collections or
# internet) needs from here, packed into the ignored folder carry/ (about 53 MB):
#   carry/cifar10_10pct/{train,test}.npz  the official 10% of CIFAR-10's training split (5,000
#                                         images, in the subset's order) and all 10,000 test
#                                         images, uint8 at 32x32 (tools/prepare_data --npz_dir)
#   carry/cifar10_small.tar.gz            the small-data study's images (6.6 MB): the same JPEG
#                                         files in cifar10_small/{train,val,test}/<class>/, the
#                                         5,000 of the paper's subset, the 5,000 held out for
#                                         validation (val_fraction 0.1) and the 10,000 test images
#                                         (tools/prepare_data --folder_out); one archive, since
#                                         20,000 small files would travel as their disk blocks;
#                                         launch/gpu_small_data.py unpacks it there
#   carry/wheels/*.whl                    the pure-Python packages the machine lacks
# Carry only what a call reads: issue 83's items 1 and 2 (launch/gpu_small_data.py) take
# carry=["carry/cifar10_small.tar.gz", "carry/wheels"]; the 224-px calls carry=["carry"].
#   bash launch/gpu_carry.sh [CIFAR10_FOLDER]   (default ../shared/data/cifar10)
# On the machine, from the repository root: `python -m pip install --no-deps carry/wheels/*.whl`
# (not `pip`: there it belongs to another Python than `python`), then e.g.
# `bash launch/rung3_224.sh OUT/rung3 EPOCHS carry/cifar10_10pct` or
# `bash launch/device_pipeline_check.sh OUT carry/cifar10_10pct` (docs/accelerators.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
folder=$(realpath -m "${1:-../shared/data/cifar10}")
mkdir -p carry/wheels
if [[ ! -f carry/cifar10_10pct/test.npz ]]; then
  python -m vitboot_jax.tools.prepare_data folder "--data_dir=$folder" \
    --npz_dir=carry/cifar10_10pct --train_fraction=0.1
fi
if [[ ! -f carry/cifar10_small.tar.gz ]]; then
  python -m vitboot_jax.tools.prepare_data folder "--data_dir=$folder" \
    --folder_out=carry/cifar10_small --train_fraction=0.1 --val_fraction=0.1
  tar -czf carry/cifar10_small.tar.gz.partial -C carry cifar10_small
  mv carry/cifar10_small.tar.gz.partial carry/cifar10_small.tar.gz
fi
python -m pip download -q --no-deps -d carry/wheels ml-collections==1.1.0
du -sh carry
