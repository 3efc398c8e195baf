#!/usr/bin/env bash
# The CPU backend's comparison against PyTorch's Gloo for two tensorcomm
# builds in one call on one machine (a change that must not move speed):
# BEFORE with Gloo beside it, then AFTER, then each again without Gloo, so
# both builds' ratios use the same Gloo numbers and each build has two
# runs for the spread. Shaped by GLOO_OPS, GLOO_RANKS, GLOO_END,
# GLOO_FACTOR, GLOO_ITERS, GLOO_TRANSPORTS and ROUNDS (1: skip the repeat).
# Usage: bash gloo-ab.sh BEFORE_BINARY AFTER_BINARY [OUTDIR]
set -uo pipefail
dir="$(cd "$(dirname "$0")" && pwd)"
before="$1" after="$2" out="${3:-${OUT:-/tmp}}"
common=(--ops "${GLOO_OPS:-all_reduce,broadcast}" --ranks "${GLOO_RANKS:-2,4,8}" -b 8
  -e "${GLOO_END:-32M}" -f "${GLOO_FACTOR:-4}" --iters "${GLOO_ITERS:-20}" --warmup 5
  --transports "${GLOO_TRANSPORTS:-shm,tcp}")
run() { # name binary [extra args]
  local name="$1" bin="$2"; shift 2
  local t0=$SECONDS
  python3 "$dir/compare_gloo.py" --tensorcomm "$bin" "${common[@]}" "$@" \
    --json-out "$out/$name.jsonl" > "$out/$name.txt" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"
}
run before-1 "$before"
run after-1 "$after" --no-gloo
if [ "${ROUNDS:-2}" -ge 2 ]; then
  run after-2 "$after" --no-gloo
  run before-2 "$before" --no-gloo
fi
