#!/bin/bash
# Usage: BEFORE=binary AFTER=binary ab-two-ranks.sh OUT ROUNDS
# 2 ranks, before/after alternately (order alternating), R rounds.
out=$1; rounds=$2
: > $out
for rep in $(seq 1 $rounds); do
  if [ $((rep % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    b=$([ $v = before ] && echo "$BEFORE" || echo "$AFTER")
    load=$(cut -d' ' -f1 /proc/loadavg)
    busy=$(ps -eo pcpu --sort=-pcpu | sed -n 2p | tr -d ' ')
    nice -n -15 $b bench --op all_reduce --backend cpu -n 2 --sizes 8,4K,64K,2M --iters 2000 --warmup 200 2>&1 | awk -v v=$v -v r=$rep -v l=$load -v busy=$busy '$4=="all_reduce"{print v, 2, r, l, $1, $5, $8, busy}' >> $out
  done
done
