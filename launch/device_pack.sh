#!/usr/bin/env bash
# Pack a results folder into what a lent device machine sends back (at most 8 files of 16 MiB,
# no deeper than OUT/a/b/file): the summary files at SRC's top level, copied as they are, and
# one archive of everything else that is text or an image (logs, metrics.jsonl, config.json,
# final.json, data.json, tables, curves), never checkpoints, compilation caches or datasets.
#   bash launch/device_pack.sh SRC OUT
#   BUDGET_S=400 bash launch/rung3_224.sh /tmp/rung3 40 carry/cifar10_10pct; \
#     bash launch/device_pack.sh /tmp/rung3 $OUT
# Prints what it packed; a summary file over 16 MiB goes into the archive only.
set -uo pipefail
src=$(realpath -m "${1:?usage: device_pack.sh SRC OUT}")
out=$(realpath -m "${2:?usage: device_pack.sh SRC OUT}")
[[ -d $src ]] || { echo "device_pack.sh: $src is not a folder" >&2; exit 2; }
mkdir -p "$out"
limit=$((16 * 1024 * 1024))
summaries=(table.md table.json curves.png summary.json rows.txt parts.txt representations.log)
for name in "${summaries[@]}"; do
  f=$src/$name
  [[ -f $f ]] && (($(stat -c %s "$f") <= limit)) && cp "$f" "$out/"
done
archive=$out/$(basename "$src").tar.gz
(cd "$(dirname "$src")" && find "$(basename "$src")" -type f \
  -not -path '*/checkpoints/*' -not -path '*/jax_cache/*' -not -path '*/.tmp*' \
  \( -name '*.log' -o -name '*.txt' -o -name '*.json' -o -name '*.jsonl' -o -name '*.md' \
  -o -name '*.png' -o -name 'events.out.tfevents.*' \) -print0 |
  tar -czf "$archive" --null -T -)
if (($(stat -c %s "$archive") > limit)); then
  echo "device_pack.sh: $archive is over 16 MiB and will not come back; pack fewer files" >&2
fi
ls -l "$out"
