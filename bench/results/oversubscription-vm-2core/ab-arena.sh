#!/bin/bash
# Interleaved A/B(/C): the binaries take turns, the order rotating by
# round, for N = 2, 4, 8 ranks; one line per (binary, N, round, size):
#   label N round load1 bytes time_us check
# Usage: ab-arena.sh OUT ROUNDS label=binary [label=binary ...]
out=$1; rounds=$2; shift 2
bins=("$@")
: > "$out"
for rep in $(seq 1 "$rounds"); do
  for n in 2 4 8; do
    k=${#bins[@]}
    for i in $(seq 0 $((k - 1))); do
      pair=${bins[$(( (i + rep) % k ))]}
      label=${pair%%=*}; bin=${pair#*=}
      load=$(cut -d' ' -f1 /proc/loadavg)
      timeout 600 "$bin" bench --op all_reduce --backend cpu -n "$n" -b 8 -e 4M -f 8 --iters 200 --warmup 20 2>&1 \
        | awk -v b="$label" -v n="$n" -v rep="$rep" -v load="$load" '$1 ~ /^[0-9]+$/ && $4=="all_reduce" {print b, n, rep, load, $1, $5, $8}' >> "$out"
    done
  done
done
echo finished >> "$out"
