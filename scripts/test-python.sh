#!/usr/bin/env bash
# Builds the Python extension (python/, abi3) into a wheel, installs it into a
# virtual environment with python/requirements-dev.txt (maturin, numpy,
# pytest; no PyTorch), and runs python/tests and bench/test_*.py. The environment is .venv-py
# (or $TENSORCOMM_PY_VENV) and is reused when it is already there. Where
# python3 cannot make a virtual environment (Debian without python3-venv),
# the package for it is installed with apt-get when running as root.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
venv="${TENSORCOMM_PY_VENV:-$root/.venv-py}"

if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test-python: installing python3 and python3-venv with apt-get" >&2
    apt-get update -qq
    ver="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null || true)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv ${ver:+python$ver-venv} >/dev/null
  else
    echo "test-python: python3 with the venv and ensurepip modules is needed (apt-get install python3-venv)" >&2
    exit 1
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt

# The extension shares the workspace's target folder, so dependencies the
# Rust tests built (debug) are reused.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"$venv/bin/maturin" build --quiet --manifest-path python/Cargo.toml --out "$wheels" --interpreter "$venv/bin/python"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheels"/tensorcomm-*.whl

# From the root, so that `import tensorcomm` finds the installed wheel, not
# the python/tensorcomm sources (which lack the compiled module).
set +e
# Also the bench scripts' own tests (their headers, their parsing); they
# need neither PyTorch nor a GPU.
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests \
  bench/test_compare_gloo.py bench/test_bench_headers.py
status=$?
set -e
if [ "$status" = 5 ]; then
  echo "test-python: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
