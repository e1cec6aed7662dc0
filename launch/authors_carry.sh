#!/usr/bin/env bash
# The authors' code for launch/time_authors.py, in the ignored carry/authors/ (never committed):
# zhfeing/Bootstrapping-ViTs-pytorch at 85f12e9 and zhfeing/cv-lib-PyTorch at its tag
# bootstrapping_vits, exported from their git directories (a session gets them with its `fetch`
# tool: github:zhfeing/Bootstrapping-ViTs-pytorch and github:zhfeing/cv-lib-PyTorch).
#   bash launch/authors_carry.sh [VIT_GIT_DIR] [CVLIB_GIT_DIR]
#   (default /work/.mirror/zhfeing+Bootstrapping-ViTs-pytorch/repo and .../zhfeing+cv-lib-PyTorch/repo)
# Then on a lent GPU: python launch/time_authors.py ... (docs/accelerators.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
vit=${1:-/work/.mirror/zhfeing+Bootstrapping-ViTs-pytorch/repo}
cvlib=${2:-/work/.mirror/zhfeing+cv-lib-PyTorch/repo}
export_tree() {  # GIT_DIR REVISION NAME
  if ! git --git-dir="$1" rev-parse -q --verify "$2^{commit}" >/dev/null; then
    echo "authors_carry.sh: $1 has no $2; fetch the repository again" >&2
    exit 2
  fi
  rm -rf "carry/authors/$3"
  mkdir -p "carry/authors/$3"
  git --git-dir="$1" archive "$2" | tar -x -C "carry/authors/$3"
  echo "carry/authors/$3: $(git --git-dir="$1" rev-parse --short "$2^{commit}")"
}
export_tree "$vit" 85f12e9 Bootstrapping-ViTs-pytorch
export_tree "$cvlib" bootstrapping_vits cv-lib-PyTorch
du -sh carry/authors
