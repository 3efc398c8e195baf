#!/usr/bin/env bash
# Builds the Python package's abi3 wheel (release) into a folder (default
# .gpu-py) with the PyTorch suite, the backend benchmark and
# py-gpu-check.sh, ready to carry to a machine with PyTorch (no network or
# Rust toolchain needed there):
#   bash scripts/py-gpu-bundle.sh .gpu-py
# then, on that machine:  bash .gpu-py/py-gpu-check.sh
# and, for PyTorch's own distributed suite:  bash .gpu-py/py-torch-upstream.sh OUT
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-.gpu-py}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
cd "$root"
venv="${TENSORCOMM_PY_VENV:-$root/.venv-py}"
if [ ! -x "$venv/bin/maturin" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt
fi
rm -f "$dest"/tensorcomm-*.whl
"$venv/bin/maturin" build --quiet --release --manifest-path python/Cargo.toml --out "$dest"
cp python/tests_torch/torch_suite.py python/tests_torch/cuda_suite.py python/tests_torch/suite_runner.py bench/python_backend.py bench/python_dispatch_pieces.py scripts/py-gpu-check.sh "$dest/"
# PyTorch's own distributed suite against the backend (py-torch-upstream.sh;
# torch.testing imports expecttest, which torch does not install).
cp python/tests_torch/upstream/run_distributed_test.py scripts/py-torch-upstream.sh "$dest/"
"$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$dest/wheels" expecttest \
  || echo "py-gpu-bundle: could not download expecttest; py-torch-upstream.sh needs it installed there" >&2
git rev-parse --short HEAD > "$dest/commit.txt" 2>/dev/null || true
ls -l "$dest"
du -sh "$dest"
