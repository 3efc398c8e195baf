#!/usr/bin/env bash
# The sweeps behind the CPU backend's thresholds (cpu/algorithms/mod.rs),
# each a series of `tensorcomm bench` runs with one tuning knob forced.
# Usage: bash bench/cpu_sweeps.sh [path/to/tensorcomm] [what]
#   what: arena-threads | arena-chunk | arena-threshold | tcp-algorithms |
#         tcp-lanes | ring-segments | small | all (default)
# REPS=N (default 1) repeats each sweep N times, interleaved, to show the noise.
# Results go to stdout; bench/results/*.txt hold the ones quoted in code.
set -uo pipefail
tc="${1:-target/release/tensorcomm}"
what="${2:-all}"
run() { "$tc" bench --op all_reduce --iters 30 --warmup 5 "$@" | grep -v '^#\|size(B)'; }
want() { [ "$what" = all ] || [ "$what" = "$1" ]; }

if want arena-threads; then
  for n in 2 4 8; do for th in 2 3 4 6 8; do
    echo "## shm ranks=$n threads=$th"
    TENSORCOMM_SHM_ARENA_THREADS=$th run -n "$n" -b 256K -e 32M -f 2 --transport shm
  done; done
fi
if want arena-chunk; then
  # Threads per rank: half and all of the rank's share of the cores.
  for rep in $(seq "${REPS:-1}"); do for n in 4 8; do
    own=$(( $(nproc) / n )); [ "$own" -ge 1 ] || own=1
    for chunk in 1M 2M 4M 8M; do for th in $(( (own + 1) / 2 )) "$own"; do
      echo "## shm ranks=$n chunk=$chunk threads=$th rep=$rep"
      TENSORCOMM_SHM_ARENA_CHUNK=$chunk TENSORCOMM_SHM_ARENA_THREADS=$th \
        run -n "$n" -b 2M -e 32M -f 4 --transport shm
    done; done
  done; done
fi
if want arena-threshold; then
  for n in 2 4 8; do
    echo "## shm ranks=$n arena"; TENSORCOMM_SHM_ARENA_MIN=0 run -n "$n" -b 1K -e 512K -f 2 --transport shm
    echo "## shm ranks=$n transport"; TENSORCOMM_SHM_ARENA_MIN=1G run -n "$n" -b 1K -e 512K -f 2 --transport shm
  done
fi
if want tcp-algorithms; then
  for n in 2 3 4 6 8 16; do for alg in direct halving_doubling ring; do
    echo "## tcp ranks=$n alg=$alg"
    TENSORCOMM_CPU_ALL_REDUCE=$alg run -n "$n" -b 8K -e 32M -f 4 --transport tcp
  done; done
fi
if want tcp-lanes; then
  for n in 2 4 8; do for l in 1 2 3 4; do
    echo "## tcp ranks=$n lanes=$l"
    TENSORCOMM_TCP_LANES=$l run -n "$n" -b 256K -e 32M -f 2 --transport tcp
  done; done
fi
if want ring-segments; then
  for n in 4 8; do for seg in 256K 512K 1M 2M; do
    echo "## tcp ranks=$n ring segment=$seg"
    TENSORCOMM_RING_SEGMENT=$seg TENSORCOMM_CPU_ALL_REDUCE=ring run -n "$n" -b 2M -e 32M -f 2 --transport tcp
  done; done
fi
if want small; then
  for tr in tcp shm; do for n in 2 3 4 6 8; do for alg in direct halving_doubling ring; do
    echo "## $tr ranks=$n alg=$alg"
    TENSORCOMM_CPU_ALL_REDUCE=$alg run -n "$n" -b 8 -e 16K -f 4 --transport "$tr"
  done; done; done
fi
