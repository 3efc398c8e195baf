#!/bin/bash
# Interleaved A/B: base and new alternately, for each N, R repeats.
out=/tmp/oversub-ab.txt; : > $out
for rep in 1 2 3; do
  for n in 2 4 8; do
    for b in tc-base tc-new; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      timeout 300 /tmp/$b bench --op all_reduce --backend cpu -n $n -b 8 -e 64K -f 8 --iters 2000 --warmup 200 2>&1 \
        | awk -v b=$b -v n=$n -v rep=$rep -v load=$load '$1 ~ /^[0-9]+$/ && $4=="all_reduce" {print b, n, rep, load, $1, $5, $8}' >> $out
    done
  done
done
echo finished >> $out
