#!/usr/bin/env bash
# Runs the Python package against real PyTorch, on a machine where python3
# has PyTorch (CPU is enough); needs no network and no Rust toolchain.
#   bash .gpu-py/py-gpu-check.sh [BUNDLE]    (BUNDLE: the folder of this script)
# 1. unpacks the bundle's wheel into a private folder put on PYTHONPATH;
# 2. runs the torch suite (every op through torch.distributed, DDP against
#    Gloo, object collectives, barriers, errors) on 2 and 4 ranks;
# 3. runs the CUDA suite (every op on CUDA tensors, stream ordering; its
#    CUDA checks skip without a GPU) on 2 ranks;
# 4. runs the benchmark against Gloo under torchrun on 2, 4 and 8 ranks;
# 5. times the pieces of a small synchronous call at 1 rank
#    (python_dispatch_pieces.py, where the bundle has it).
# Prints PASS/FAIL per check and the benchmark tables; exits 1 if anything
# failed. TENSORCOMM_TORCH_TRACE=1 prints every call PyTorch makes.
set -uo pipefail
dir="$(cd "${1:-$(dirname "$0")}" && pwd)"
wheel="$(ls "$dir"/tensorcomm-*.whl 2>/dev/null | head -1)"
if [ -z "$wheel" ]; then
  echo "py-gpu-check: no tensorcomm wheel in $dir (build it with scripts/py-gpu-bundle.sh)" >&2
  exit 1
fi
site="$(mktemp -d)/site"
python3 - "$wheel" "$site" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
work="$(mktemp -d)"
cp "$dir/torch_suite.py" "$dir/cuda_suite.py" "$dir/suite_runner.py" "$dir/python_backend.py" "$work/"
# Bundles made before it was added lack the pieces benchmark.
cp "$dir/python_dispatch_pieces.py" "$work/" 2>/dev/null || true
cd "$work"
echo "== bundle $(cat "$dir/commit.txt" 2>/dev/null || echo '?'), $(basename "$wheel"), $(nproc) cpus"
python3 -c 'import sys, torch, tensorcomm, tensorcomm.torch; print("python", sys.version.split()[0], "torch", torch.__version__, "tensorcomm", tensorcomm.__version__, "from", tensorcomm.__file__)' || exit 1
status=0
for n in 2 4; do
  echo "== torch suite, $n ranks"
  timeout 600 python3 torch_suite.py --ranks "$n" || status=1
done
echo "== CUDA suite, 2 ranks"
timeout 600 python3 cuda_suite.py --ranks 2 || status=1
for n in 2 4 8; do
  echo "== benchmark against Gloo, $n ranks"
  timeout 600 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" python_backend.py || status=1
done
if [ -f python_dispatch_pieces.py ]; then
  echo "== where a small synchronous call's time goes, 1 rank"
  timeout 600 python3 -m torch.distributed.run --standalone --nproc-per-node 1 python_dispatch_pieces.py || status=1
fi
echo "== py-gpu-check: $([ "$status" = 0 ] && echo 'all passed' || echo 'FAILURES above')"
exit "$status"
