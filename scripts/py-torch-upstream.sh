#!/usr/bin/env bash
# Runs PyTorch's own torch.distributed suite (DistributedTest._DistTestBase
# of torch/testing/_internal/distributed/distributed_test.py, which every
# torch wheel ships) against the "tensorcomm" backend, through
# python/tests_torch/upstream/run_distributed_test.py (see its docstring for
# how BACKEND=gloo plus a substituted init_process_group select tensorcomm).
# Not part of CI (it needs PyTorch).
#
#   bash scripts/py-torch-upstream.sh [OUT_DIR]
#
# Environment: PYTHON (default python3; needs torch and numpy), WHEEL (a
# tensorcomm wheel to unpack onto PYTHONPATH; default: the one next to this
# script, as in the .gpu-py bundle, else the installed package), TIMEOUT
# (seconds per test, default 120), UPSTREAM_BACKEND (tensorcomm, or gloo for
# a baseline of the same selection), SELECT (a -k regex for the first pass;
# default every test), SHARDS (runs side by side per pass, default 1; each
# test spawns its ranks, so on a machine with many cores 4 or 8 save time).
# Two passes: the selection on 2 ranks, then at 3 ranks the tests whose
# names say "group" (the suite skips its subgroup tests below 3 ranks;
# WS3=0 leaves this pass out). expecttest (imported by torch.testing) is unpacked from a wheel
# next to this script when python lacks it. Writes OUT_DIR/ws2.json,
# ws3.json and their logs (default: a new temporary folder); prints the
# summary lines; exits 1 if a test failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
py="${PYTHON:-python3}"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
runner="$here/run_distributed_test.py"
[ -f "$runner" ] || runner="$root/python/tests_torch/upstream/run_distributed_test.py"

site="$(mktemp -d)/site"
mkdir -p "$site"
wheel="${WHEEL:-$(ls "$here"/tensorcomm-*.whl 2>/dev/null | head -1)}"
unpack=()
[ -n "$wheel" ] && unpack+=("$wheel")
if ! "$py" -c 'import expecttest' 2>/dev/null; then
  ew="$(ls "$here"/wheels/expecttest-*.whl "$here"/expecttest-*.whl 2>/dev/null | head -1)"
  if [ -z "$ew" ]; then
    echo "py-torch-upstream: $py lacks expecttest (pip install expecttest, or put its wheel next to this script)" >&2
    exit 1
  fi
  unpack+=("$ew")
fi
if [ "${#unpack[@]}" -gt 0 ]; then
  "$py" - "$site" "${unpack[@]}" <<'PY'
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
PY
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" -c 'import sys, torch, tensorcomm; print("python", sys.version.split()[0], "torch", torch.__version__, "tensorcomm from", tensorcomm.__file__)' || exit 1

args=(--backend "${UPSTREAM_BACKEND:-tensorcomm}" --timeout "${TIMEOUT:-120}")
sel=()
[ -n "${SELECT:-}" ] && sel+=(-k "$SELECT")
cd "$out"
shards="${SHARDS:-1}"
status=0
pass() {  # NAME WORLD_SIZE RUNNER-ARGS...
  local name="$1" ws="$2" pids=() i
  shift 2
  for i in $(seq 1 "$shards"); do
    "$py" "$runner" "${args[@]}" --world-size "$ws" --shard "$i/$shards" "$@" \
      --json "$out/$name-$i.json" > "$out/$name-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || status=1; done
  for i in $(seq 1 "$shards"); do grep -E '^(upstream|FAILED test_)' "$out/$name-$i.log"; done
}
pass ws2 2 "${sel[@]}"
[ "${WS3:-1}" = 0 ] || pass ws3 3 -k group
"$py" - "$out" <<'PY'
import glob, json, os, sys
for name in ("ws2", "ws3"):
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(sys.argv[1], name + "-*.json")))]
    if not runs:
        if glob.glob(os.path.join(sys.argv[1], name + "-*.log")):
            print(f"{name}: no results (see its logs)")
        continue
    c = {k: sum(r["counts"][k] for r in runs) for k in ("pass", "fail", "skip")}
    print(f"total {name}: torch {runs[0]['torch']}, backend {runs[0]['backend']}, world size "
          f"{runs[0]['world_size']}: {c['pass']} pass, {c['fail']} fail, {c['skip']} skip")
PY
echo "py-torch-upstream: logs and JSON in $out"
exit "$status"
